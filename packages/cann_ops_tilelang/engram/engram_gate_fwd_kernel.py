"""Kernels of engram_gate_fwd (docs/engram.md, "Forward"): Ascend 950 and CUDA.

Per token t and branch h (vectors over the hidden size H, fp32 math, bf16 in/out):
    rstd_x = rsqrt(mean(x^2) + eps), rstd_k = rsqrt(mean(k^2) + eps), dot = sum(x * w * k)
    d = dot * rstd_x * rstd_k / sqrt(H), g = sigmoid(sign(d) * sqrt(max(|d|, clamp)))
    out = x + g * v[t]

Kernels (one prim_func signature per variant, `_engram_gate_fwd_prim_func`, around each backend's body):
CUDA in _engram_gate_fwd_cuda.py, Ascend 950 in _engram_gate_fwd_ascend.py.

Design: one pass over memory. Every (t, h) row of x and k is read once and kept on chip between
the reductions and the epilogue; the fused weight stays on chip for the whole kernel where it fits.
"""

# No `from __future__ import annotations`: TileLang reads the prim_func annotations at build time.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.engram._contract import HIDDEN_ALIGN, MAX_HC, MAX_HIDDEN
from cann_ops_tilelang.kernel_target import CUDA_MAX_THREADS_PER_SM, CUDA_REGS_PER_SM, compile_kernel

# The backend bodies. They do not import this module (no import circle): the constant both sides use lives
# there, and they get the prim_func signature (_engram_gate_fwd_prim_func) as an argument.
from ._engram_gate_fwd_ascend import ascend_engram_gate_fwd_kernel
from ._engram_gate_fwd_cuda import CUDA_VEC, cuda_engram_gate_fwd_kernel

# --- CUDA tuning model -----------------------------------------------------------------------
CUDA_MAX_BLOCKS_PER_SM = 8

# --- Ascend 950 model --------------------------------------------------------------------------
ASCEND_UB_BUDGET = 232 * 1024  # keep a margin for the small buffers and alignment padding


