"""Pure-PyTorch oracles of engram_sinkhorn_momentum_update (docs/engram.md). Tests only; never imported
at run time."""

from __future__ import annotations

from typing import NamedTuple

import torch


def engram_sinkhorn_momentum_update_ref(
    grad: torch.Tensor, momentum_buffer: torch.Tensor, beta1: float, nesterov: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The spec's formula in fp32 torch, as the reference library writes it: (sinkhorn_input fp32, the new
    momentum in the buffer's dtype). The inputs are not modified."""
    g = grad.float()
    m = momentum_buffer.float()
    m_new = beta1 * m + (1 - beta1) * g
    out = beta1 * m_new + (1 - beta1) * g if nesterov else m_new
    return out, m_new.to(momentum_buffer.dtype)


class MomentumOracle(NamedTuple):
    momentum: torch.Tensor  # fp64: beta1 * m + s, exact up to fp64 rounding
    lookahead: torch.Tensor  # fp64: beta1 * momentum + s
    beta1: float  # the fp32 value of beta1 the kernels use


def engram_sinkhorn_momentum_update_oracle(
    grad: torch.Tensor, momentum_buffer: torch.Tensor, beta1: float
) -> MomentumOracle:
    """fp64 values of the kernels' fp32 formula before its final roundings.

    The kernels take beta1 and 1 - beta1 (computed in double, then rounded) as fp32 scalars and form
    s = fl32((1 - beta1) * g) first; that one rounding is replayed here in fp32, everything after it is
    carried exactly in fp64 (a product of two fp32 values fits in fp64)."""
    b32 = torch.tensor(beta1, dtype=torch.float32)
    omb32 = torch.tensor(1.0 - beta1, dtype=torch.float32)
    s = (omb32.to(grad.device) * grad.float()).double()
    b = float(b32)
    momentum = b * momentum_buffer.double() + s
    return MomentumOracle(momentum, b * momentum + s, b)
