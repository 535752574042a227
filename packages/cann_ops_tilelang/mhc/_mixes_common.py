"""Facts the mix operators share (mhc_head_compute_mix_fwd/_bwd, mhc_pre_split_mixes_fwd/_bwd): the widths
of a token's mix row, the sizes the kernels take and the contract checks that follow from them."""

from __future__ import annotations

MAX_MHC_MULT = 8  # the widest mHC the kernels are built for: M = 1 .. 8
# int32 indexing: every element index of a (tokens, width) tensor, plus one token tile, stays below 2**31.
MAX_ELEMENTS = 2**30
MAX_TOKEN_BLOCK = 64  # tokens per tile: the Ascend backward's six (tile, M * (M + 2)) fp32 UB buffers fit
MAX_PARTIALS = 4096  # partial-gradient rows (mhc_head_compute_mix_bwd's num_sms): one worker each


def split_width(mhc_mult: int) -> int:
    """Columns of a token's input_mixes row: M pre, M post and M * M comb logits."""
    return mhc_mult * (mhc_mult + 2)


def check_mhc_mult(name: str, mhc_mult: int, what: str) -> None:
    if not 1 <= mhc_mult <= MAX_MHC_MULT:
        raise ValueError(f'{name}: mhc_mult ({what}) must be in [1, {MAX_MHC_MULT}], got {mhc_mult}')


def check_elements(name: str, label: str, num_tokens: int, width: int) -> None:
    if num_tokens * width > MAX_ELEMENTS:
        raise ValueError(
            f'{name}: {label} must have at most {MAX_ELEMENTS} elements (int32 indices), got {num_tokens * width}'
        )


def check_token_block_size(name: str, token_block_size: int) -> None:
    """0 (the operator chooses) or a power of two up to MAX_TOKEN_BLOCK."""
    if token_block_size != 0 and (
        not 1 <= token_block_size <= MAX_TOKEN_BLOCK or token_block_size & (token_block_size - 1)
    ):
        raise ValueError(
            f'{name}: token_block_size must be 0 (chosen) or a power of two in [1, {MAX_TOKEN_BLOCK}], '
            f'got {token_block_size}'
        )