@dataclasses.dataclass(frozen=True)
class EngramGateFwdConfig:
    backend: Backend
    hc: int
    hidden: int
    num_cores: int  # Ascend: vector cores; CUDA: SMs (persistent grid = num_cores * blocks_per_core)
    save_for_backward: bool = True
    has_mask: bool = False  # the kernel takes image_token_mask (T,) bool (mask=None is its own variant)
    # CUDA: a block owns one branch h and streams tokens; each thread owns `chunks` 8-element
    # column chunks of that branch (weight in registers for the whole kernel).
    threads: int = 128
    chunks: int = 1
    blocks_per_core: int = 1
    vec: int = 8  # elements per global access of k/v/x/out (alignment of the actual tensors: 8, 4, 2 or 1)
    # Ascend: a task is (token, group of `group` branches); `stages` buffer versions.
    group: int = 1
    stages: int = 2
    weight_resident: bool = False  # Ascend: the whole (hc, H) fp32 weight stays in UB

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'unknown backend {self.backend!r}')
        if not 1 <= self.hc <= MAX_HC or self.hidden % HIDDEN_ALIGN or not HIDDEN_ALIGN <= self.hidden <= MAX_HIDDEN:
            raise ValueError(f'unsupported hc={self.hc}, hidden={self.hidden}')
        if self.vec not in (1, 2, 4, 8):
            raise ValueError(f'vec must be 1, 2, 4 or 8, got {self.vec}')
        if self.backend == 'cuda':
            if self.threads % 32 or not 32 <= self.threads <= 1024:
                raise ValueError(f'threads must be a multiple of 32 in 32..1024, got {self.threads}')
            if self.threads * self.chunks * CUDA_VEC < self.hidden:
                raise ValueError('threads * chunks * 8 must cover the hidden size')
        else:
            if self.hc % self.group:
                raise ValueError(f'group {self.group} must divide hc {self.hc}')

    @property
    def persistent_blocks(self) -> int:
        """CUDA: blocks per branch (the grid is hc * persistent_blocks)."""
        return max(1, self.num_cores * self.blocks_per_core // self.hc)


def _cuda_regs_estimate(chunks: int) -> int:
    # w: 8 fp32 per chunk; x, k, v: 8 bf16 (4 registers) per chunk; plus addressing/reductions
    # (ptxas, sm_90: 65 registers at 2 chunks, 104 at 4, 162 at 7, 187 at 8). Forcing one more block
    # per SM than this allows spills, which cost far more than the lost occupancy (README, Performance).
    return 20 * chunks + 24


def _ascend_ub_bytes(hc: int, hidden: int, group: int, stages: int, weight_resident: bool) -> int:
    per_stage = group * hidden * 2 * 2 + hidden * 2  # x (also the out tile), k, v
    w = hc * hidden * 4 if weight_resident else stages * group * hidden * 4
    return stages * per_stage + w + 4 * 1024


def choose_engram_gate_fwd_config(
    *,
    backend: Backend,
    hc: int,
    hidden: int,
    num_cores: int,
    save_for_backward: bool = True,
    has_mask: bool = False,
    vec: int = 8,
) -> EngramGateFwdConfig:
    """Compile-time parameters for one shape (pure: no device query)."""
    if backend == 'cuda':
        h8 = hidden // CUDA_VEC
        # Smallest thread count (multiple of 32, >= 64 where the row allows) giving <= 8 chunks per
        # thread; prefer an exact division of the row so no thread is predicated.
        threads, chunks = None, None
        for cand in (128, 64, 192, 256, 96, 320, 384, 448, 512, 640, 768, 896, 1024):
            c = -(-h8 // cand)
            if c <= 8 and h8 % cand == 0:
                threads, chunks = cand, c
                break
        if threads is None:
            threads = min(1024, max(32, -(-min(h8, 128) // 32) * 32))
            chunks = -(-h8 // threads)
            while chunks > 8 and threads < 1024:
                threads += 32
                chunks = -(-h8 // threads)
        regs = -(-_cuda_regs_estimate(chunks) // 8) * 8
        blocks = max(
            1, min(CUDA_MAX_BLOCKS_PER_SM, CUDA_REGS_PER_SM // (regs * threads), CUDA_MAX_THREADS_PER_SM // threads)
        )
        return EngramGateFwdConfig(
            backend='cuda',
            hc=hc,
            hidden=hidden,
            num_cores=num_cores,
            save_for_backward=save_for_backward,
            has_mask=has_mask,
            threads=threads,
            chunks=chunks,
            blocks_per_core=blocks,
            vec=vec,
        )
    if backend == 'ascend':
        best = None
        for weight_resident in (True, False):
            for stages in (2, 1):
                for group in sorted((g for g in range(1, hc + 1) if hc % g == 0), reverse=True):
                    if _ascend_ub_bytes(hc, hidden, group, stages, weight_resident) <= ASCEND_UB_BUDGET:
                        best = (group, stages, weight_resident)
                        break
                if best:
                    break
            if best:
                break
        if best is None:
            raise ValueError(f'no Ascend tiling fits the Unified Buffer for hc={hc}, hidden={hidden}')
        group, stages, weight_resident = best
        # `vec` is a CUDA field: the Ascend DMA takes any GM alignment, so it stays at its default.
        return EngramGateFwdConfig(
            backend='ascend',
            hc=hc,
            hidden=hidden,
            num_cores=num_cores,
            save_for_backward=save_for_backward,
            has_mask=has_mask,
            group=group,
            stages=stages,
            weight_resident=weight_resident,
        )
    raise ValueError(f'unknown backend {backend!r}')


def make_engram_gate_fwd_kernel(cfg: EngramGateFwdConfig):
    """The TileLang prim_func `engram_gate_fwd_kernel` for `cfg.backend` (no device query, no compile)."""
    if cfg.backend == 'cuda':
        return cuda_engram_gate_fwd_kernel(cfg, _engram_gate_fwd_prim_func)
    return ascend_engram_gate_fwd_kernel(cfg, _engram_gate_fwd_prim_func)


@functools.cache
def get_engram_gate_fwd_kernel(cfg: EngramGateFwdConfig):
    return compile_kernel(make_engram_gate_fwd_kernel(cfg), cfg.backend)


def _engram_gate_fwd_prim_func(T, body, *, hc, hidden, save, has_mask, num_tokens, strides):
    """The prim_func `engram_gate_fwd_kernel` around a backend's kernel body, a T.macro taking (x, kv, w,
    image_token_mask, out, dot, gate_score, rstd_x, rstd_k, eps, clamp_value) with None for what the variant
    does not take: image_token_mask (T,) bool only when `has_mask`, the four saved (T, hc) fp32 outputs only
    when `save`. `T` is the backend's language module; `strides` the dynamic (kv_stride_t, kv_stride_h) of
    kv, which the bodies index as kv[t, h, :] (keys, h < hc) and kv[t, hc, :] (the value): one tensor
    argument rather than key and value views, because every tensor argument costs the launch a conversion
    and its checks on the host. In place, `out` is `x` itself: every element of x is read before the same
    core/thread writes it, and no other one touches it."""
    kv_st, kv_sh = strides
    f32, bf16 = T.float32, T.bfloat16
    if save and has_mask:

        @T.prim_func
        def engram_gate_fwd_kernel(
            x: T.Tensor((num_tokens, hc, hidden), bf16),
            kv: T.StridedTensor((num_tokens, hc + 1, hidden), (kv_st, kv_sh, 1), bf16),
            w: T.Tensor((hc, hidden), f32),
            image_token_mask: T.Tensor((num_tokens,), T.bool),
            out: T.Tensor((num_tokens, hc, hidden), bf16),
            dot_o: T.Tensor((num_tokens, hc), f32),
            g_o: T.Tensor((num_tokens, hc), f32),
            rx_o: T.Tensor((num_tokens, hc), f32),
            rk_o: T.Tensor((num_tokens, hc), f32),
            eps: T.float32,
            clamp_value: T.float32,
        ):
            body(x, kv, w, image_token_mask, out, dot_o, g_o, rx_o, rk_o, eps, clamp_value)

    elif save:

        @T.prim_func
        def engram_gate_fwd_kernel(
            x: T.Tensor((num_tokens, hc, hidden), bf16),
            kv: T.StridedTensor((num_tokens, hc + 1, hidden), (kv_st, kv_sh, 1), bf16),
            w: T.Tensor((hc, hidden), f32),
            out: T.Tensor((num_tokens, hc, hidden), bf16),
            dot_o: T.Tensor((num_tokens, hc), f32),
            g_o: T.Tensor((num_tokens, hc), f32),
            rx_o: T.Tensor((num_tokens, hc), f32),
            rk_o: T.Tensor((num_tokens, hc), f32),
            eps: T.float32,
            clamp_value: T.float32,
        ):
            body(x, kv, w, None, out, dot_o, g_o, rx_o, rk_o, eps, clamp_value)

    elif has_mask:

        @T.prim_func
        def engram_gate_fwd_kernel(
            x: T.Tensor((num_tokens, hc, hidden), bf16),
            kv: T.StridedTensor((num_tokens, hc + 1, hidden), (kv_st, kv_sh, 1), bf16),
            w: T.Tensor((hc, hidden), f32),
            image_token_mask: T.Tensor((num_tokens,), T.bool),
            out: T.Tensor((num_tokens, hc, hidden), bf16),
            eps: T.float32,
            clamp_value: T.float32,
        ):
            body(x, kv, w, image_token_mask, out, None, None, None, None, eps, clamp_value)

    else:

        @T.prim_func
        def engram_gate_fwd_kernel(
            x: T.Tensor((num_tokens, hc, hidden), bf16),
            kv: T.StridedTensor((num_tokens, hc + 1, hidden), (kv_st, kv_sh, 1), bf16),
            w: T.Tensor((hc, hidden), f32),
            out: T.Tensor((num_tokens, hc, hidden), bf16),
            eps: T.float32,
            clamp_value: T.float32,
        ):
            body(x, kv, w, None, out, None, None, None, None, eps, clamp_value)

    return engram_gate_fwd_kernel
