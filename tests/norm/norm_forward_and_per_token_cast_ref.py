"""PyTorch reference of norm_forward_and_per_token_cast (tests only): norm_forward_ref's output, rounded to x's
dtype, cast by the quant domain's per_token_cast reference (tests/quant/cast_ref.py)."""

from tests.quant.cast_ref import per_token_cast_format_ref

from .norm_forward_ref import norm_forward_ref


def norm_forward_and_per_token_cast_ref(x, weight, eps, num_per_channels, residual=None, out_scale=1.0,
                                        round_sf=False, use_packed_ue8m0=False):  # fmt: skip
    """((data, sf), y, rstd, norm_input): y norm_forward_ref's out."""
    y, rstd, norm_input = norm_forward_ref(x, weight, eps, residual, out_scale)
    cast = per_token_cast_format_ref(y, num_per_channels, 'e4m3', round_sf=round_sf, packed_ue8m0=use_packed_ue8m0)
    return cast, y, rstd, norm_input
