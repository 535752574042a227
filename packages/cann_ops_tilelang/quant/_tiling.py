"""What the configurations of the domain's kernels share: dtype names, tile widths, and the three modes of the
casts that have halves (per_token_cast, per_block_cast)."""

from __future__ import annotations

import torch

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
