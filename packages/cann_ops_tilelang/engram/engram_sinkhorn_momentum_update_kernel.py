"""Kernels of engram_sinkhorn_momentum_update (shared/docs/engram.md, "Sinkhorn normalisation").

Per element, in fp32 (b = beta1 and a = 1 - beta1 as fp32 runtime scalars, a computed on the host in
double precision and rounded once):
    s  = a * g                           (one rounding)
    m' = fma(m, b, s)                    (one rounding; stored in the buffer's dtype, bf16 rounds to nearest even)
    sinkhorn_input = fma(m', b, s)       (nesterov; m' unrounded fp32) or m'
Both backends evaluate exactly these operations, so their results are bit-identical to each other; torch
rounds b * m separately, so an fp32 torch reference can differ by about one ulp (see the tests).

One pass over memory: grad and the buffer are read once, the buffer and sinkhorn_input written once.
The element count is a runtime size (T.dynamic) and any count works: tails are handled in the kernels.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

_LANES = 64  # fp32 lanes of one 256-byte Ascend vector register
_DTYPES = ('bfloat16', 'float32')
_CUDA_ELEMS = 8  # elements per thread and unroll step: one 16-byte bf16 access, two 16-byte fp32 accesses


@dataclasses.dataclass(frozen=True)
class EngramSinkhornMomentumUpdateConfig:
    backend: Backend
    grad_dtype: str  # 'bfloat16' or 'float32'
    momentum_dtype: str  # 'bfloat16' or 'float32'
    nesterov: bool
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the tile count)
    block: int  # elements of one task (Ascend UB tile) / of one thread block (CUDA)
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.grad_dtype not in _DTYPES or self.momentum_dtype not in _DTYPES:
            raise ValueError(f'dtypes must be among {_DTYPES}, got {self.grad_dtype!r}, {self.momentum_dtype!r}')
        if self.backend == 'ascend' and self.block % _LANES != 0:
            raise ValueError(f'block {self.block} must be a multiple of {_LANES}')
        if self.backend == 'cuda' and self.block % (self.threads * _CUDA_ELEMS) != 0:
            raise ValueError(f'block {self.block} must be a multiple of threads * {_CUDA_ELEMS}')


def choose_engram_sinkhorn_momentum_update_config(
    *, backend: Backend, grad_dtype: str, momentum_dtype: str, nesterov: bool, num_cores: int
) -> EngramSinkhornMomentumUpdateConfig:
    """Pure choice of the compile-time parameters (no device query). The element count is a runtime size."""
    if backend == 'ascend':
        # 8192 elements per task: at most 3 x 32 KB of UB per buffer version (fp32 in and out), two versions
        # so the DMA of the next tile overlaps the vector work of this one.
        return EngramSinkhornMomentumUpdateConfig(
            backend, grad_dtype, momentum_dtype, nesterov, num_cores, block=8192, threads=0, num_stages=2
        )
    # CUDA: 256 threads x 2 steps x 8 elements per block; every thread issues all its loads (64 or 128
    # bytes per tensor) before the first use, and the grid is the tile count (many blocks per SM).
    return EngramSinkhornMomentumUpdateConfig(
        backend, grad_dtype, momentum_dtype, nesterov, num_cores, block=4096, threads=256, num_stages=1
    )


def _ascend_kernel(cfg: EngramSinkhornMomentumUpdateConfig):
    import tilelang.ascend.language as T

    blk, stages, nesterov = cfg.block, cfg.num_stages, cfg.nesterov
    grid = cfg.num_cores
    lanes = _LANES
    f32, bf16 = T.float32, T.bfloat16
    gdt = bf16 if cfg.grad_dtype == 'bfloat16' else f32
    mdt = bf16 if cfg.momentum_dtype == 'bfloat16' else f32
    numel = T.dynamic('numel')

    def load_f32(ub, dt, offset):
        if dt == bf16:
            return T.simd.vcvt(T.simd.vld(ub[offset], dist='UNPK_B16'), f32)
        return T.simd.vld(ub[offset])

    @T.prim_func
    def engram_sinkhorn_momentum_update_kernel(
        grad: T.Tensor((numel,), gdt),
        momentum_buffer: T.Tensor((numel,), mdt),
        sinkhorn_input: T.Tensor((numel,), f32),
        beta1: T.float32,
        one_minus_beta1: T.float32,
    ):
        with T.Kernel(grid) as cid:
            g_ub = T.alloc_shared((blk,), gdt)
            m_ub = T.alloc_shared((blk,), mdt)  # m, then m' in place
            o_ub = T.alloc_shared((blk,), f32)
            T.annotate_buffer_versions({g_ub: stages, m_ub: stages, o_ub: stages})
            for task in T.Persistent([T.ceildiv(numel, blk)], grid, cid, group_size=1, num_stages=stages):
                e0 = task * blk
                valid = T.min(blk, numel - e0)
                T.copy(grad[e0 : e0 + valid], g_ub[0:valid])
                T.copy(momentum_buffer[e0 : e0 + valid], m_ub[0:valid])
                with T.SimdVF():
                    beta = T.simd.vdup(beta1, f32)
                    # Whole registers over the valid part: the lanes past `valid` in the last register hold
                    # stale UB data and are computed but never copied out.
                    for c in T.serial(T.ceildiv(valid, lanes)):
                        gv = load_f32(g_ub, gdt, c * lanes)
                        mv = load_f32(m_ub, mdt, c * lanes)
                        mn = T.simd.alloc_var(f32)
                        mn = T.simd.vmuls(gv, one_minus_beta1)  # s
                        T.simd.vmula(mn, mv, beta)  # m' = s + m * b, fused
                        if mdt == bf16:
                            T.simd.vsts(m_ub[c * lanes], T.simd.vcvt(mn, bf16), dist='PK_B32')
                        else:
                            T.simd.vsts(m_ub[c * lanes], mn)
                        if nesterov:
                            nv = T.simd.alloc_var(f32)
                            nv = T.simd.vmuls(gv, one_minus_beta1)  # s again
                            T.simd.vmula(nv, mn, beta)  # s + m' * b, fused
                            T.simd.vsts(o_ub[c * lanes], nv)
                        else:
                            T.simd.vsts(o_ub[c * lanes], mn)
                T.copy(m_ub[0:valid], momentum_buffer[e0 : e0 + valid])
                T.copy(o_ub[0:valid], sinkhorn_input[e0 : e0 + valid])

    return engram_sinkhorn_momentum_update_kernel


def _cuda_kernel(cfg: EngramSinkhornMomentumUpdateConfig):
    import tilelang.language as T

    blk, nt, nesterov = cfg.block, cfg.threads, cfg.nesterov
    ve = _CUDA_ELEMS
    steps = blk // (nt * ve)
    f32, bf16 = T.float32, T.bfloat16
    gdt = bf16 if cfg.grad_dtype == 'bfloat16' else f32
    mdt = bf16 if cfg.momentum_dtype == 'bfloat16' else f32
    gvec = 8 if gdt == bf16 else 4  # elements of one 16-byte access
    mvec = 8 if mdt == bf16 else 4
    numel = T.dynamic('numel')

    @T.prim_func
    def engram_sinkhorn_momentum_update_kernel(
        grad: T.Tensor((numel,), gdt),
        momentum_buffer: T.Tensor((numel,), mdt),
        sinkhorn_input: T.Tensor((numel,), f32),
        beta1: T.float32,
        one_minus_beta1: T.float32,
    ):
        with T.Kernel(T.ceildiv(numel, blk), threads=nt) as bx:
            tid = T.get_thread_binding()
            g_l = T.alloc_local((steps * ve,), gdt)
            m_l = T.alloc_local((steps * ve,), mdt)
            o_l = T.alloc_local((steps * ve,), f32)
            mn = T.alloc_var(f32)
            e0 = bx * blk
            if e0 + blk <= numel:
                # Full block: 16-byte vector accesses; thread `tid` owns the 8-element chunks
                # e0 + (u * nt + tid) * 8, u = 0 .. steps - 1 (coalesced across the block).
                for u in T.unroll(steps):
                    base = e0 + (u * nt + tid) * ve
                    for j0 in T.unroll(ve // gvec):
                        for j in T.vectorized(gvec):
                            g_l[u * ve + j0 * gvec + j] = grad[base + j0 * gvec + j]
                    for j0 in T.unroll(ve // mvec):
                        for j in T.vectorized(mvec):
                            m_l[u * ve + j0 * mvec + j] = momentum_buffer[base + j0 * mvec + j]
                for i in T.unroll(steps * ve):
                    s = one_minus_beta1 * T.cast(g_l[i], f32)
                    mn = T.ieee_fmaf(T.cast(m_l[i], f32), beta1, s)
                    m_l[i] = T.cast(mn, mdt)
                    o_l[i] = T.ieee_fmaf(mn, beta1, s) if nesterov else mn
                for u in T.unroll(steps):
                    base = e0 + (u * nt + tid) * ve
                    for j0 in T.unroll(ve // mvec):
                        for j in T.vectorized(mvec):
                            momentum_buffer[base + j0 * mvec + j] = m_l[u * ve + j0 * mvec + j]
                    for j0 in T.unroll(2):
                        for j in T.vectorized(4):
                            sinkhorn_input[base + j0 * 4 + j] = o_l[u * ve + j0 * 4 + j]
            else:
                # The last, partial block: element-wise, guarded (at most blk - 1 elements).
                for i in T.serial(steps * ve):
                    e = e0 + i * nt + tid
                    if e < numel:
                        s = one_minus_beta1 * T.cast(grad[e], f32)
                        mn = T.ieee_fmaf(T.cast(momentum_buffer[e], f32), beta1, s)
                        momentum_buffer[e] = T.cast(mn, mdt)
                        sinkhorn_input[e] = T.ieee_fmaf(mn, beta1, s) if nesterov else mn

    return engram_sinkhorn_momentum_update_kernel


def make_engram_sinkhorn_momentum_update_kernel(cfg: EngramSinkhornMomentumUpdateConfig):
    """The TileLang prim_func `engram_sinkhorn_momentum_update_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return _ascend_kernel(cfg)
    return _cuda_kernel(cfg)


@functools.cache
def get_engram_sinkhorn_momentum_update_kernel(cfg: EngramSinkhornMomentumUpdateConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_sinkhorn_momentum_update_kernel(cfg), cfg.backend)
