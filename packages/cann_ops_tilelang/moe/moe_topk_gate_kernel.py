"""Kernels of moe_topk_gate: the router's forward, logits (T, E) fp32 -> (topk_idx, topk_weights) (T, K + S).

Semantics (TileKernels 2.1.0's `moe_topk_gate_forward`, plus the scoring functions and group-limited routing of
CANN's MoeGatingTopK), per token t, one warp each (_topk_select.make_gate_row):

1. mask given and mask[t] False: topk_idx -1, topk_weights 0, unmapped_topk_idx -1, scores 0.
2. force_random given and force_random[t]: P = K + S distinct random physical experts among N (the sum of the
   replica counts, or E + S without a map) and uniform weights in [0, 1), from a counter-based hash of
   (t, ep_rank, lane): lane l draws r_l in [0, N - l); in rounds of the smallest undecided (r, lane) that lane
   keeps r and every later undecided lane at or above it moves up one (the peer's rule; its curand draws are
   replaced by the hash, reproducible on both backends and in the reference). unmapped -1, scores 0.
3. Otherwise u = score(logits[t]) ('sqrtsoftplus', 'sigmoid', 'softmax': _scoring.py), written to `scores`
   when given; the ranking key is u + bias (image_bias for image tokens); with G > 1 groups of E / G experts only
   the TG groups with the largest sum of their two best keys compete; fix_routing_mask[t]: the K experts are
   unmapped_topk_idx[t] (an index outside 0..E-1 gives -1 and weight 0), else the stable top-K of the keys
   (NaN lowest, ties to the lower index). Weights: s * u_k / (sum_k u_k + 1e-20) with a non-finite u counted
   0; unmapped_topk_idx[t] = the K experts; shared slots K..K+S-1: experts E..E+S-1, weight 1; with a map each
   expert e >= 0 becomes to_physical_map[e, (ep_rank + t * 23333) % c], c = logical_count[e] clamped to 1..R.

Backends: CUDA, `rows` warps per thread block reading global memory (16-byte loads where E % 4 == 0 and the
logits are 16-byte aligned); Ascend
950, a persistent loop over blocks of rows on the vector cores, each block GM -> UB, a SIMT VF of 32 * rows
threads, UB -> GM. Absent optional tensors are (1,) placeholders the kernel never reads.

Limits: E <= 512, K <= 32 and K + S <= 32 (a lane per slot), S in 0..2, G divides E, G <= 32, K <= TG * E / G,
R (replicas) <= 16, T * E < 2**31.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._moe_topk_gate_ascend import ascend_moe_topk_gate_kernel
from ._moe_topk_gate_cuda import cuda_moe_topk_gate_kernel
from ._scoring import SCORING_FUNCS
from ._topk_select import WARP, lane_slots
from .moe_topk_kernel import CUDA_VECTOR, MAX_EXPERTS, MAX_TOPK, cuda_vector

MAX_SHARED_EXPERTS = 2
MAX_GROUPS = WARP  # a bit mask of the kept groups
MAX_REPLICAS = 16  # columns of to_physical_map: the map lives in UB on Ascend (514 x 16 int32: 32 KiB)
_CUDA_ROWS = 2  # warps (tokens) per thread block
_ASCEND_TILE_BYTES = 16 * 1024  # logits of one block of rows in UB (scores the same again, two versions each)
_ASCEND_MAX_ROWS = 32
FLAGS = ('has_mask', 'has_bias', 'has_image', 'has_fixed', 'has_unmapped', 'has_random', 'has_scores')


@dataclasses.dataclass(frozen=True)
class MoeTopkGateConfig:
    backend: Backend
    num_experts: int  # E, routed experts
    num_topk: int  # K
    num_shared_experts: int  # S (0 unless use_shared_as_routed)
    scoring_func: str
    num_groups: int  # G
    topk_groups: int  # TG
    replicas: int  # R, columns of to_physical_map; 0: no map
    has_mask: bool
    has_bias: bool
    has_image: bool  # image_bias and image_token_mask
    has_fixed: bool  # fix_routing_mask
    has_unmapped: bool
    has_random: bool  # force_random
    has_scores: bool
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational)
    rows: int  # tokens per CUDA thread block / Ascend block, one warp each
    vector: int  # consecutive experts per lane and chunk (CUDA 16-byte loads; Ascend 1)
    num_stages: int  # Ascend buffer versions (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        check_gate_sizes(
            'MoeTopkGateConfig', self.num_experts, self.num_topk, self.num_shared_experts, self.num_groups,
            self.topk_groups, self.replicas,
        )  # fmt: skip
        if self.scoring_func not in SCORING_FUNCS:
            raise ValueError(f'scoring_func must be one of {SCORING_FUNCS}, got {self.scoring_func!r}')
        if self.has_fixed and not self.has_unmapped:
            raise ValueError('has_fixed needs has_unmapped (the fixed experts are read from unmapped_topk_idx)')
        if self.num_cores < 1 or not 1 <= self.rows <= _ASCEND_MAX_ROWS:
            raise ValueError(f'num_cores must be >= 1 and rows in 1..{_ASCEND_MAX_ROWS}')
        if self.vector not in (1, CUDA_VECTOR) or self.num_experts % self.vector:
            raise ValueError(f'vector must be 1 or {CUDA_VECTOR} dividing num_experts, got {self.vector}')
        if self.backend == 'ascend' and (self.vector != 1 or self.num_stages < 1):
            raise ValueError('Ascend: vector must be 1 and num_stages >= 1')

    @property
    def slots(self) -> int:
        """Logits per lane."""
        return lane_slots(self.num_experts, self.vector)

    @property
    def num_physical_topk(self) -> int:
        return self.num_topk + self.num_shared_experts

    @property
    def num_logical_experts(self) -> int:
        return self.num_experts + self.num_shared_experts


def check_gate_sizes(name, num_experts, num_topk, num_shared_experts, num_groups, topk_groups, replicas) -> None:
    """The sizes the kernels take, else ValueError naming the constraint."""
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f'{name}: the number of routed experts must be in 1..{MAX_EXPERTS}, got {num_experts}')
    if not 0 <= num_shared_experts <= MAX_SHARED_EXPERTS:
        raise ValueError(f'{name}: num_shared_experts must be in 0..{MAX_SHARED_EXPERTS}, got {num_shared_experts}')
    if not 1 <= num_groups <= MAX_GROUPS or num_experts % num_groups:
        raise ValueError(
            f'{name}: num_groups must be in 1..{MAX_GROUPS} and divide the {num_experts} experts, got {num_groups}'
        )
    if not 1 <= topk_groups <= num_groups:
        raise ValueError(f'{name}: topk_groups must be in 1..num_groups ({num_groups}), got {topk_groups}')
    candidates = topk_groups * (num_experts // num_groups)
    if not 1 <= num_topk <= min(candidates, MAX_TOPK - num_shared_experts):
        raise ValueError(
            f'{name}: num_topk must be in 1..{min(candidates, MAX_TOPK - num_shared_experts)} (at most the '
            f'{candidates} experts of the kept groups, and num_topk + shared experts <= {MAX_TOPK}), got {num_topk}'
        )
    if not 0 <= replicas <= MAX_REPLICAS:
        raise ValueError(f'{name}: to_physical_map must have 1..{MAX_REPLICAS} columns, got {replicas}')


def choose_moe_topk_gate_config(
    *,
    backend: Backend,
    num_cores: int,
    num_experts: int,
    num_topk: int,
    num_shared_experts: int = 0,
    scoring_func: str = 'sqrtsoftplus',
    num_groups: int = 1,
    topk_groups: int = 1,
    replicas: int = 0,
    aligned: bool = True,
    **flags: bool,
) -> MoeTopkGateConfig:
    """Pure choice of the compile-time parameters (no device query); `flags`: FLAGS, each False by default.
    aligned: the logits' address is a multiple of 16 bytes (CUDA's vector loads)."""
    unknown = set(flags) - set(FLAGS)
    if unknown:
        raise ValueError(f'unknown flags {sorted(unknown)}; the flags are {FLAGS}')
    present = tuple(bool(flags.get(f, False)) for f in FLAGS)
    common = (backend, num_experts, num_topk, num_shared_experts, scoring_func, num_groups, topk_groups, replicas)
    check_gate_sizes('choose_moe_topk_gate_config', num_experts, num_topk, num_shared_experts, num_groups,
                     topk_groups, replicas)  # fmt: skip
    if backend == 'cuda':
        vector = cuda_vector(num_experts, aligned)
        return MoeTopkGateConfig(*common, *present, num_cores, _CUDA_ROWS, vector, 1)
    if backend == 'ascend':
        row_bytes = lane_slots(num_experts, 1) * WARP * 4
        rows = min(_ASCEND_MAX_ROWS, _ASCEND_TILE_BYTES // row_bytes)
        return MoeTopkGateConfig(*common, *present, num_cores, rows, 1, 2)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_moe_topk_gate_kernel(cfg: MoeTopkGateConfig):
    """The TileLang prim_func `moe_topk_gate_kernel` for `cfg.backend` (no compile). Arguments, in order:
    logits (T, E) fp32; bias (1, E) fp32; image_bias (1, E) fp32; image_token_mask, mask, fix_routing_mask,
    force_random (T,) bool; to_physical_map (1, (E + S) * R) int32; logical_count (1, E + S) int32;
    unmapped_topk_idx (T, K) int64; scores (T, E) fp32; topk_idx (T, K + S) int64; topk_weights (T, K + S)
    fp32; routed_scaling_factor fp32; ep_rank int32. An absent tensor is a (1,) or (1, 1) placeholder of its
    dtype, never read. T dynamic, >= 1."""
    if cfg.backend == 'ascend':
        return ascend_moe_topk_gate_kernel(cfg)
    return cuda_moe_topk_gate_kernel(cfg)


@functools.cache
def get_moe_topk_gate_kernel(cfg: MoeTopkGateConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_moe_topk_gate_kernel(cfg), cfg.backend)
