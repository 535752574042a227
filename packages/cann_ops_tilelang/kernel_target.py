"""TileLang targets per backend, and the one place operators compile a kernel."""

from __future__ import annotations

import torch

from cann_ops_tilelang.config import Backend, backend_of, get_cuda_arch


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


def compile_kernel(prim_func, device: torch.device):
    """Compile a TileLang prim_func for the backend of `device` (first call only; cache the result)."""
    import tilelang

    target = tilelang_target(backend_of(device), cuda_arch=None)
    with target:
        return tilelang.compile(prim_func, target=target)
