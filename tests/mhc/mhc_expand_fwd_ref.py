"""PyTorch reference of mhc_expand_fwd: the correctness oracle of its tests (never imported by runtime code)."""

import torch


def mhc_expand_fwd_ref(x: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    """o[t, m, h] = x[t, h]: x (T, H) repeated onto mhc_mult streams, (T, mhc_mult, H) in x's dtype (exact in any
    dtype; float64 for the gradient checks)."""
    return x.unsqueeze(-2).expand(*x.shape[:-1], mhc_mult, x.shape[-1]).contiguous()
