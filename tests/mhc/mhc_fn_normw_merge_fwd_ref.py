"""PyTorch reference of mhc_fn_normw_merge_fwd: the correctness oracle of its tests (never imported by runtime
code)."""

import torch


def mhc_fn_normw_merge_fwd_ref(fn: torch.Tensor, normw: torch.Tensor) -> torch.Tensor:
    """out_fn = fn * normw (normw along fn's columns), in float64: the product of two fp32 numbers is exact
    there, so rounding it to fp32 gives the kernels' correctly rounded product bit for bit."""
    return fn.double() * normw.double()
