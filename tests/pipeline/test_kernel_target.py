"""compile_kernel's inter-process lock: processes that need the same kernel compile it once; its record of
each compile; the launch entry a Launcher calls and the fast path's explanation of a rejected launch (CPU
only)."""

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tilelang

from cann_ops_tilelang import config, kernel_target
from cann_ops_tilelang.kernel_target import compile_kernel, compile_lock


class FakePrimFunc:
    """Stands for a prim_func: the lock keys on its TVMScript text, a compile record names its global_symbol."""

    def __init__(self, script: str, attrs: dict | None = None):
        self._script = script
        self.attrs = attrs

    def script(self, show_meta: bool = False) -> str:
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


@contextlib.contextmanager
def _lock_held_by_another_process(seconds: float):
    time.sleep(seconds)  # until the other process has compiled the kernel and released the lock
    yield


def test_each_compile_is_recorded_with_its_lock_wait_and_compile_seconds(cache_dir, monkeypatch):
    def slow_compile(prim_func, *, target):
        time.sleep(0.2)
        return 'compiled'

    monkeypatch.setattr(tilelang, 'compile', slow_compile)
    monkeypatch.setattr(kernel_target, 'compile_lock', lambda prim_func, target: _lock_held_by_another_process(0.02))
    before = kernel_target.compile_records()
    assert compile_kernel(FakePrimFunc('kernel a', {'global_symbol': 'gate_bwd_kernel'}), 'ascend') == 'compiled'
    assert compile_kernel(FakePrimFunc('kernel b'), 'ascend') == 'compiled'
    records = kernel_target.compile_records()
    assert records[: len(before)] == before
    named, unnamed = records[len(before) :]
    assert (named.name, named.backend, named.emulated) == ('gate_bwd_kernel', 'ascend', False)
    assert unnamed.name == 'kernel', 'a prim_func without a global_symbol'
    for record in (named, unnamed):
        # The wait ends when the lock is held; the compile runs after it.
        assert 0.02 <= record.lock_wait_s < 0.2 <= record.compile_s
    records.clear()
    assert len(kernel_target.compile_records()) == len(before) + 2, 'a copy'


def test_a_failed_compile_is_not_recorded(cache_dir, monkeypatch):
    def failing_compile(prim_func, *, target):
        raise RuntimeError('lowering failed')

    monkeypatch.setattr(tilelang, 'compile', failing_compile)
    before = kernel_target.compile_records()
    with pytest.raises(RuntimeError, match='lowering failed'):
        compile_kernel(FakePrimFunc('kernel a'), 'ascend')
    assert kernel_target.compile_records() == before


def test_an_emulator_build_is_recorded_without_a_lock_wait(monkeypatch):
    def compile_prim_func(prim_func):
        time.sleep(0.05)
        return 'built for the emulator'

    # The registered emulator builds Ascend kernels under the opt-in on a machine without an NPU.
    monkeypatch.setattr(config.ascend_emulator, 'compile_prim_func', compile_prim_func)
    monkeypatch.setenv(config.ASCEND_EMULATOR_ENV, '1')
    monkeypatch.setattr(config, 'is_ascend_available', lambda: False)
    func = FakePrimFunc('kernel a', {'global_symbol': 'emu_kernel'})
    assert compile_kernel(func, 'ascend') == 'built for the emulator'
    record = kernel_target.compile_records()[-1]
    assert record[:4] == ('emu_kernel', 'ascend', True, 0.0)
    assert record.compile_s >= 0.05


def test_an_opt_in_with_no_emulator_registered_compiles_nothing(monkeypatch):
    monkeypatch.setattr(config.ascend_emulator, 'compile_prim_func', None)
    monkeypatch.setenv(config.ASCEND_EMULATOR_ENV, '1')
    monkeypatch.setattr(config, 'is_ascend_available', lambda: False)
    monkeypatch.setattr(tilelang, 'compile', lambda prim_func, *, target: pytest.fail('compiled for a device'))
    before = kernel_target.compile_records()
    with pytest.raises(RuntimeError, match='no Ascend emulator is registered in this process: import'):
        compile_kernel(FakePrimFunc('kernel a'), 'ascend')
    assert kernel_target.compile_records() == before


class _Artifact:
    """What tilelang.lower returns, as far as lower_to_source reads it."""

    def __init__(self, source: str, on_chip_bytes: int):
        self.kernel_source = source
        attrs = {'dyn_shared_memory_buf': on_chip_bytes}
        self.device_mod = type('DeviceMod', (), {'functions': {'main': type('Func', (), {'attrs': attrs})()}})()


@pytest.fixture
def lowerings(monkeypatch):
    """Replaces tilelang.lower; the list of the scripts it lowered."""
    lowered = []

    def fake_lower(prim_func, *, target):
        lowered.append(prim_func.script())
        return _Artifact(f'// source of {prim_func.script()}', 1024 * len(lowered))

    monkeypatch.setattr(tilelang, 'lower', fake_lower)
    return lowered


def test_a_kernel_is_lowered_once_then_read_from_the_disk_cache(cache_dir, lowerings):
    target = kernel_target.tilelang_target('ascend')
    first = kernel_target.lower_to_source(FakePrimFunc('kernel a'), target)
    assert first == ('// source of kernel a', 1024)
    assert kernel_target.lower_to_source(FakePrimFunc('kernel a'), target) == first
    assert lowerings == ['kernel a']
    assert len(list((cache_dir / 'cann_ops_tilelang_lowered').glob('*.json'))) == 1
    kernel_target.lower_to_source(FakePrimFunc('kernel b'), target)  # another kernel, another entry
    kernel_target.lower_to_source(FakePrimFunc('kernel a'), kernel_target.tilelang_target('cuda', cuda_arch='sm_90a'))
    assert lowerings == ['kernel a', 'kernel b', 'kernel a']


