"""TileLang targets per backend, and the one place operators compile a kernel."""

from __future__ import annotations

from cann_ops_tilelang.config import Backend, get_cuda_arch


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

    Generators cache the result per compile-time configuration; runtime sizes are T.dynamic.
    """
    import tilelang

    target = tilelang_target(backend)
    with target:
        return tilelang.compile(prim_func, target=target)
