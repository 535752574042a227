"""PyTorch reference of norm_backward, in float64 (tests only), and the forward as a differentiable function
for the autograd check."""


def norm_backward_ref(out_grad, x, weight, rstd, residual_out_grad=None, out_scale=1.0):
    """(x_grad, weight_grad) in float64, from the formulas (the tests also check them against autograd of
    norm_forward_math)."""
    xhat = x.double() * rstd.double()[:, None]
    g = out_grad.double() * out_scale
    gw = g * (weight.double() if weight is not None else 1.0)
    x_grad = (gw - xhat * (xhat * gw).sum(dim=-1, keepdim=True) / x.shape[-1]) * rstd.double()[:, None]
    if residual_out_grad is not None:
        x_grad = x_grad + residual_out_grad.double()
    return x_grad, (xhat * g).sum(dim=0) if weight is not None else None


def norm_forward_math(r, weight, eps, out_scale=1.0):
    """The forward as a differentiable float64 function of the norm input r and the weight (autograd's view)."""
    rstd = (r.square().sum(dim=-1, keepdim=True) / r.shape[-1] + eps).rsqrt()
    return r * rstd * ((weight if weight is not None else 1.0) * out_scale)
