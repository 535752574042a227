"""TileLang targets per backend, and the one place operators compile and launch a kernel."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from cann_ops_tilelang.config import Backend, ascend_emulator, device_guard, get_cuda_arch, kernel_source_requested

# What one SM of the CUDA target (sm_90) holds: the choosers size thread blocks and register caps by it.
CUDA_MAX_THREADS_PER_SM = 2048
CUDA_REGS_PER_SM = 65536


def tilelang_target(backend: Backend, *, cuda_arch: str | None = None):
    """The TileLang/TVM target object for a backend.

    Ascend: the 950 (dav-3510) target. CUDA: the arch of the current GPU unless `cuda_arch`
    (e.g. 'sm_90') names one, which lets a CPU-only machine lower CUDA kernels.
    """
    from tilelang import tvm

    if backend == 'ascend':
        from tilelang.ascend.target import normalize_ascend_target

        return normalize_ascend_target('ascend')
    if backend == 'cuda':
        return tvm.target.Target({'kind': 'cuda', 'arch': cuda_arch or get_cuda_arch()})
    raise ValueError(f'unknown backend {backend!r}: expected "ascend" or "cuda"')


# Part of every lowered-source cache key: bump it when lower_to_source's own lowering or key changes (2: the
# prim_func's pass configs apply; 3: the key's TVMScript shows its metadata), so that no entry lowered the old
# way is served.
_LOWERED_FORMAT = '3'


def _identity_script(prim_func) -> str:
    """The prim_func's TVMScript as this module's cache and lock keys use it: with its metadata, as TileLang's own
    kernel cache keys, since without it a string attribute (a T.Kernel prelude) prints as a reference into the
    metadata and two kernels differing only there would share a key."""
    return prim_func.script(show_meta=True)


def lower_to_source(prim_func, target) -> tuple[str, int]:
    """(kernel source, merged on-chip buffer bytes of the device functions) of `prim_func` lowered for
    `target`: code generation only, no compiler and no device (the CPU tier's checks, the emulator's input).

    Cached on disk beside TileLang's kernel cache (TILELANG_CACHE_DIR, and off where TileLang's cache is off),
    keyed by what decides the result: the TileLang version, the target and the prim_func's TVMScript (with its
    metadata). Some kernels take seconds to lower, so a warm run lowers nothing. An unreadable entry is lowered
    again.
    """
    import tilelang
    from tilelang import env, tvm

    script = _identity_script(prim_func)
    key = hashlib.sha256('\0'.join((_LOWERED_FORMAT, tilelang.__version__, str(target), script)).encode()).hexdigest()
    directory = os.path.join(env.TILELANG_CACHE_DIR, 'cann_ops_tilelang_lowered')
    path = os.path.join(directory, f'{key[:32]}.json')
    if env.is_cache_enabled():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            with open(path, encoding='utf-8') as f:
                entry = json.load(f)
            return str(entry['source']), int(entry['on_chip_bytes'])
    # The prim_func's own pass configs (T.annotate_pass_configs, `tilelang_pass_configs`), as tilelang.compile
    # applies them: without them the source would not be the one the device compiles.
    attrs = prim_func.attrs
    config = dict(attrs['tilelang_pass_configs']) if attrs is not None and 'tilelang_pass_configs' in attrs else {}
    with tvm.transform.PassContext(config=config), target:
        artifact = tilelang.lower(prim_func, target=target)
    on_chip = 0
    for _, func in artifact.device_mod.functions.items():
        if func.attrs is not None and 'dyn_shared_memory_buf' in func.attrs:
            on_chip = max(on_chip, int(func.attrs['dyn_shared_memory_buf']))
    source = artifact.kernel_source
    if env.is_cache_enabled():
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix='.tmp')
        with os.fdopen(fd, 'w', encoding='utf-8') as f:
            json.dump({'source': source, 'on_chip_bytes': on_chip}, f)
        os.replace(tmp, path)  # atomic: processes lowering the same kernel write the same content
    return source, on_chip


class CompileRecord(NamedTuple):
    """One kernel that `compile_kernel` compiled or loaded from TileLang's disk cache."""

    name: str
    """The prim_func's `global_symbol`, or 'kernel' where it has none."""
    backend: Backend
    """The backend it was compiled for."""
    emulated: bool
    """Whether the registered Ascend emulator built it (`config.ascend_emulator`) instead of `backend`'s device."""
    lock_wait_s: float
    """Seconds spent waiting for `compile_lock`: another process was compiling the same kernel."""
    compile_s: float
    """Seconds inside the compile: TileLang's own compile, or its load from its disk cache on a hit."""


