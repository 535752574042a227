"""Kernels of engram_gate_bwd: the Engram gate backward (docs/engram.md, "Backward").

Per token t and branch h (vectors over H, fp32 math, s = H ** -0.5):

    dL/dg  = sum(grad_out[t, h] * v[t])
    d      = dot * rstd_x * rstd_k * s
    r      = 0 if |d| < clamp_value else dL/dg * g * (1 - g) * 0.5 * sqrt(s * rstd_x * rstd_k / |dot|)
    grad_x = grad_out + r * (k * w - x * dot * rstd_x**2 / H)
    grad_k =            r * (x * w - k * dot * rstd_k**2 / H)
    grad_v[t]         = sum_h grad_out[t, h] * g[t, h]
    grad_w_partial[p] = sum over the tokens of block p of r * x * k        (one slice per block, no float atomics)

Every kernel launches `num_cores` persistent blocks, one slice of grad_w_partial each, or on CUDA for wide
tokens `num_cores // 2` clusters of 2 CTAs, one slice per cluster (P = cfg.num_blocks = grad_w_partial.shape[0]).
The CUDA kernels write each block's whole slice of grad_w_partial (zeros when the block handles no token); the
Ascend kernel adds into it, so the caller passes it zero-filled (cfg.accumulates_into_partials).

Kernels (one prim_func signature, `_engram_gate_bwd_prim_func`, around each backend's body):
- CUDA (_engram_gate_bwd_cuda.py): variant 'resident', one pass over memory, with a CTA per token where
  the token's staging slots and the per-thread slice of the weight gradient fit (hc * H up to ~32K), else
  with a cluster of 2 CTAs per token (cfg.cluster = 2, hc * H up to 64K at hc <= 4 and hc = 8), else
  variant 'chunked'.
- Ascend 950 (_engram_gate_bwd_ascend.py): the chunked scheme on the vector cores.

Summation orders (fp32) differ from torch's, so grads agree with an fp32 reference to rounding.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to
# the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

from ._contract import HIDDEN_ALIGN, MAX_HIDDEN

# The backend bodies. They do not import this module (no import circle): the constants both sides use live
# there (VEC: bf16 elements per 16-byte CUDA access; LANES: fp32 lanes of an Ascend vector register), and
# they get the prim_func signature (_engram_gate_bwd_prim_func) as an argument.
from ._engram_gate_bwd_ascend import LANES as _LANES
from ._engram_gate_bwd_ascend import ascend_chunked_kernel
from ._engram_gate_bwd_cuda import VEC, cuda_chunked_kernel, cuda_resident_kernel

# int32 words of the token_counter argument: [0] the claims made so far (the resident CUDA kernel's last
# claim resets it to 0: _engram_gate_bwd_cuda.py).
COUNTER_WORDS = 1
# Calls of at most this many tokens per persistent block take the fixed token ranges even where blocks could
# claim tokens: with a few tokens per block the fixed ranges drift apart by less than the claims' round trips
# and the counter's reset cost (H200 sweep: docs/engram.md, "Gate backward: claims and fixed ranges"), and
# they need no counter (one per stream, engram_gate_bwd._token_counter: host time a launch-bound call pays).
FIXED_RANGE_MAX_TOKENS_PER_BLOCK = 8
_CUDA_SMEM_BUDGET = 200 * 1024  # bytes of shared memory a resident block may use (227 KB max, keep L1)
# Slots that fit nowhere else may take the whole opt-in maximum (227 KB) less the small rings (scalars, dL/dg
# partials, claims); the weight slice is then read through L2 (hc = 4, H = 8192: 97 % of copy, docs/engram.md).
_CUDA_SMEM_MAX = 224 * 1024
# CTAs of a cluster that split a token's H between them (one token per cluster, dL/dg partials exchanged through
# distributed shared memory), tried in this order: 2 keeps hc * H up to 65536 on the one-pass kernel. Clusters
# of 4 measured slower than the chunked kernel (fewer of them are resident at once than SMs / 4).
_CUDA_CLUSTER_SIZES = (1, 2)
# Resident blocks wider than this were slower: at H = 5120 one group per thread takes 640 threads and
# reached 83-86 % of copy, two groups per thread on 320 threads 95-99 % (README, Performance).
_CUDA_RESIDENT_PREFERRED_THREADS = 512
_CUDA_REGS = 65536  # 32-bit registers per SM
_CUDA_MAX_UNITS_PER_THREAD = 8  # resident: column groups x branches per thread (_cuda_block_plan)
_CUDA_REG_BASE = 20  # registers per thread besides the per-branch scalars, packed grad_out and weight-gradient slice
_CUDA_REG_SLACK = 8  # at >= 128 registers a few spilled ones cost less than halving the threads
# The CUDA mask variant's schedules the chooser gives (EngramGateBwdConfig.mask_ahead, .mask_results). False and
# 'if_then_else' keep the schedule measured so far; the others are lowered and compiled only, not yet timed
# (docs/engram.md, "Image tokens: the mask's schedule"). Resident plans take them only where registers are not
# tight (_cuda_resident_regs_spare): at 128 registers a thread (hc = 2 / 4, H >= 7168) ptxas spilled more with
# them than without.
_CUDA_MASK_AHEAD = False
_CUDA_MASK_RESULTS = 'if_then_else'
_MASK_RESULTS = ('if_then_else', 'select', 'bitwise')
_ASCEND_UB_BUDGET = 180 * 1024  # bytes of UB for the chunked Ascend kernel (248 KB physical)
_PASS_CONFIGS = {
    # The resident kernel places every barrier itself (its staging slots are thread-private).
    'tl.disable_warp_specialized': True,
    'tl.disable_thread_storage_sync': True,
}
_RESIDENT_PASS_CONFIGS = {
    **_PASS_CONFIGS,
    # Its token indices come from a counter or a range the analyzer cannot bound; every access already sits
    # under `token < num_tokens`, so TileLang's extra bounds checks would only add predicates and branches.
    'tl.disable_safe_memory_legalize': True,
}


@dataclasses.dataclass(frozen=True)
class EngramGateBwdConfig:
    backend: Backend
    hc: int
    hidden: int
    num_cores: int  # Ascend vector cores / CUDA SMs: one persistent block each (P = num_cores)
    variant: str  # 'resident' (CUDA only) or 'chunked'
    threads: int  # CUDA threads per block (0 on Ascend)
    groups_per_thread: int  # resident: 16-byte column groups per thread (all hc branches each)
    w_in_smem: bool  # resident: weight_fused staged in shared memory (else read through L1/L2)
    tile_cols: int  # chunked: columns per tile (Ascend: divides hidden; CUDA: threads * 8)
    token_chunk: int  # chunked: tokens per chunk
    dynamic_tokens: bool = False  # resident: blocks claim tokens from a counter (else a fixed contiguous range)
    has_mask: bool = False  # the kernel takes image_token_mask (T,) bool (mask=None is its own variant)
    cluster: int = 1  # resident: CTAs of a cluster splitting each token's H (1: a block per token)
    # CUDA mask variant: each token's mask read ahead of its use (resident: two tokens ahead by thread 0, into a
    # ring in shared memory like the saved scalars; chunked: once per token in phase A, into shared memory,
    # phase B branching once per token), instead of at the token's start (resident) or per tile and branch
    # (chunked). Same results.
    mask_ahead: bool = False
    # CUDA resident mask variant, phase B: how an image token's results replace the text ones. 'if_then_else' per
    # element (nvcc makes branches around the arithmetic of them); 'select': every value computed first, then
    # plain ternaries; 'bitwise': every value first, then bit masks (no branch). Same results.
    mask_results: str = 'if_then_else'

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.variant not in ('resident', 'chunked'):
            raise ValueError(f'variant must be "resident" or "chunked", got {self.variant!r}')
        if self.backend == 'ascend' and self.variant != 'chunked':
            raise ValueError('the Ascend kernel has only the "chunked" variant')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.variant == 'chunked':
            if self.tile_cols % _LANES != 0 or self.token_chunk < 1:
                raise ValueError(f'bad chunked tiling: tile_cols={self.tile_cols}, token_chunk={self.token_chunk}')
            if self.backend == 'ascend' and (self.hidden % self.tile_cols != 0 or self.token_chunk * self.hc > _LANES):
                raise ValueError(f'bad Ascend tiling: tile_cols={self.tile_cols}, token_chunk={self.token_chunk}')
        if self.backend == 'cuda' and (self.threads % 32 != 0 or not 32 <= self.threads <= 1024):
            raise ValueError(f'CUDA threads must be a multiple of 32 in 32..1024, got {self.threads}')
        if self.dynamic_tokens and (self.variant != 'resident' or self.cluster > 1):
            raise ValueError('only the resident CUDA kernel without clusters claims tokens dynamically')
        if self.cluster != 1 and (
            self.variant != 'resident' or self.cluster not in _CUDA_CLUSTER_SIZES or self.num_cores < self.cluster
        ):
            raise ValueError(f'cluster={self.cluster}: only the resident CUDA kernel splits tokens, over 2 CTAs')
        if self.mask_ahead and (self.backend != 'cuda' or not self.has_mask):
            raise ValueError('mask_ahead is a schedule of the CUDA mask variant (has_mask=True)')
        if self.mask_results not in _MASK_RESULTS:
            raise ValueError(f'mask_results must be one of {_MASK_RESULTS}, got {self.mask_results!r}')
        if self.mask_results != 'if_then_else' and (
            self.backend != 'cuda' or self.variant != 'resident' or not self.has_mask
        ):
            raise ValueError('mask_results is a schedule of the resident CUDA mask variant (has_mask=True)')
        if self.variant == 'resident' and self.hidden // VEC % self.cluster:
            raise ValueError(f'hidden={self.hidden} does not split into {self.cluster} CTAs of 16-byte groups')

    @property
    def num_blocks(self) -> int:
        """P: the first dimension of grad_w_partial, one slice per persistent block (per cluster where split)."""
        return self.num_cores // self.cluster

    @property
    def accumulates_into_partials(self) -> bool:
        """The kernel adds to grad_w_partial (which must then arrive zero-filled) instead of writing it."""
        return self.backend == 'ascend'


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def fixed_range_max_tokens(num_cores: int) -> int:
    """The most tokens a call on `num_cores` persistent blocks takes fixed token ranges with (more: claims)."""
    return FIXED_RANGE_MAX_TOKENS_PER_BLOCK * num_cores


def _cuda_slot_bytes(hc: int, groups_per_thread: int, threads: int) -> int:
    """Shared memory of a resident CTA's staging slots: grad_out, x, k (hc rows each) and v of one token."""
    return (3 * hc + 1) * groups_per_thread * threads * VEC * 2


