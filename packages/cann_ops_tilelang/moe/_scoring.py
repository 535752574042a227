"""The gate's scoring functions u = score(logit), per element, for both backends (`T` is the language module).

- 'sqrtsoftplus' (TileKernels' only one): u = sqrt(softplus(x)), softplus(x) = max(x, 0) + log1p(exp(-|x|)),
  a form that neither overflows nor loses the small tail; -inf -> 0, +inf -> inf, NaN -> NaN.
- 'sigmoid' (DeepSeek-V3): u = 1 / (1 + exp(-x)); -inf -> 0, +inf -> 1, NaN -> NaN.
- 'softmax' (Mixtral, Qwen-MoE): u = exp(x - m) / sum(exp(x - m)) over the row, m the row's largest non-NaN
  logit (NaN when every logit is NaN). It needs the row, so the gate's row routine computes it with warp
  reductions (_topk_select.make_gate_row); IEEE rules then give NaN for a NaN logit and for a row whose m is
  +-inf.
"""

# No `from __future__ import annotations`: TileLang evaluates the macros' annotations.

SCORING_FUNCS = ('sqrtsoftplus', 'sigmoid', 'softmax')
# Added to the sum of a token's top-k scores or weights before dividing by it (TileKernels' kernels do the same):
# an all-zero row gives weights 0 instead of 0 / 0. The gate, its backward and moe_normalize_weight share it.
WEIGHT_SUM_EPS = 1e-20


def make_elementwise_scoring(T, scoring_func: str):
    """The macro u = score(x) of an element-wise scoring function ('softmax' is a row operation: None)."""

    @T.macro
    def sqrtsoftplus(x):
        return T.sqrt(T.max(x, T.float32(0.0)) + T.log1p(T.exp(-T.abs(x))))

    @T.macro
    def sigmoid(x):
        return T.float32(1.0) / (T.float32(1.0) + T.exp(-x))

    return {'sqrtsoftplus': sqrtsoftplus, 'sigmoid': sigmoid, 'softmax': None}[scoring_func]
