"""Lower TileLang kernels on a CPU: the Ascend check of the CPU tier (and a CUDA compile check).

No NPU, CANN or GPU is needed: lowering stops after code generation. Results are cached per
(backend, key) within a process, and on disk across runs (kernel_target.lower_to_source).

On a host with an accelerator, level 0 skips the lowering tests: its device tests compile and run that
backend's kernels, and lowering both backends for every parameter set is the CPU tier's stand-in for a device,
which hosts without one run at every level (CI at level 1). Lowering was most of a cold verify-0 on the H200.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable

from cann_ops_ascend_emu.driver import ub_limit_of

from cann_ops_tilelang.kernel_target import lower_to_source, tilelang_target
from tests.testing.generator import skip_device_stand_in_at_level_0

CPU_TIER_CUDA_ARCH = 'sm_90a'  # what an H200 compiles for (config.cuda_arch_for); lowering needs no GPU
ASCEND_950_VECTOR_CORES = 64  # Ascend 950PR: the core count the CPU tier lowers Ascend kernels for
H200_SMS = 132  # the lent H200: the SM count the CPU tier lowers CUDA kernels for


@dataclasses.dataclass(frozen=True)
class LoweredKernel:
    backend: str
    source: str
    ub_bytes: int  # merged on-chip buffer of the device functions (UB on Ascend, shared memory on CUDA)

    @property
    def ub_limit(self) -> int:
        return ub_limit_of(self.source)


_cache: dict[tuple[str, Hashable], LoweredKernel] = {}


def lower_kernel(make_prim_func: Callable[[], object], *, backend: str, key: Hashable) -> LoweredKernel:
    """Lower the prim_func that `make_prim_func()` builds for `backend`; cached under `key`."""
    skip_device_stand_in_at_level_0('lowering')
    cache_key = (backend, key)
    if cache_key not in _cache:
        target = tilelang_target(backend, cuda_arch=CPU_TIER_CUDA_ARCH)
        prim_func = make_prim_func()
        assert_parameter_names_distinct(prim_func)
        source, merged = lower_to_source(prim_func, target)
        _cache[cache_key] = LoweredKernel(backend=backend, source=source, ub_bytes=merged)
    return _cache[cache_key]


def assert_parameter_names_distinct(prim_func) -> None:
    """Each tensor parameter keeps a name of its own: TileLang names a parameter's buffer after the last Python
    name bound to it in the kernel's body, and the compiled kernel's host-side argument checks go by that name,
    so two parameters bound in turn to one name (`lo = lo0` ... `lo = lo1`) fail every call on the device."""
    names = [prim_func.buffer_map[p].name for p in prim_func.params if p in prim_func.buffer_map]
    shared = sorted({n for n in names if names.count(n) > 1})
    assert not shared, f'tensor parameters share the buffer name(s) {shared}: bind no name to a parameter in the body'


def assert_ascend_kernel_lowers(
    make_prim_func: Callable[[], object], *, key: Hashable, kernel_name: str
) -> LoweredKernel:
    """Lower for Ascend 950 and check: non-empty source naming the kernel, UB within the limit."""
    lowered = lower_kernel(make_prim_func, backend='ascend', key=key)
    assert lowered.source.strip(), 'lowering produced no Ascend C source'
    assert kernel_name in lowered.source, f'{kernel_name!r} does not appear in the Ascend C source'
    # The compiler does not always report UB overflow (no pipelined loop, fixed buffer versions).
    assert lowered.ub_bytes <= lowered.ub_limit, (
        f'UB overflow: merged UB allocation {lowered.ub_bytes} B > limit {lowered.ub_limit} B'
    )
    return lowered


def assert_cuda_kernel_lowers(
    make_prim_func: Callable[[], object], *, key: Hashable, kernel_name: str
) -> LoweredKernel:
    """Lower for CUDA (sm_90a) on the CPU and check the source names the kernel."""
    lowered = lower_kernel(make_prim_func, backend='cuda', key=key)
    assert kernel_name in lowered.source, f'{kernel_name!r} does not appear in the CUDA source'
    return lowered
