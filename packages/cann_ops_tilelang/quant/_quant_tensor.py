"""The result of the quantisation operators: data and its scale factors."""

from __future__ import annotations

from typing import NamedTuple

import torch


class QuantTensor(NamedTuple):
    """A tuple (data, sf), as TileKernels 2.1.0 returns it: x ~ data * sf, sf broadcast over each block."""

    data: torch.Tensor  # the narrow format (float8_e4m3fn)
    sf: torch.Tensor  # fp32 scale per block, or UE8M0 exponent bytes packed four per int32
