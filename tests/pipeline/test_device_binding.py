"""Device binding of xdist workers and the device count, with a fake device count on a CPU."""

from __future__ import annotations

import json
import types

import pytest

from cann_ops_pipeline import device_count
from cann_ops_pipeline.device_count import DeviceInventory, count_devices
from tests.testing.plugins import device_binding
from tests.testing.plugins.device_binding import Binding, plan_binding

pytest_plugins = ['pytester']


@pytest.mark.parametrize(
    ('workers', 'devices', 'expected'),
    [
        (3, 2, [(0, 2), (1, 1), (0, 2)]),  # (device, workers on it) for gw0, gw1, gw2
        (8, 2, [(0, 4), (1, 4)] * 4),
        (2, 4, [(0, 1), (1, 1)]),
        (1, 1, [(0, 1)]),
    ],
)
def test_workers_go_round_robin_over_the_devices(workers, devices, expected):
    plans = [plan_binding(worker, workers, devices) for worker in range(workers)]
    assert [(plan.device, plan.workers_on_device) for plan in plans] == expected
    assert plans[0].memory_fraction == 1 / expected[0][1]


def test_no_binding_without_devices():
    assert plan_binding(0, 4, 0) is None


def test_worker_numbers():
    assert device_binding.worker_number('gw12') == 12
    with pytest.raises(pytest.UsageError, match="cannot bind xdist worker 'master' to a device"):
        device_binding.worker_number('master')


def test_a_preset_visible_device_list_is_respected():
    environ = {'CUDA_VISIBLE_DEVICES': '4, 6'}
    values = device_binding.bind_environment(Binding(worker=3, device=1, workers_on_device=2), environ)
    assert values == {'ASCEND_RT_VISIBLE_DEVICES': '1', 'CUDA_VISIBLE_DEVICES': '6'}
    assert environ == values
    with pytest.raises(pytest.UsageError, match=r"CUDA_VISIBLE_DEVICES='4' lists 1 device\(s\)"):
        device_binding.visible_value('CUDA_VISIBLE_DEVICES', 1, {'CUDA_VISIBLE_DEVICES': '4'})


def test_a_worker_takes_the_controllers_count_and_never_probes():
    env = {'OPS_TILELANG_DEVICE_COUNT': '5'}
    assert device_binding.worker_device_count({'ops_tilelang_device_count': 2}, env) == 2
    assert device_binding.worker_device_count({}, env) == 5
    assert device_binding.worker_device_count({}, {}) == 0
    with pytest.raises(ValueError, match="OPS_TILELANG_DEVICE_COUNT='two' is not a device count"):
        device_binding.worker_device_count({}, {'OPS_TILELANG_DEVICE_COUNT': 'two'})


def test_workers_sharing_the_device():
    def config(binding, workerinput=None):
        fake = types.SimpleNamespace(stash=pytest.Stash())
        if binding != 'unset':
            fake.stash[device_binding.binding_key] = binding
        if workerinput is not None:
            fake.workerinput = workerinput
        return fake

    assert device_binding.workers_sharing_device(config('unset')) == 1
    assert device_binding.workers_sharing_device(config(Binding(1, 1, 3), {'workercount': 6})) == 3
    assert device_binding.workers_sharing_device(config(None, {'workercount': 6})) == 6, 'unbound: all share'