# Appended to by compile_kernel only, which the generators call once per kernel configuration (they cache
# what it returns): this grows with the set of kernels a process uses, not with its launches.
_compile_records: list[CompileRecord] = []


def compile_records() -> list[CompileRecord]:
    """Every compile (or load from TileLang's disk cache) of this process so far, oldest first, as a copy."""
    return list(_compile_records)


def _kernel_name(prim_func) -> str:
    attrs = getattr(prim_func, 'attrs', None)
    if attrs is not None and 'global_symbol' in attrs:
        return str(attrs['global_symbol'])
    return 'kernel'


def compile_kernel(prim_func, backend: Backend):
    """Compile a TileLang prim_func for `backend` on the current device (call inside `device_guard`).

    Generators cache the result per compile-time configuration; runtime sizes are T.dynamic. Ascend
    kernels on a machine without an NPU but with the emulator opt-in (config.ASCEND_EMULATOR_ENV) are
    built by the registered emulator instead (`config.ascend_emulator`, which refuses the opt-in where a
    real NPU is, so the per-configuration cache holds one kind only). Each compile is recorded
    (`compile_records`).
    """
    if backend == 'ascend' and ascend_emulator.active():
        started = time.perf_counter()
        kernel = ascend_emulator.compile(prim_func)
        _compile_records.append(
            CompileRecord(_kernel_name(prim_func), backend, True, 0.0, time.perf_counter() - started)
        )
        return kernel

    import tilelang

    target = tilelang_target(backend)
    with target:
        lock = compile_lock(prim_func, target)
        requested = time.perf_counter()
        with lock:
            acquired = time.perf_counter()
            kernel = tilelang.compile(prim_func, target=target)
            compiled = time.perf_counter()
    _compile_records.append(
        CompileRecord(_kernel_name(prim_func), backend, False, acquired - requested, compiled - acquired)
    )
    return kernel


def launch_kernel(get_kernel, cfg, device, *args) -> None:
    """The last steps of every operator: `get_kernel(cfg)` (compiled for `device` on first use), its source
    printed when OPS_TILELANG_PRINT_KERNEL_SOURCE asks, then the launch with `args` on `device`'s stream.

    Operators keep a `Launcher` per configuration instead (`Launcher.launch` is this function without the
    per-call kernel lookup); this form is for one-off launches."""
    Launcher(get_kernel, cfg, device).launch(*args)


class Launcher:
    """The launch of one compiled kernel configuration on one device, kept by an operator per configuration
    so that a call pays no kernel lookup, config hashing or device query.

    The kernel is compiled (or loaded from TileLang's cache) on the first `launch`, not when the launcher is
    made: choosing a configuration (the `*_config` functions, empty inputs) never compiles. What a launch
    calls is the cheapest entry of the compiled kernel that does the same thing (`_entry`).

    `checks_arguments` (known once the kernel is loaded) says whether that entry validates every tensor
    argument itself before it launches: rank, dtype, every extent that the kernel's signature fixes or
    shares between arguments, strides, byte offset, device type and that all tensors are on one device.
    Operators then leave those checks to it on their fast path (see `operator.Operator.launch`)."""

    __slots__ = ('_cuda_index', '_entry', '_get_kernel', '_kernel', 'cfg', 'checks_arguments', 'device')

    def __init__(self, get_kernel, cfg, device) -> None:
        self.cfg = cfg
        self.device = device
        self._get_kernel = get_kernel
        self._kernel = None
        self._entry = None
        self.checks_arguments = False
        # CUDA: switching devices is needed only when the tensors' device is not the current one, which
        # one C call tells (torch.cuda.device's context manager costs microseconds per call on a busy host).
        self._cuda_index = device.index if device.type == 'cuda' else None

    def kernel(self):
        """The compiled kernel (compiled for this device on first use)."""
        if self._kernel is None:
            with device_guard(self.device):
                self._kernel = self._get_kernel(self.cfg)
                self._entry, self.checks_arguments = _entry(self._kernel, self.device)
        return self._kernel

    def launch(self, *args) -> None:
        entry = self._entry
        if entry is None:
            self.kernel()
            entry = self._entry
        # The environment is read on every call (a test or a user may set it at any time); an unset
        # variable costs one dict lookup.
        if kernel_source_requested():
            print(self._kernel.get_kernel_source())
        index = self._cuda_index
        if index is not None and index == _cuda_current_device():
            entry(*args)
            return
        with device_guard(self.device):
            entry(*args)


