"""Pure-PyTorch reference of engram_sinkhorn_step_reduce (docs/engram.md). Tests only; never imported
at run time."""

from __future__ import annotations

import torch


def engram_sinkhorn_step_reduce_ref(col_sumsq_partial: torch.Tensor) -> torch.Tensor:
    """The column sums in fp64 (the oracle)."""
    return col_sumsq_partial.double().sum(0)


def engram_sinkhorn_step_reduce_ordered(col_sumsq_partial: torch.Tensor, num_segments: int) -> torch.Tensor:
    """The kernels' fp32 summation order, replayed addition by addition (each torch fp32 add rounds once).

    P rows in `num_segments` consecutive segments of ceil(P / num_segments) rows; each segment summed
    from +0.0 in row order; the segment sums added in segment order."""
    num_partials, head_dim = col_sumsq_partial.shape
    seg_len = -(-num_partials // num_segments)
    zero = torch.zeros(head_dim, dtype=torch.float32, device=col_sumsq_partial.device)
    total = None
    for s in range(num_segments):
        acc = zero.clone()
        for p in range(s * seg_len, min((s + 1) * seg_len, num_partials)):
            acc = acc + col_sumsq_partial[p]
        total = acc if total is None else total + acc
    return total
