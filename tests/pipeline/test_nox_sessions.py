"""The noxfile: device sessions check before installing, one shared environment for the project, quiet Ctrl-C."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nox.registry
import pytest

from cann_ops_pipeline.phases import ROOT

NOX = [sys.executable, '-m', 'nox', '-f', str(ROOT / 'noxfile.py')]


@pytest.fixture(scope='module')
def noxfile():
    """The noxfile as a module, its sessions registered in a registry of their own (nox's stays as it was)."""
    saved = dict(nox.registry._REGISTRY)
    nox.registry._REGISTRY.clear()
    try:
        spec = importlib.util.spec_from_file_location('noxfile_under_test', ROOT / 'noxfile.py')
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        nox.registry._REGISTRY.clear()
        nox.registry._REGISTRY.update(saved)
    return module


def test_a_device_session_without_a_device_stops_before_installing(tmp_path):
    env = {**os.environ, 'OPS_TILELANG_DEVICE_COUNT': '0'}
    env.pop('OPS_TILELANG_ALLOW_NO_DEVICE', None)
    done = subprocess.run(
        [*NOX, '--envdir', str(tmp_path / 'envs'), '-s', 'run-tests'], env=env, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert 'run-tests: error: needs an accelerator' in done.stdout + done.stderr
    assert 'installing' not in done.stderr
    assert not (tmp_path / 'envs' / 'project').exists()


class FakeSession:
    """What project_env uses of a nox session; installs are recorded, the virtualenv is a file or two."""

    venv_backend = 'virtualenv'

    def __init__(self, envs: Path, no_install: bool = False):
        self.env_dir = envs / 'tests-cpu'
        self.env_dir.mkdir(parents=True, exist_ok=True)
        (self.env_dir / 'pyvenv.cfg').write_text('home = /usr/bin\nversion_info = 3.11.7.final.0\n')
        self.bin = str(self.env_dir / 'bin')
        self.no_install = no_install
        self.installs: list[tuple[str, ...]] = []

    def log(self, *args):
        pass

    def error(self, message):
        raise RuntimeError(message)

    def run_install(self, *args, **kwargs):
        if self.no_install:
            return None
        self.installs.append(tuple(str(arg) for arg in args))
        if 'virtualenv' in args:
            python = Path(args[-1]) / 'bin' / 'python'
            python.parent.mkdir(parents=True, exist_ok=True)
            python.touch()
        return True


def _what(installs):
    return ['virtualenv' if 'virtualenv' in argv else argv[-1] for argv in installs]


def test_the_project_environment_is_made_once_and_shared(noxfile, tmp_path, monkeypatch):
    first = FakeSession(tmp_path)
    env_dir = noxfile.project_env(first)
    assert env_dir == tmp_path / 'project'
    assert _what(first.installs) == ['virtualenv', noxfile.TORCH, '.[dev]']
    record = json.loads((env_dir / noxfile.INSTALLED).read_text())
    assert record['torch'] == noxfile.TORCH
    assert record['python'] == '3.11.7.final.0'

    again = FakeSession(tmp_path)  # another session, or the next run
    assert noxfile.project_env(again) == env_dir
    assert again.installs == []

    monkeypatch.setattr(noxfile, 'TORCH', 'torch==9.9.9')  # another pin: installed over, not rebuilt
    changed = FakeSession(tmp_path)
    noxfile.project_env(changed)
    assert _what(changed.installs) == ['torch==9.9.9', '.[dev]']


def test_another_python_rebuilds_the_environment(noxfile, tmp_path):
    noxfile.project_env(FakeSession(tmp_path))
    newer = FakeSession(tmp_path)
    (newer.env_dir / 'pyvenv.cfg').write_text('version_info = 3.12.1.final.0\n')
    noxfile.project_env(newer)
    assert _what(newer.installs) == ['virtualenv', noxfile.TORCH, '.[dev]']


def test_no_install_uses_what_is_there_and_says_when_nothing_is(noxfile, tmp_path):
    with pytest.raises(RuntimeError, match='does not exist yet: run the session once without --no-install'):
        noxfile.project_env(FakeSession(tmp_path, no_install=True))
    noxfile.project_env(FakeSession(tmp_path))
    assert noxfile.project_env(FakeSession(tmp_path, no_install=True)) == tmp_path / 'project'


def test_no_venv_installs_nothing(noxfile, tmp_path):
    session = FakeSession(tmp_path)
    session.venv_backend = 'none'
    assert noxfile.project_env(session) is None
    assert session.installs == []


SLEEPING_TEST = """
import pathlib, time

def test_sleeps(tmp_path_factory):
    pathlib.Path({started!r}).touch()
    time.sleep(120)
"""


@pytest.mark.skipif(not hasattr(os, 'killpg'), reason='needs POSIX process groups')
def test_ctrl_c_under_nox_ends_quietly(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) during an xdist run under nox:
    pytest's interrupted summary, nox's exit code 130, and no plugin noise from orphaned workers."""
    started = tmp_path / 'started'
    (tmp_path / 'test_sleeps.py').write_text(SLEEPING_TEST.format(started=str(started)))
    argv = [
        *NOX,
        '--no-venv',
        '--no-install',
        '-s',
        'tests-cpu',
        '--',
        str(tmp_path),
        '-n',
        '2',
        '-p',
        'no:cacheprovider',
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert proc.poll() is None, 'nox ended before the test started'
            assert time.monotonic() < deadline, 'the test never started'
            time.sleep(0.2)
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=90)  # until every process that holds the pipe (workers too) is gone
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, output
    assert 'KeyboardInterrupt' in output
    assert 'PluggyTeardownRaisedWarning' not in output
    assert 'cannot send' not in output