def test_an_unreadable_cache_entry_is_lowered_again(cache_dir, lowerings):
    target = kernel_target.tilelang_target('ascend')
    kernel_target.lower_to_source(FakePrimFunc('kernel a'), target)
    (entry,) = (cache_dir / 'cann_ops_tilelang_lowered').glob('*.json')
    entry.write_text('{"source": "trunc')
    assert kernel_target.lower_to_source(FakePrimFunc('kernel a'), target) == ('// source of kernel a', 2048)
    assert kernel_target.lower_to_source(FakePrimFunc('kernel a'), target) == ('// source of kernel a', 2048)
    assert lowerings == ['kernel a', 'kernel a']


def _reversal(*, disable_sync: bool):
    """A kernel whose threads read what other threads wrote to shared memory (TileLang syncs them), with
    or without its own pass config turning that off."""
    import tilelang.language as T

    @T.prim_func
    def reversal(a: T.Tensor((128,), 'float32'), b: T.Tensor((128,), 'float32')):
        with T.Kernel(1, threads=128):
            if disable_sync:
                T.annotate_pass_configs({'tl.disable_thread_storage_sync': True})
            staged = T.alloc_shared((128,), 'float32')
            tid = T.get_thread_binding()
            staged[tid] = a[tid]
            b[tid] = staged[127 - tid]

    return reversal


def test_a_kernels_own_pass_configs_apply_to_its_lowering(cache_dir):
    # As tilelang.compile applies them: the CPU tier checks the source the device compiles.
    target = kernel_target.tilelang_target('cuda', cuda_arch='sm_90a')
    assert '__syncthreads' in kernel_target.lower_to_source(_reversal(disable_sync=False), target)[0]
    assert '__syncthreads' not in kernel_target.lower_to_source(_reversal(disable_sync=True), target)[0]


def _copy_with_prelude(prelude: str):
    import tilelang.language as T

    @T.prim_func
    def copy(a: T.Tensor((128,), 'float32'), b: T.Tensor((128,), 'float32')):
        with T.Kernel(1, threads=128, prelude=prelude):
            tid = T.get_thread_binding()
            b[tid] = a[tid]

    return copy


def test_a_kernel_whose_prelude_changed_is_lowered_again(cache_dir):
    # The prelude is a string attribute, which plain TVMScript prints as a reference into its metadata.
    target = kernel_target.tilelang_target('cuda', cuda_arch='sm_90a')
    first = kernel_target.lower_to_source(_copy_with_prelude('// prelude one'), target)[0]
    second = kernel_target.lower_to_source(_copy_with_prelude('// prelude two'), target)[0]
    assert '// prelude one' in first
    assert '// prelude two' in second
    assert '// prelude one' not in second


def test_nothing_is_cached_when_tilelang_cache_is_disabled(cache_dir, lowerings, monkeypatch):
    monkeypatch.setenv('TILELANG_DISABLE_CACHE', '1')
    target = kernel_target.tilelang_target('ascend')
    kernel_target.lower_to_source(FakePrimFunc('kernel a'), target)
    kernel_target.lower_to_source(FakePrimFunc('kernel a'), target)
    assert lowerings == ['kernel a', 'kernel a']
    assert not (cache_dir / 'cann_ops_tilelang_lowered').exists()


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
    def script(self, show_meta=False):
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


class TVMFFIKernelAdapter:
    """Stands for TileLang's TVM-FFI adapter (matched by class name, as kernel_target._entry does)."""

    def __init__(self, result_idx=None):
        self.result_idx = result_idx

    def _get_executable(self):
        return self.executable

    def executable(self, *args):
        return args


class FakeKernel:
    def __init__(self, adapter):
        self.adapter = adapter

    def __call__(self, *args):
        return 'through JITKernel'


@pytest.mark.parametrize(
    ('device', 'adapter', 'checks'),
    [
        ('cuda', TVMFFIKernelAdapter(), True),  # the compiled TVM-FFI function: it checks its arguments
        ('cuda', TVMFFIKernelAdapter(result_idx=[2]), False),  # TileLang allocates an output: its own call
        ('cpu', TVMFFIKernelAdapter(), False),  # the emulator's kernels, called as they are
        ('cuda', object(), False),  # another execution backend
    ],
)
def test_only_the_tvm_ffi_entry_counts_as_checking_its_arguments(device, adapter, checks):
    import torch

    entry, checks_arguments = kernel_target._entry(FakeKernel(adapter), torch.device(device))
    assert checks_arguments is checks
    assert (entry(1) == (1,)) is checks


def test_a_launcher_knows_whether_its_entry_checks_once_loaded(monkeypatch):
    import torch

    monkeypatch.setattr(kernel_target, 'device_guard', lambda device: contextlib.nullcontext())
    launcher = kernel_target.Launcher(lambda cfg: FakeKernel(TVMFFIKernelAdapter()), 'cfg', torch.device('cuda', 0))
    assert launcher.checks_arguments is False, 'nothing is loaded before the first launch'
    launcher.kernel()
    assert launcher.checks_arguments is True
