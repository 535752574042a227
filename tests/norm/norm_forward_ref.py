"""PyTorch reference of norm_forward: the correctness oracle of its tests, in float64, never imported by runtime
code. TileKernels 2.1.0's grouping of the math."""


def norm_forward_ref(x, weight, eps, residual=None, out_scale=1.0):
    """(out, rstd, norm_input): r = x + residual rounded to x's dtype (x without residual), rstd = 1 / sqrt(mean(r
    * r) + eps), out = r * rstd * (weight * out_scale) rounded to x's dtype; rstd in float64."""
    norm_input = x if residual is None else (x.double() + residual.double()).to(x.dtype)
    r = norm_input.double()
    rstd = (r.square().sum(dim=-1) / x.shape[-1] + eps).rsqrt()
    scale = (weight.double() if weight is not None else 1.0) * out_scale
    return (r * rstd[:, None] * scale).to(x.dtype), rstd, norm_input
