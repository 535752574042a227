"""What the configurations of the domain's kernels share: dtype names, tile widths, and the three modes of the
casts that have halves (per_token_cast, per_block_cast)."""

from __future__ import annotations

import torch

from ._scale_rules import UE8M0_PACK

# bf16 / fp32 as torch dtypes or their names -> the names the kernels take
FLOAT_DTYPE_NAMES = {torch.bfloat16: 'bfloat16', torch.float32: 'float32', 'bfloat16': 'bfloat16', 'float32': 'float32'}
MODES = ('cast', 'sf_only', 'precomputed')  # <op>, <op>_with_sf_only, <op>_with_precomputed_sf


def divisors(hidden: int, unit: int, limit: int) -> list[int]:
    """Multiples of `unit` that divide `hidden` and do not exceed max(limit, unit), largest first (never empty:
    `unit` when it divides `hidden`, which the configurations check first)."""
    return [b for b in range(min(hidden, max(limit, unit)) // unit * unit, 0, -unit) if hidden % b == 0]


class CastModes:
    """Properties of a configuration with a `mode` field (one of MODES)."""

    mode: str

    @property
    def writes_data(self) -> bool:
        """Whether the kernel writes the fp8 data (not in 'sf_only')."""
        return self.mode != 'sf_only'

    @property
    def computes_sf(self) -> bool:
        """Whether the kernel computes (and writes) the scales (not in 'precomputed', which reads them)."""
        return self.mode != 'precomputed'


class RowScales:
    """Properties of a configuration whose scales are rows of channel blocks, fp32 or UE8M0 bytes padded to whole
    int32 words (per_token_cast, per_block_cast, norm_forward_and_per_token_cast): from its fields hidden, block_k,
    packed_ue8m0 and its `block_channels` (channels per scale)."""

    hidden: int
    block_k: int
    packed_ue8m0: bool
    block_channels: int

    @property
    def num_blocks(self) -> int:
        """Scale factors per scale row; a short last block (H not a multiple of the block) has one too."""
        return -(-self.hidden // self.block_channels)

    @property
    def short_block(self) -> bool:
        """Whether the last block of a row is short: H = 64 * odd with 128-channel blocks (per_token_cast)."""
        return self.hidden % self.block_channels != 0

    @property
    def blocked_hidden(self) -> int:
        """H rounded up to whole blocks: the columns the tiles cover (the short block's missing channels count as
        zeros in its maximum, and are never stored)."""
        return self.num_blocks * self.block_channels

    @property
    def groups_per_tile(self) -> int:
        """Scale factors per task / thread block."""
        return self.block_k // self.block_channels

    @property
    def num_col_tiles(self) -> int:
        """Column tiles of a row: whole ones, and with a short block the last may reach past H (CUDA)."""
        return -(-self.hidden // self.block_k)

    @property
    def sf_pack(self) -> int:
        return UE8M0_PACK if self.packed_ue8m0 else 1

    @property
    def sf_cols(self) -> int:
        """Elements of one scale row: fp32 scales, or UE8M0 bytes padded to the pack factor."""
        return -(-self.num_blocks // self.sf_pack) * self.sf_pack

    @property
    def sf_padding(self) -> int:
        """Zero bytes after the last UE8M0 byte of a row."""
        return self.sf_cols - self.num_blocks

    @property
    def sf_dtype(self) -> str:
        return 'uint8' if self.packed_ue8m0 else 'float32'


class CastFormats:
    """Properties of a cast configuration from its fields fmt ('e4m3', or 'e2m1': FP4 packed two to a byte),
    e4m3_sf and hidden, for a RowScales configuration (per_token_cast, per_block_cast): list it before RowScales."""

    fmt: str
    e4m3_sf: bool
    hidden: int

    @property
    def sf_dtype(self) -> str:
        """fp32 scales, UE8M0 bytes, or e4m3 bytes."""
        return 'float8_e4m3fn' if self.e4m3_sf else RowScales.sf_dtype.fget(self)

    @property
    def fp4(self) -> bool:
        return self.fmt == 'e2m1'

    @property
    def data_cols(self) -> int:
        """Elements (e4m3) or bytes (FP4, two elements each) of one data row."""
        return self.hidden // 2 if self.fp4 else self.hidden

    @property
    def data_dtype(self) -> str:
        return 'int8' if self.fp4 else 'float8_e4m3fn'