def _cuda_reg_cap(threads: int) -> int:
    """Registers per thread ptxas may use with __launch_bounds__(threads, 1) (allocation granularity 8)."""
    return min(255, _CUDA_REGS // _round_up(threads, 128) // 8 * 8)


def _cuda_resident_regs(hc: int, groups_per_thread: int) -> int:
    """Registers a resident thread needs: the weight-gradient slice (fp32), grad_out held across the reduction
    (packed bf16), r and the two rstd terms per branch, and the rest (addresses, loop state, temporaries)."""
    return 12 * groups_per_thread * hc + 4 * hc + _CUDA_REG_BASE


def _cuda_resident_regs_spare(hc: int, groups_per_thread: int, threads: int) -> bool:
    """Whether a resident plan leaves registers to spare (the slack above its need): where the mask variant's
    schedules mask_ahead and mask_results may take some."""
    return _cuda_resident_regs(hc, groups_per_thread) + _CUDA_REG_SLACK <= _cuda_reg_cap(threads)


def _cuda_resident_plan(hc: int, hidden: int) -> tuple[int, int, bool, int] | None:
    """(threads, groups_per_thread, w_in_smem, cluster) of the resident kernel, or None where it does not fit.

    One CTA per token where it fits, else a cluster of CTAs, each with 1 / cluster of the token's columns.
    """
    for cluster in _CUDA_CLUSTER_SIZES:
        for budget in (_CUDA_SMEM_BUDGET, _CUDA_SMEM_MAX):
            plan = _cuda_block_plan(hc, hidden // cluster, budget)
            if plan is not None:
                return (*plan, cluster)
    return None


def _cuda_block_plan(hc: int, cols: int, smem_budget: int) -> tuple[int, int, bool] | None:
    """(threads, groups_per_thread, w_in_smem) of a resident CTA holding `cols` columns of each branch."""
    groups = cols // VEC
    # Blocks of at most _CUDA_RESIDENT_PREFERRED_THREADS first (more column groups per thread where needed),
    # wider blocks only where no such plan fits (README, Performance: H = 5120).
    candidates = [(g, _round_up(-(-groups // g), 32)) for g in (1, 2, 4)]
    candidates.sort(key=lambda gt: gt[1] > _CUDA_RESIDENT_PREFERRED_THREADS)  # stable: fewest groups first
    for g, threads in candidates:
        # More than 8 (branch, group) units per thread (hc = 8 at 2 groups: 256 threads of 255 registers)
        # reached 55-68 % of copy on the H200, below a split or the chunked kernel.
        if threads > 1024 or g * hc > _CUDA_MAX_UNITS_PER_THREAD:
            continue
        cap = _cuda_reg_cap(threads)
        if _cuda_resident_regs(hc, g) > cap + (_CUDA_REG_SLACK if cap >= 128 else 0):
            continue
        slots = _cuda_slot_bytes(hc, g, threads)
        if slots > smem_budget:
            continue
        w_in_smem = slots + hc * g * threads * VEC * 4 <= _CUDA_SMEM_BUDGET
        return threads, g, w_in_smem
    return None


def _ascend_tile_cols(hc: int, hidden: int) -> int:
    """Widest multiple of 64 dividing hidden whose chunked working set fits the UB budget."""
    # UB bytes per tile column: grad_out, x, k, grad_x, grad_k (bf16, hc rows), v, grad_v (bf16),
    # weight and weight-gradient accumulator (fp32, hc rows).
    per_col = 10 * hc + 4 + 8 * hc
    units = hidden // _LANES
    best = 1
    for d in range(1, units + 1):
        if units % d == 0 and d * _LANES * per_col <= _ASCEND_UB_BUDGET:
            best = d
    return best * _LANES


def choose_engram_gate_bwd_config(
    *,
    backend: Backend,
    hc: int,
    hidden: int,
    num_cores: int,
    deterministic: bool = False,
    has_mask: bool = False,
) -> EngramGateBwdConfig:
    """Pure choice of the compile-time parameters (no device query). T is a runtime size.

    `deterministic` keeps the resident kernel on its fixed token ranges, so that grad_w_partial is the same
    bits on every run; otherwise its blocks claim tokens from a counter (faster, same grads; each slice of
    grad_w_partial then sums whichever tokens its block claimed).
    """
    if backend == 'ascend':
        return EngramGateBwdConfig(
            backend,
            hc,
            hidden,
            num_cores,
            variant='chunked',
            threads=0,
            groups_per_thread=0,
            w_in_smem=False,
            tile_cols=_ascend_tile_cols(hc, hidden),
            token_chunk=_LANES // hc,
            has_mask=has_mask,
        )
    plan = _cuda_resident_plan(hc, hidden)
    if plan is not None:
        threads, g, w_in_smem, cluster = plan
        spare = has_mask and _cuda_resident_regs_spare(hc, g, threads)  # the mask's schedules may take registers
        return EngramGateBwdConfig(
            backend,
            hc,
            hidden,
            num_cores,
            variant='resident',
            threads=threads,
            groups_per_thread=g,
            w_in_smem=w_in_smem,
            tile_cols=_LANES,
            token_chunk=1,
            # Clusters keep fixed token ranges: claims measured slower there (docs/engram.md, "Gate backward:
            # wide tokens").
            dynamic_tokens=not deterministic and cluster == 1,
            has_mask=has_mask,
            cluster=cluster,
            mask_ahead=spare and _CUDA_MASK_AHEAD,
            mask_results=_CUDA_MASK_RESULTS if spare else 'if_then_else',
        )
    threads = 256
    return EngramGateBwdConfig(
        backend,
        hc,
        hidden,
        num_cores,
        variant='chunked',
        threads=threads,
        groups_per_thread=1,
        w_in_smem=False,
        tile_cols=threads * VEC,
        token_chunk=32,
        has_mask=has_mask,
        mask_ahead=has_mask and _CUDA_MASK_AHEAD,
    )


def _cuda_plan_class(cfg: EngramGateBwdConfig) -> tuple:
    """What the CUDA chooser decides beyond sizes: variant, cluster, groups per thread, where the weight lives,
    and the shared-memory tier of the staging slots."""
    slots = _cuda_slot_bytes(cfg.hc, cfg.groups_per_thread, cfg.threads)
    return cfg.variant, cfg.cluster, cfg.groups_per_thread, cfg.w_in_smem, slots > _CUDA_SMEM_BUDGET


def cuda_plan_widths(hc: int, num_cores: int) -> list[int]:
    """Both sides of every supported hidden size at which the CUDA plan of `hc` changes class (_cuda_plan_class):
    the widths the device tests and the benchmark grid take so that no plan goes untested."""
    widths: list[int] = []
    previous = None
    for hidden in range(HIDDEN_ALIGN, MAX_HIDDEN + 1, HIDDEN_ALIGN):
        cls = _cuda_plan_class(choose_engram_gate_bwd_config(backend='cuda', hc=hc, hidden=hidden, num_cores=num_cores))
        if previous is not None and cls != previous:
            widths += [hidden - HIDDEN_ALIGN, hidden]
        previous = cls
    return list(dict.fromkeys(widths))


def _engram_gate_bwd_prim_func(T, body, *, hc, hidden, num_blocks, has_mask, num_tokens, strides):
    """The prim_func `engram_gate_bwd_kernel` around a backend's kernel body, a T.macro taking (grad_out,
    hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k, image_token_mask, grad_x, grad_kv,
    grad_w_partial, clamp_value, token_counter), image_token_mask (T,) bool an argument only when `has_mask`
    (None otherwise). kv is the caller's (T, hc + 1, H) tensor with its runtime outer strides `strides`
    (kv_stride_t, kv_stride_h), indexed kv[t, h, :] for the keys (h < hc) and kv[t, hc, :] for the value:
    one tensor argument rather than key and value views, because every tensor argument costs the launch a
    conversion and its checks on the host. grad_kv is the packed (T, hc + 1, H) gradient: rows :hc grad_k,
    row hc grad_v. Every variant takes token_counter, int32 (COUNTER_WORDS,), as its last argument (used only
    where blocks claim tokens), so that there are two signatures, not four. `T` is the backend's language
    module."""
    kv_st, kv_sh = strides
    f32, bf16 = T.float32, T.bfloat16
    P = num_blocks
    if has_mask:

        @T.prim_func
        def engram_gate_bwd_kernel(
            grad_out: T.Tensor((num_tokens, hc, hidden), bf16),
            hidden_states: T.Tensor((num_tokens, hc, hidden), bf16),
            kv: T.StridedTensor((num_tokens, hc + 1, hidden), (kv_st, kv_sh, 1), bf16),
            weight_fused: T.Tensor((hc, hidden), f32),
            dot: T.Tensor((num_tokens, hc), f32),
            gate_score: T.Tensor((num_tokens, hc), f32),
            rstd_x: T.Tensor((num_tokens, hc), f32),
            rstd_k: T.Tensor((num_tokens, hc), f32),
            image_token_mask: T.Tensor((num_tokens,), T.bool),
            grad_x: T.Tensor((num_tokens, hc, hidden), bf16),
            grad_kv: T.Tensor((num_tokens, hc + 1, hidden), bf16),
            grad_w_partial: T.Tensor((P, hc, hidden), f32),
            clamp_value: T.float32,
            token_counter: T.Tensor((COUNTER_WORDS,), T.int32),
        ):
            body(
                grad_out, hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k,
                image_token_mask, grad_x, grad_kv, grad_w_partial, clamp_value, token_counter,
            )  # fmt: skip

    else:

        @T.prim_func
        def engram_gate_bwd_kernel(
            grad_out: T.Tensor((num_tokens, hc, hidden), bf16),
            hidden_states: T.Tensor((num_tokens, hc, hidden), bf16),
            kv: T.StridedTensor((num_tokens, hc + 1, hidden), (kv_st, kv_sh, 1), bf16),
            weight_fused: T.Tensor((hc, hidden), f32),
            dot: T.Tensor((num_tokens, hc), f32),
            gate_score: T.Tensor((num_tokens, hc), f32),
            rstd_x: T.Tensor((num_tokens, hc), f32),
            rstd_k: T.Tensor((num_tokens, hc), f32),
            grad_x: T.Tensor((num_tokens, hc, hidden), bf16),
            grad_kv: T.Tensor((num_tokens, hc + 1, hidden), bf16),
            grad_w_partial: T.Tensor((P, hc, hidden), f32),
            clamp_value: T.float32,
            token_counter: T.Tensor((COUNTER_WORDS,), T.int32),
        ):
            body(
                grad_out, hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k,
                None, grad_x, grad_kv, grad_w_partial, clamp_value, token_counter,
            )  # fmt: skip

    return engram_gate_bwd_kernel


def make_engram_gate_bwd_kernel(cfg: EngramGateBwdConfig):
    """The TileLang prim_func `engram_gate_bwd_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_chunked_kernel(cfg, _engram_gate_bwd_prim_func)
    if cfg.variant == 'resident':
        prim_func = cuda_resident_kernel(cfg, _engram_gate_bwd_prim_func)
        return prim_func.with_attr('tilelang_pass_configs', dict(_RESIDENT_PASS_CONFIGS))
    return cuda_chunked_kernel(cfg, _engram_gate_bwd_prim_func).with_attr('tilelang_pass_configs', dict(_PASS_CONFIGS))


@functools.cache
def get_engram_gate_bwd_kernel(cfg: EngramGateBwdConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_engram_gate_bwd_kernel(cfg), cfg.backend)
