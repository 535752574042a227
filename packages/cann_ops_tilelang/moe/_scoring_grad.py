"""The MoE router's shared math, on both backends: the guard of the routed weights' denominator and the
scoring functions' derivatives recovered from their outputs (used by moe_topk_gate_backward).

Each scoring function s maps a logit l to a score u = s(l); the backward gets u, not l, so each derivative is
written in u:

    'sqrtsoftplus'  u = sqrt(log(1 + exp(l)))   du/dl = sigmoid(l) / (2 u) = (1 - exp(-u^2)) / (2 u)
    'sigmoid'       u = 1 / (1 + exp(-l))        du/dl = u (1 - u)
    'softmax'       u = softmax(l) over a row    dl = u * (du - <du, u>)   (a row reduction: the kernels do it)

For sqrtsoftplus, 1 - exp(-x) with x = u^2 loses relative accuracy as x -> 0 (cancellation: about 2**-24 / x),
so below SQRTSOFTPLUS_SERIES_LIMIT the kernels use the Taylor series of (1 - exp(-x)) / x, whose n-th
coefficient is (-1)**n / (n + 1)!: with SERIES_TERMS terms its truncation error at x = 0.5 is below
0.5**9 / 10! ~ 5e-10 relative, far under fp32's 6e-8, and the direct form's cancellation error at x = 0.5 is
about 2 ulp. u = 0 gives 0 (the series' u / 2 factor), u = inf gives 0, NaN stays NaN.
"""

# No `from __future__ import annotations`: the macros below are TileLang code.

import math


def reads_scores_row(aux: bool, scoring_func: str) -> bool:
    """Whether the backward needs every score of a token: the aux term's and softmax's row sums. Otherwise
    dL/dl is zero wherever dL/du is, so an expert that no slot names gets exactly 0 whatever its score (the
    CUDA kernel reads only the slots' scores; the Ascend kernel, which loads the row, masks the others out)."""
    return aux or scoring_func == 'softmax'


SQRTSOFTPLUS_SERIES_LIMIT = 0.5  # x = u^2 below this: the series, else the direct form
SERIES_TERMS = 9
# (1 - exp(-x)) / x = sum_n c_n x^n, c_n = (-1)^n / (n + 1)!, highest degree first (Horner order).
SERIES_COEFFS = tuple((-1) ** n / math.factorial(n + 1) for n in reversed(range(SERIES_TERMS)))


def cuda_sqrtsoftplus_grad():
    """A TileLang CUDA macro: du/dl of sqrtsoftplus from u (fp32 scalar expression)."""
    import tilelang.language as T

    @T.macro
    def sqrtsoftplus_grad(u):
        x = u * u
        series = T.float32(SERIES_COEFFS[0])
        for c in SERIES_COEFFS[1:]:  # Horner, unrolled in Python: one expression
            series = series * x + T.float32(c)
        # __expf and __fdividef, not IEEE expf and division: the backward with the aux term evaluates this at every
        # expert. 2 ulp each near x = 0.5, where 1 - exp(-x) amplifies exp's error 1.5 times (less above): about
        # 6 ulp at worst. A divisor past 2**126 gives 0: u = inf -> 0 as documented.
        direct = T.call_extern(
            T.float32, '__fdividef', T.float32(1.0) - T.call_extern(T.float32, '__expf', -x), T.float32(2.0) * u
        )
        return T.if_then_else(x < T.float32(SQRTSOFTPLUS_SERIES_LIMIT), series * (T.float32(0.5) * u), direct)

    return sqrtsoftplus_grad


def ascend_sqrtsoftplus_grad():
    """A TileLang Ascend SIMD macro: du/dl of sqrtsoftplus from the fp32 register u."""
    import tilelang.ascend.language as T

    S = T.simd

    @T.macro
    def sqrtsoftplus_grad(u):
        x = S.vmul(u, u)
        series = S.alloc_var(T.float32)
        series = S.vdup(SERIES_COEFFS[0], T.float32)
        for c in SERIES_COEFFS[1:]:
            S.vmadd(series, x, S.vdup(c, T.float32))  # series = series * x + c, one rounding
        small = S.vmul(series, S.vmuls(u, 0.5))
        direct = S.vdiv(S.vsub(S.vdup(1.0, T.float32), S.vexp(S.vneg(x))), S.vmuls(u, 2.0))
        return S.vsel(small, direct, S.vcmps(x, SQRTSOFTPLUS_SERIES_LIMIT, op='lt'))

    return sqrtsoftplus_grad