def test_the_default_cap_sets_torchs_memory_fraction(monkeypatch):
    import torch

    from cann_ops_tilelang import config as runtime

    calls = []
    monkeypatch.setattr(runtime, 'is_ascend_available', lambda: False)
    monkeypatch.setattr(runtime, 'is_cuda_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'set_per_process_memory_fraction', lambda f, device=None: calls.append(f))
    assert device_binding.pytest_cap_device_memory(config=None, fraction=0.25) is True
    assert calls == [0.25]
    monkeypatch.setattr(runtime, 'is_cuda_available', lambda: False)
    assert device_binding.pytest_cap_device_memory(config=None, fraction=0.25) is None


NVIDIA_SMI = """GPU 0: NVIDIA H200 (UUID: GPU-aaaa)
GPU 1: NVIDIA H200 (UUID: GPU-bbbb)
  MIG 1g.18gb     Device  0: (UUID: MIG-cccc)
"""
NPU_SMI = """
        Total Count                    : 8

        NPU ID                         : 0
        Chip Count                     : 1
"""


def fake_tools(outputs):
    return lambda argv: outputs.get(argv[0])


def test_device_count_sources():
    assert count_devices({'OPS_TILELANG_DEVICE_COUNT': '3'}, fake_tools({'nvidia-smi': NVIDIA_SMI})) == DeviceInventory(
        3, None, 'OPS_TILELANG_DEVICE_COUNT'
    ), 'the override wins'
    assert count_devices({}, fake_tools({'nvidia-smi': NVIDIA_SMI})) == DeviceInventory(2, 'cuda', 'nvidia-smi')
    assert count_devices({}, fake_tools({'npu-smi': NPU_SMI})) == DeviceInventory(8, 'ascend', 'npu-smi')
    assert count_devices({'CUDA_VISIBLE_DEVICES': '1'}, fake_tools({'nvidia-smi': NVIDIA_SMI})).count == 1
    assert count_devices({'CUDA_VISIBLE_DEVICES': ''}, fake_tools({'nvidia-smi': NVIDIA_SMI})).count == 0
    assert count_devices({'ASCEND_RT_VISIBLE_DEVICES': '0,1,2'}, fake_tools({'npu-smi': NPU_SMI})).count == 3
    assert count_devices({}, fake_tools({})) == DeviceInventory(0, None, 'no npu-smi/nvidia-smi device')
    with pytest.raises(ValueError, match="OPS_TILELANG_DEVICE_COUNT='-1' is not a device count"):
        count_devices({'OPS_TILELANG_DEVICE_COUNT': '-1'}, fake_tools({}))


def test_a_missing_tool_counts_nothing(monkeypatch):
    monkeypatch.setattr(device_count.shutil, 'which', lambda name: None)
    assert device_count.run_tool(['nvidia-smi', '-L']) is None


BINDING_CONFTEST = """
import json
import os

pytest_plugins = ['tests.testing.plugins.device_binding']
SEEN = ('CUDA_VISIBLE_DEVICES', 'ASCEND_RT_VISIBLE_DEVICES')


def note(config, event, **extra):
    worker = config.workerinput['workerid']
    line = {'event': event, **{var: os.environ.get(var) for var in SEEN}, **extra}
    with open(config.rootpath / f'{worker}.jsonl', 'a') as f:
        f.write(json.dumps(line) + '\\n')


def pytest_configure(config):
    config.addinivalue_line('markers', 'npu: needs the (fake) device')
    if hasattr(config, 'workerinput'):
        note(config, 'configure')  # what any later plugin or conftest code sees


def pytest_cap_device_memory(config, fraction):
    note(config, 'cap', fraction=fraction)
    return True
"""

BINDING_TESTS = """
import pytest


def test_1_cpu(pytestconfig):
    from conftest import note
    note(pytestconfig, 'cpu test')


@pytest.mark.npu
def test_2_device(pytestconfig):
    from conftest import note
    note(pytestconfig, 'device test')


@pytest.mark.npu
def test_3_device(pytestconfig):
    from conftest import note
    note(pytestconfig, 'device test')
"""


def test_xdist_workers_are_bound_before_configure_and_capped_at_their_first_device_test(pytester, monkeypatch):
    monkeypatch.setenv('PYTEST_DISABLE_PLUGIN_AUTOLOAD', '1')
    monkeypatch.setenv('OPS_TILELANG_DEVICE_COUNT', '2')
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '5,7')
    monkeypatch.delenv('ASCEND_RT_VISIBLE_DEVICES', raising=False)
    pytester.makeconftest(BINDING_CONFTEST)
    pytester.makepyfile(test_bound=BINDING_TESTS)
    result = pytester.runpytest_subprocess('-p', 'xdist', '-n', '3', '--dist', 'each')
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines(
        ['device binding: 3 xdist workers over 2 device(s) (OPS_TILELANG_DEVICE_COUNT), up to 2 per device']
    )

    def events(worker):
        lines = (pytester.path / f'{worker}.jsonl').read_text().splitlines()
        return [json.loads(line) for line in lines]

    shared = {'CUDA_VISIBLE_DEVICES': '5', 'ASCEND_RT_VISIBLE_DEVICES': '0'}
    capped = [
        {'event': 'configure', **shared},
        {'event': 'cpu test', **shared},
        {'event': 'cap', 'fraction': 0.5, **shared},
        {'event': 'device test', **shared},
        {'event': 'device test', **shared},
    ]
    assert events('gw0') == capped, 'gw0 shares device 0 with gw2: capped to half, once, at its first device test'
    assert events('gw2') == capped
    alone = {'CUDA_VISIBLE_DEVICES': '7', 'ASCEND_RT_VISIBLE_DEVICES': '1'}
    assert events('gw1') == [
        {'event': 'configure', **alone},
        {'event': 'cpu test', **alone},
        {'event': 'device test', **alone},
        {'event': 'device test', **alone},
    ], 'gw1 has device 1 alone: no cap'
