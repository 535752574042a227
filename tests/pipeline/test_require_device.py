"""Sessions whose point is a device fail without one, unless OPS_TILELANG_ALLOW_NO_DEVICE=1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cann_ops_pipeline import phases, require_device


def no_tools(argv):
    return None


def check(env):
    lines = []
    code = require_device.check('refresh-mem', environ=env, tool=no_tools, out=lines.append)
    assert len(lines) == 1, lines
    return code, lines[0]


def test_no_device_fails_with_the_way_out():
    code, line = check({})
    assert code == 1
    assert line == (
        'refresh-mem: error: needs an accelerator (Ascend NPU or CUDA GPU) and found none '
        '(no npu-smi/nvidia-smi device); set OPS_TILELANG_ALLOW_NO_DEVICE=1 to run it anyway with its device '
        'tests skipped'
    )
    assert check({'OPS_TILELANG_DEVICE_COUNT': '0', 'OPS_TILELANG_ALLOW_NO_DEVICE': '0'})[0] == 1


def test_the_caller_may_allow_running_without_a_device():
    code, line = check({'OPS_TILELANG_ALLOW_NO_DEVICE': '1'})
    assert code == 0
    assert 'OPS_TILELANG_ALLOW_NO_DEVICE=1, so its device tests skip' in line


def test_a_device_passes():
    assert check({'OPS_TILELANG_DEVICE_COUNT': '2'}) == (0, 'refresh-mem: 2 device(s) (OPS_TILELANG_DEVICE_COUNT)')


@pytest.mark.parametrize('env', [{'OPS_TILELANG_ALLOW_NO_DEVICE': 'yes'}, {'OPS_TILELANG_DEVICE_COUNT': 'x'}])
def test_bad_variables_are_usage_errors(env):
    code, line = check(env)
    assert code == 4
    assert line.startswith('refresh-mem: error: ')


def test_the_step_runs_from_the_source_tree(monkeypatch):
    monkeypatch.setenv('OPS_TILELANG_DEVICE_COUNT', '0')
    monkeypatch.delenv('OPS_TILELANG_ALLOW_NO_DEVICE', raising=False)
    step = phases.require_device('run-tests')
    env = {**os.environ, **step.env}
    done = subprocess.run(step.resolved_argv(sys.executable), env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert done.stdout.startswith('run-tests: error: needs an accelerator')
