"""Kernels of engram_sinkhorn_momentum_update (docs/engram.md, "Sinkhorn normalisation").

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
# Elements of one CUDA vector access (16 bytes of fp32, 8 of bf16): a warp's access covers 32 consecutive
# chunks, so every tensor's accesses are coalesced whatever its dtype.
_CUDA_CHUNK = 4
# CUDA block shapes, (threads, elements per block). Streaming: one warp of 8 elements per thread, the grid
# the tile count (up to 32 blocks per SM). Calls of at most _CUDA_WIDE_BLOCKS_PER_SM wide blocks per SM take
# the wide shape instead: in one or two waves of blocks, fewer and fuller blocks finish sooner (README,
# Performance: both were the fastest of the block shapes measured side by side on the H200 in their range).
_CUDA_STREAMING_BLOCK = (32, 256)
_CUDA_WIDE_BLOCK = (128, 2048)
_CUDA_WIDE_BLOCKS_PER_SM = 2


def cuda_wide_block_max_numel(num_sms: int) -> int:
    """The largest element count that takes the CUDA kernel's wide blocks on a GPU of `num_sms` SMs."""
    return _CUDA_WIDE_BLOCKS_PER_SM * num_sms * _CUDA_WIDE_BLOCK[1]


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
        if self.backend == 'cuda' and self.block % (self.threads * _CUDA_CHUNK) != 0:
            raise ValueError(f'block {self.block} must be a multiple of threads * {_CUDA_CHUNK}')


def choose_engram_sinkhorn_momentum_update_config(
    *, backend: Backend, grad_dtype: str, momentum_dtype: str, nesterov: bool, num_cores: int, numel: int
) -> EngramSinkhornMomentumUpdateConfig:
    """Pure choice of the compile-time parameters (no device query). The element count is a runtime size;
    on CUDA it also picks one of two block shapes (cuda_wide_block_max_numel), so two calls of different
    sizes may launch two kernels."""
    if backend == 'ascend':
        # 8192 elements per task: at most 3 x 32 KB of UB per buffer version (fp32 in and out), two versions
        # so the DMA of the next tile overlaps the vector work of this one.
        return EngramSinkhornMomentumUpdateConfig(
            backend, grad_dtype, momentum_dtype, nesterov, num_cores, block=8192, threads=0, num_stages=2
        )
    threads, block = _CUDA_WIDE_BLOCK if numel <= cuda_wide_block_max_numel(num_cores) else _CUDA_STREAMING_BLOCK
    return EngramSinkhornMomentumUpdateConfig(
        backend, grad_dtype, momentum_dtype, nesterov, num_cores, block=block, threads=threads, num_stages=1
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
    vc = _CUDA_CHUNK
    chunks = blk // (nt * vc)  # chunks per thread
    f32, bf16 = T.float32, T.bfloat16
    gdt = bf16 if cfg.grad_dtype == 'bfloat16' else f32
    mdt = bf16 if cfg.momentum_dtype == 'bfloat16' else f32
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
            g_l = T.alloc_local((chunks * vc,), gdt)
            m_l = T.alloc_local((chunks * vc,), mdt)
            o_l = T.alloc_local((chunks * vc,), f32)
            mn = T.alloc_var(f32)
            e0 = bx * blk
            if e0 + blk <= numel:
                # Full block: thread `tid` owns the 4-element chunks e0 + (q * nt + tid) * 4, q = 0 .. chunks - 1;
                # all its loads are issued before the first use.
                for q in T.unroll(chunks):
                    base = e0 + (q * nt + tid) * vc
                    for j in T.vectorized(vc):
                        g_l[q * vc + j] = grad[base + j]
                    for j in T.vectorized(vc):
                        m_l[q * vc + j] = momentum_buffer[base + j]
                for i in T.unroll(chunks * vc):
                    s = one_minus_beta1 * T.cast(g_l[i], f32)
                    mn = T.ieee_fmaf(T.cast(m_l[i], f32), beta1, s)
                    m_l[i] = T.cast(mn, mdt)
                    o_l[i] = T.ieee_fmaf(mn, beta1, s) if nesterov else mn
                for q in T.unroll(chunks):
                    base = e0 + (q * nt + tid) * vc
                    for j in T.vectorized(vc):
                        momentum_buffer[base + j] = m_l[q * vc + j]
                    for j in T.vectorized(vc):
                        sinkhorn_input[base + j] = o_l[q * vc + j]
            else:
                # The last, partial block: element-wise, guarded (at most blk - 1 elements).
                for i in T.serial(chunks * vc):
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
