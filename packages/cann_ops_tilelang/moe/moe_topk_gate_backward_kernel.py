"""Kernels of moe_topk_gate_backward: the gradient of the router's logits from the gradient of its top-k weights.

Per token t, with u = scores[t] (the forward's scoring output), slot k naming expert idx_k (valid where 0 <= idx_k
< E: -1 and any other index is a masked slot that contributes nothing), g = grad_topk_weights[t], w =
topk_weights[t], s = routed_scaling_factor, all in fp32:

    D = (sum over valid k of u[idx_k], in slot order) + 1e-20
    <g, w> = sum over valid k of g_k * w_k, in slot order
    delta_k = (s * g_k - <g, w>) / D                       (the gradient of w_k = s * u[idx_k] / D)
    du[e] = sum over valid k with idx_k == e of delta_k, in slot order, from +0 (duplicates add up)
    aux (grad_scores_sum h, mask): where mask[t], du += h[seq] / sum(u) - (<h[seq], u> / sum(u)) / sum(u),
        seq = t // (T / S), with 1 / sum(u) one division
    grad_logits = du * u'(scoring_func) (_scoring_grad.py); softmax: u * (du - <du, u>)
    without the aux term, for sqrtsoftplus and sigmoid: exactly 0 where no slot names the expert (reads_scores_row)

No atomics: the same inputs give the same bits run to run, and the route term (D, <g, w>, delta, du before the aux
term) has the same operation order on both backends (the compilers may still fuse a multiply-add differently:
equal to a few ulp, not promised bit for bit); the row sums over the experts (aux, softmax) are trees of each
backend's own shape. Supported: E in 1..512 (MAX_EXPERTS), K in 1..min(E, 64) (MAX_TOPK), T * E < 2**31
(int32 indices; the interface checks), T dynamic (`T.dynamic`), T >= 1 per launch, S dynamic.
"""

import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import CUDA_MAX_THREADS_PER_SM, CUDA_REGS_PER_SM, compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._moe_topk_gate_backward_ascend import ascend_moe_topk_gate_backward_kernel, ascend_row_bytes
from ._moe_topk_gate_backward_cuda import WARP, cuda_moe_topk_gate_backward_kernel, cuda_row_floats
from ._scoring import SCORING_FUNCS  # the forward's (moe_topk_gate) scoring functions

MAX_EXPERTS = 512  # the issue's range; the Ascend tile's UB rows and the CUDA lanes' registers are sized for it
MAX_TOPK = 64  # slot arrays per token (UB / shared memory) and the CUDA kernel's unrolled slot loop
_ASCEND_UB_BUDGET = 160 * 1024  # of the 248 KB UB, for all buffer versions of a tile
_ASCEND_MAX_ROWS = 32
_ASCEND_STAGES = 2
_CUDA_WARPS = 4  # tokens (one warp each) per thread block
_CUDA_REGS_BESIDES_ROW = 16  # a lane's registers other than its share of the row (addresses, sums, the slot loop)


@dataclasses.dataclass(frozen=True)
class MoeTopkGateBackwardConfig:
    backend: Backend
    num_experts: int  # E
    num_topk: int  # K
    scoring_func: str  # 'sqrtsoftplus', 'sigmoid' or 'softmax'
    aux: bool  # with the aux-loss term (mask and grad_scores_sum)
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational)
    block_rows: int  # Ascend: tokens per task (one UB tile); CUDA: tokens (warps) per thread block
    num_stages: int  # Ascend buffer versions of the persistent loop (1 on CUDA)
    vector: int  # CUDA: consecutive experts per lane access (4, 2 or 1: what E allows); 1 on Ascend
    min_blocks: int = 0  # CUDA: thread blocks per SM that ptxas must fit (a register cap); 0: no cap

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if not 1 <= self.num_experts <= MAX_EXPERTS:
            raise ValueError(f'num_experts must be in 1..{MAX_EXPERTS}, got {self.num_experts}')
        if not 1 <= self.num_topk <= min(self.num_experts, MAX_TOPK):
            raise ValueError(f'num_topk must be in 1..min(num_experts, {MAX_TOPK}), got {self.num_topk}')
        if self.scoring_func not in SCORING_FUNCS:
            raise ValueError(f'scoring_func must be one of {SCORING_FUNCS}, got {self.scoring_func!r}')
        if self.num_cores < 1 or self.block_rows < 1 or self.num_stages < 1:
            raise ValueError('num_cores, block_rows and num_stages must be >= 1')
        if self.vector not in (1, 2, 4) or self.num_experts % self.vector:
            raise ValueError(f'vector must be 1, 2 or 4 and divide num_experts, got {self.vector}')
        if self.backend == 'ascend' and (
            self.vector != 1
            or self.num_stages * self.block_rows * ascend_row_bytes(self.num_experts, self.num_topk, self.aux)
            > _ASCEND_UB_BUDGET
        ):
            raise ValueError(f'Ascend tile of {self.block_rows} rows exceeds the UB budget (or vector != 1)')


def choose_moe_topk_gate_backward_config(
    *, backend: Backend, num_cores: int, num_experts: int, num_topk: int, scoring_func: str, aux: bool
) -> MoeTopkGateBackwardConfig:
    """Pure choice of the compile-time parameters (no device query)."""
    common = (num_experts, num_topk, scoring_func, aux, num_cores)
    if backend == 'ascend':
        per_row = _ASCEND_STAGES * ascend_row_bytes(num_experts, num_topk, aux)
        rows = min(_ASCEND_MAX_ROWS, 1 << (_ASCEND_UB_BUDGET // per_row).bit_length() - 1)
        return MoeTopkGateBackwardConfig(backend, *common, rows, _ASCEND_STAGES, 1)
    vector = next(v for v in (4, 2, 1) if num_experts % v == 0)
    # The kernel is latency-bound (one token per warp): as many warps per SM as the lanes' share of the row
    # leaves registers for, capped so that ptxas fits them (allocation granularity 8).
    threads = _CUDA_WARPS * WARP
    regs = -(-(cuda_row_floats(num_experts, vector, scoring_func, aux) + _CUDA_REGS_BESIDES_ROW) // 8) * 8
    min_blocks = min(CUDA_MAX_THREADS_PER_SM // threads, CUDA_REGS_PER_SM // (threads * regs))
    return MoeTopkGateBackwardConfig(backend, *common, _CUDA_WARPS, 1, vector, min_blocks)


def make_moe_topk_gate_backward_kernel(cfg: MoeTopkGateBackwardConfig):
    """The TileLang prim_func `moe_topk_gate_backward_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_moe_topk_gate_backward_kernel(cfg)
    return cuda_moe_topk_gate_backward_kernel(cfg)


@functools.cache
def get_moe_topk_gate_backward_kernel(cfg: MoeTopkGateBackwardConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_moe_topk_gate_backward_kernel(cfg), cfg.backend)
