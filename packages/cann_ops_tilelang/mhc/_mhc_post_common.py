"""What mhc_post_fwd and mhc_post_bwd (and mhc_multilayer_recompute, their fusion) share: the contract's sizes,
the configurations' common fields and the Ascend tile model.

Shapes (the peer's, TileKernels 2.1.0): residual (S, T, M, H), x (S, T, H), post_layer_mix (S, T, M, 1),
comb_res_mix (S, T, M, M); the kernels see the N = S * T tokens as rows.
"""

from __future__ import annotations

MAX_MHC = 8  # branches (mhc_mult): the kernels keep M * M + M mix values per token on chip
HIDDEN_ALIGN = 64  # H: a whole number of 64-lane fp32 vectors (Ascend) and of 16-byte bf16 accesses (CUDA)
# int32 index arithmetic: the largest tensor, N * M * H elements, plus one CUDA block's overshoot, stays below 2**31.
MAX_ELEMENTS = 2**31 - 2**20
ASCEND_LANES = 64  # fp32 lanes of one 256-byte Ascend vector register
CUDA_VEC = 8  # bf16 elements of one 16-byte CUDA access


def check_stream_config(cfg) -> None:
    """The fields the streaming kernels' configurations share (ValueError): backend, mhc, hidden, num_cores, CUDA
    threads a block and the Ascend tile."""
    if cfg.backend not in ('ascend', 'cuda'):
        raise ValueError(f'backend must be "ascend" or "cuda", got {cfg.backend!r}')
    if not 1 <= cfg.mhc <= MAX_MHC:
        raise ValueError(f'mhc must be in 1..{MAX_MHC}, got {cfg.mhc}')
    if cfg.hidden < HIDDEN_ALIGN or cfg.hidden % HIDDEN_ALIGN:
        raise ValueError(f'hidden must be a positive multiple of {HIDDEN_ALIGN}, got {cfg.hidden}')
    if cfg.num_cores < 1:
        raise ValueError(f'num_cores must be >= 1, got {cfg.num_cores}')
    if cfg.threads % 32 or not 32 <= cfg.threads <= 1024:
        raise ValueError(f'threads must be a multiple of 32 in 32..1024, got {cfg.threads}')
    if cfg.tile % ASCEND_LANES or cfg.hidden % cfg.tile:
        raise ValueError(f'tile {cfg.tile} must be a multiple of {ASCEND_LANES} dividing hidden {cfg.hidden}')


def check_sizes(name: str, S: int, T: int, M: int, H: int) -> None:
    """ValueError for sizes the kernels do not take (the `limits` hook of both operators)."""
    if not 1 <= M <= MAX_MHC:
        raise ValueError(f'{name}: mhc_mult (residual.shape[2]) must be in 1..{MAX_MHC}, got {M}')
    if H < HIDDEN_ALIGN or H % HIDDEN_ALIGN:
        raise ValueError(f'{name}: hidden (residual.shape[3]) must be a positive multiple of {HIDDEN_ALIGN}, got {H}')
    if S * T * M * H > MAX_ELEMENTS:
        raise ValueError(f'{name}: residual must have at most {MAX_ELEMENTS} elements, got {S * T * M * H}')


def ascend_tile(hidden: int, bytes_per_column: int, budget: int) -> int:
    """The widest hidden tile (a multiple of 64 that divides H, so that no tile has a tail) whose UB buffers,
    `bytes_per_column` per column over every version, fit `budget` bytes."""
    units = hidden // ASCEND_LANES
    for k in range(units, 0, -1):
        if units % k == 0 and k * ASCEND_LANES * bytes_per_column <= budget:
            return k * ASCEND_LANES
    raise ValueError(f'no hidden tile of {hidden} fits {budget} bytes of UB')


def all_contiguous(*tensors) -> bool:
    """Whether every tensor is contiguous (the fast path's condition for its views)."""
    return all(t.is_contiguous() for t in tensors)


def as_rows(x, residual, post_layer_mix, comb_res_mix) -> tuple:
    """The kernels' views of (S, T, H), (S, T, M, H), (S, T, M, 1) and (S, T, M, M) tensors, or of their
    gradients: the S * T tokens as rows, (N, H), (N, M, H), (N, M), (N, M, M). Every tensor is contiguous."""
    _, _, mhc, hidden = residual.shape
    return (
        x.view(-1, hidden),
        residual.view(-1, mhc, hidden),
        post_layer_mix.view(-1, mhc),
        comb_res_mix.view(-1, mhc, mhc),
    )