_PLACEHOLDERS: dict[tuple[torch.device, torch.dtype, int, str], torch.Tensor] = {}


def placeholder(device: torch.device, dtype: torch.dtype, ndim: int = 1, role: str = '') -> torch.Tensor:
    """A one-element tensor a kernel takes in place of an absent optional tensor (its signature keeps the
    argument; the kernel never reads it), one per device, dtype, rank and `role` (distinct roles: distinct
    tensors, where two absent arguments of a launch must not alias)."""
    key = (device, dtype, ndim, role)
    tensor = _PLACEHOLDERS.get(key)
    if tensor is None:
        tensor = _PLACEHOLDERS[key] = torch.zeros((1,) * ndim, dtype=dtype, device=device)
    return tensor


def _no_cuda_device() -> int:
    raise RuntimeError('this torch build has no CUDA')


# The C function itself where torch has CUDA (a Python wrapper would be one more frame per launch).
_cuda_current_device = getattr(torch._C, '_cuda_getDevice', _no_cuda_device)


def _entry(kernel, device) -> tuple[Callable, bool]:
    """What a launch of `kernel` calls: for a TileLang kernel on the TVM-FFI execution backend whose outputs
    are all caller-allocated (every kernel here), the compiled TVM-FFI function itself. TileLang's
    JITKernel.__call__ -> adapter func does, per call, exactly that call after Python steps that only matter
    for kernels with TileLang-allocated outputs (argument count, output device, the argument list) or for
    NPU streams (which TileLang's Ascend adapters handle; they keep their own call). The generated host code
    behind that function checks every argument (dtype, shape, strides, device) and reads the current stream
    either way, hence the True (Launcher.checks_arguments). Other kernels (NPU ones, the emulator's, other
    execution backends) are called as they are, with False."""
    adapter = getattr(kernel, 'adapter', None)
    if (
        device.type == 'cuda'
        and type(adapter).__name__ == 'TVMFFIKernelAdapter'
        and not adapter.result_idx
        and not getattr(adapter, '_ffi_callee_allocated_output_abi', False)
    ):
        executable = adapter._get_executable()
        if callable(executable):
            return executable, True
    return getattr(kernel, 'torch_function', None) or kernel, False


def compile_lock(prim_func, target):
    """An inter-process lock per kernel: processes that need the same kernel compile it once.

    TileLang's disk cache (TILELANG_CACHE_DIR) is shared by processes but not locked, so test workers or
    training ranks that meet an uncompiled kernel together would each compile it. Under this lock the first
    compiles and fills the cache; the others wait and then load it from there. The OS drops the lock if its
    holder dies. No lock when TileLang's cache is disabled (nothing would be shared).
    """
    import filelock
    from tilelang import env

    if not env.is_cache_enabled():
        return contextlib.nullcontext()
    key = hashlib.sha256(f'{target}\n{_identity_script(prim_func)}'.encode()).hexdigest()
    lock_dir = os.path.join(env.TILELANG_CACHE_DIR, 'cann_ops_tilelang_locks')
    os.makedirs(lock_dir, exist_ok=True)
    return filelock.FileLock(os.path.join(lock_dir, f'{key}.lock'))
