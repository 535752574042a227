"""compile_kernel's inter-process lock: processes that need the same kernel compile it once (CPU only)."""

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tilelang

from cann_ops_tilelang import kernel_target
from cann_ops_tilelang.kernel_target import compile_kernel, compile_lock


class FakePrimFunc:
    """Stands for a prim_func: the lock keys on its TVMScript text."""

    def __init__(self, script: str):
        self._script = script

    def script(self) -> str:
        return self._script


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv('TILELANG_CACHE_DIR', str(tmp_path))
    monkeypatch.delenv('TILELANG_DISABLE_CACHE', raising=False)
    return tmp_path


def _is_held(lock_path: str) -> bool:
    # flock locks belong to an open file description, so a second open of the file conflicts even here.
    with open(lock_path, 'a') as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def test_lock_file_names_kernel_and_target(cache_dir):
    first = compile_lock(FakePrimFunc('kernel a'), 'cuda -arch=sm_90').lock_file
    assert Path(first).parent == cache_dir / 'cann_ops_tilelang_locks'
    assert compile_lock(FakePrimFunc('kernel a'), 'cuda -arch=sm_90').lock_file == first
    assert compile_lock(FakePrimFunc('kernel b'), 'cuda -arch=sm_90').lock_file != first
    assert compile_lock(FakePrimFunc('kernel a'), 'cuda -arch=sm_100').lock_file != first


def test_compile_runs_under_the_lock_and_releases_it(cache_dir, monkeypatch):
    func = FakePrimFunc('kernel a')
    target = kernel_target.tilelang_target('ascend')
    lock_path = compile_lock(func, target).lock_file
    held_during_compile = []

    def fake_compile(prim_func, *, target):
        held_during_compile.append(_is_held(lock_path))
        return ('compiled', prim_func)

    monkeypatch.setattr(tilelang, 'compile', fake_compile)
    assert compile_kernel(func, 'ascend') == ('compiled', func)
    assert held_during_compile == [True]
    assert not _is_held(lock_path)


def test_failed_compile_releases_the_lock(cache_dir, monkeypatch):
    func = FakePrimFunc('kernel a')
    lock_path = compile_lock(func, kernel_target.tilelang_target('ascend')).lock_file

    def failing_compile(prim_func, *, target):
        raise RuntimeError('lowering failed')

    monkeypatch.setattr(tilelang, 'compile', failing_compile)
    with pytest.raises(RuntimeError, match='lowering failed'):
        compile_kernel(func, 'ascend')
    assert not _is_held(lock_path)


def test_no_lock_when_tilelang_cache_is_disabled(cache_dir, monkeypatch):
    monkeypatch.setenv('TILELANG_DISABLE_CACHE', '1')
    lock = compile_lock(FakePrimFunc('kernel a'), 'cuda')
    with lock:
        pass
    assert not (cache_dir / 'cann_ops_tilelang_locks').exists()


# Each process "compiles" (sleeps, then writes the cache entry) only if the entry is not there yet, as
# TileLang's disk cache does once the lock is held. One interpreter imports tilelang and the package (the
# seconds of a start-up), then forks the three processes, as torch's DataLoader forks after importing torch:
# each opens the lock file itself, so each holds its own open file description and flock excludes them
# from one another exactly as it does separate programs.
WORKERS = """
import os, sys, time, traceback
from pathlib import Path
import tilelang
from cann_ops_tilelang.kernel_target import compile_kernel

entry, go, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])

def fake_compile(prim_func, *, target):
    if entry.exists():
        return 'loaded'
    time.sleep(1.0)
    entry.write_text('kernel')
    return 'compiled'

class Func:
    def script(self):
        return 'the same kernel'

tilelang.compile = fake_compile

def work(i):
    (out / f'ready{i}').touch()
    while not go.exists():  # start together
        time.sleep(0.01)
    (out / f'result{i}').write_text(compile_kernel(Func(), 'ascend'))

pids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        try:
            work(i)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    pids.append(pid)
print(*(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids))
"""


def test_processes_compiling_one_kernel_compile_it_once(cache_dir, tmp_path):
    packages = str(Path(kernel_target.__file__).parents[1])
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, (packages, os.environ.get('PYTHONPATH'))))}
    entry, go, out = tmp_path / 'entry', tmp_path / 'go', tmp_path / 'out'
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, '-c', WORKERS, str(entry), str(go), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not all((out / f'ready{i}').exists() for i in range(3)):  # bounded by one import
            if proc.poll() is not None:
                pytest.fail(f'workers exited early: {proc.stderr.read()}')
            time.sleep(0.05)
        go.touch()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and stdout.split() == ['0', '0', '0'], stdout + stderr  # noqa: PT018
    assert sorted((out / f'result{i}').read_text() for i in range(3)) == ['compiled', 'loaded', 'loaded']
