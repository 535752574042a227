"""Facts the streaming mHC operators share (mhc_expand_fwd/_bwd, mhc_pre_apply_mix_fwd/_bwd): the sizes their
kernels take, the contract check that follows from them and the tiling of a token's hidden row.

Imported by the operators, the kernel modules and the backend bodies (never the other way round)."""

from __future__ import annotations

MAX_MHC_MULT = 8  # streams per token the kernels are built for: mhc_mult = 1 .. 8
# One Ascend vector register holds 64 fp32 lanes (a bf16 chunk widened); hidden is a whole number of them,
# which also makes every CUDA row 128 bytes long (16-byte accesses throughout).
HIDDEN_MULTIPLE = 64
# int32 indexing: every element index of the (T, mhc_mult, H) tensor, plus one tile of tokens past T, stays
# below 2**31.
MAX_ELEMENTS = 2**30
ASCEND_LANES = 64  # fp32 lanes of one 256-byte Ascend vector register
ASCEND_UB_BUDGET = 192 * 1024  # UB bytes the tiles of one kernel may take (all buffer versions), of 248 KB
ASCEND_STAGES = 2  # buffer versions: the next task's loads overlap this one's work and stores
CUDA_VECTOR = 8  # bf16 elements of one 16-byte access
CUDA_MAX_HIDDEN_BLOCK = 1024
# The CUDA tiles of the expand kernels (between (T, H) and (T, mhc_mult, H), no reduction over H): 4096 (T, H)
# elements per thread block of 256 threads, 16 bytes per thread twice per stream, so that a block keeps 8 KB (one
# stream) to mhc_mult * 8 KB of loads in flight. pre_apply_mix_fwd takes tiles of its own size (cuda_tile's
# `elements`).
CUDA_TILE_ELEMENTS = 4096
CUDA_TILE_THREADS = 256


def check_sizes(name: str, T: int, mhc: int, H: int) -> None:
    """The sizes every operator of the family takes (T: tokens, mhc: mhc_mult, H: hidden)."""
    if not 1 <= mhc <= MAX_MHC_MULT:
        raise ValueError(f'{name}: mhc_mult must be in [1, {MAX_MHC_MULT}], got {mhc}')
    if H < HIDDEN_MULTIPLE or H % HIDDEN_MULTIPLE:
        raise ValueError(f'{name}: hidden must be a positive multiple of {HIDDEN_MULTIPLE}, got {H}')
    if T * mhc * H > MAX_ELEMENTS:
        raise ValueError(
            f'{name}: tokens * mhc_mult * hidden must be at most {MAX_ELEMENTS} (int32 indices), got {T * mhc * H}'
        )


def hidden_block(hidden: int, cap: int) -> int:
    """The widest block of a hidden row that divides it into equal blocks: the largest multiple of
    HIDDEN_MULTIPLE up to `cap` (at least HIDDEN_MULTIPLE) that divides `hidden`."""
    block = max(HIDDEN_MULTIPLE, min(hidden, cap) // HIDDEN_MULTIPLE * HIDDEN_MULTIPLE)
    while hidden % block:
        block -= HIDDEN_MULTIPLE
    return block


def cuda_hidden_block(hidden: int, cap: int) -> int:
    """The CUDA hidden block: the largest power of two up to `cap` that divides `hidden` (at least
    HIDDEN_MULTIPLE), so that a thread block's threads tile it in whole 16-byte vectors."""
    block = HIDDEN_MULTIPLE
    while block * 2 <= cap and hidden % (block * 2) == 0:
        block *= 2
    return block


def cuda_tile(hidden: int, elements: int = CUDA_TILE_ELEMENTS) -> tuple[int, int]:
    """(hidden_block, token_block) of a CUDA tile of `elements`: a power-of-two hidden block of up to
    CUDA_MAX_HIDDEN_BLOCK columns by as many tokens (one at least) as make up the rest."""
    block = cuda_hidden_block(hidden, CUDA_MAX_HIDDEN_BLOCK)
    return block, max(1, elements // block)


def ascend_hidden_block(hidden: int, bytes_per_column: int, stages: int) -> int:
    """The Ascend hidden block: as wide as the UB budget allows for `stages` versions of tiles that take
    `bytes_per_column` bytes per hidden column."""
    return hidden_block(hidden, ASCEND_UB_BUDGET // (stages * bytes_per_column))


def check_config(cfg, directions: tuple[str, ...]) -> None:
    """The checks the family's kernel configurations share (fields backend, direction, mhc, hidden, hidden_block,
    num_cores, token_block, num_stages): ValueError naming the field."""
    if cfg.backend not in ('ascend', 'cuda'):
        raise ValueError(f'backend must be "ascend" or "cuda", got {cfg.backend!r}')
    if cfg.direction not in directions:
        raise ValueError(f'direction must be one of {directions}, got {cfg.direction!r}')
    if not 1 <= cfg.mhc <= MAX_MHC_MULT:
        raise ValueError(f'mhc must be in [1, {MAX_MHC_MULT}], got {cfg.mhc}')
    if cfg.hidden < HIDDEN_MULTIPLE or cfg.hidden % HIDDEN_MULTIPLE:
        raise ValueError(f'hidden must be a positive multiple of {HIDDEN_MULTIPLE}, got {cfg.hidden}')
    if cfg.hidden_block % HIDDEN_MULTIPLE or cfg.hidden % cfg.hidden_block:
        raise ValueError(f'hidden_block {cfg.hidden_block} must be a multiple of 64 dividing {cfg.hidden}')
    if cfg.num_cores < 1 or cfg.token_block < 1 or cfg.num_stages < 1:
        raise ValueError(f'num_cores, token_block and num_stages must be >= 1: {cfg}')
