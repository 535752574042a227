"""TileLang targets per backend, and the one place operators compile and launch a kernel."""

from __future__ import annotations

import contextlib
import hashlib
import os

from cann_ops_tilelang.config import (
    Backend,
    ascend_emulator_enabled,
    device_guard,
    get_cuda_arch,
    is_ascend_available,
    should_print_kernel_source,
)


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


def compile_kernel(prim_func, backend: Backend):
    """Compile a TileLang prim_func for `backend` on the current device (call inside `device_guard`).

    Generators cache the result per compile-time configuration; runtime sizes are T.dynamic. Ascend
    kernels on a machine without an NPU but with the emulator opt-in (config.ASCEND_EMULATOR_ENV) are
    lowered to Ascend C and built for the CPU emulator instead; `config.require_emulator` has made sure
    that no real NPU shares this process, so the per-configuration cache holds one kind only.
    """
    if backend == 'ascend' and ascend_emulator_enabled() and not is_ascend_available():
        import cann_ops_ascend_emu

        return cann_ops_ascend_emu.compile_prim_func(prim_func)

    import tilelang

    target = tilelang_target(backend)
    with target, compile_lock(prim_func, target):
        return tilelang.compile(prim_func, target=target)


def launch_kernel(get_kernel, cfg, device, *args) -> None:
    """The last steps of every operator: `get_kernel(cfg)` (compiled for `device` on first use), its source
    printed when OPS_TILELANG_PRINT_KERNEL_SOURCE asks, then the launch with `args` on `device`'s stream."""
    with device_guard(device):
        kernel = get_kernel(cfg)
        if should_print_kernel_source():
            print(kernel.get_kernel_source())
        kernel(*args)


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
    key = hashlib.sha256(f'{target}\n{prim_func.script()}'.encode()).hexdigest()
    lock_dir = os.path.join(env.TILELANG_CACHE_DIR, 'cann_ops_tilelang_locks')
    os.makedirs(lock_dir, exist_ok=True)
    return filelock.FileLock(os.path.join(lock_dir, f'{key}.lock'))
