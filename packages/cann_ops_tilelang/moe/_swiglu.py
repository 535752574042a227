"""SwiGLU math and the MoE expert layout, shared by moe_swiglu_forward* and moe_swiglu_backward* (one home).

x (T, 2 I) holds [gate | up] per row (TileKernels 2.1.0's layout: gate = x[:, :I], up = x[:, I:]). With a clamp
value c: gate = min(gate, c), up = min(max(up, -c), c), counted before the clamp as gate > c, up > c and up < -c.
Then, in fp32 (bf16 widens exactly), y = gate / (1 + exp(-gate)) * up (silu(gate) * up), times the row's
weight w = fp32(topk_weights[t] * routed_scaling_factor) where weights are given.

The expert layout (TileKernels' `psum_num_tokens_per_expert`, E int32 values, non-decreasing): expert e owns rows
[align(psum[e - 1]), psum[e]) with psum[-1] = 0 and align(p) = p rounded up to TOKEN_ALIGNMENT; the other rows
(each expert's alignment padding, and rows from psum[E - 1] on) are padding. Row t belongs to the first expert e
with psum[e] > t when t >= align(psum[e - 1]).

The functions build expressions (CUDA) or SIMD macros (Ascend) inside a kernel generator; they import nothing at
module level, so importing the domain compiles nothing.
"""

# No `from __future__ import annotations`: TileLang evaluates the macros' annotations.

TOKEN_ALIGNMENT = 128  # rows per expert block of the layout (TileKernels' default `get_token_alignment()`)
CLAMP_COUNTERS = 4  # clamped_count: gate > c, up > c, up < -c, elements of the rows that are not padding


def align_rows(rows, alignment: int = TOKEN_ALIGNMENT):
    """`rows` rounded up to a multiple of `alignment` (ints or PrimExprs)."""
    return (rows + (alignment - 1)) // alignment * alignment


def cuda_swiglu(T, gate, up, clamp_value=None):
    """y = silu(gate) * up of two fp32 PrimExprs, clamped first when `clamp_value` (an fp32 PrimExpr) is given."""
    if clamp_value is not None:
        gate = T.min(gate, clamp_value)
        up = T.max(T.min(up, clamp_value), -clamp_value)
    return gate / (T.float32(1.0) + T.exp(-gate)) * up


def ascend_swiglu_macro(T, *, clamp: bool):
    """A SIMD macro `swiglu(gate, up, clamp_value)` of two fp32 registers: y = silu(gate) * up, each input clamped
    first with `clamp` (clamp_value a scalar; unused without)."""
    S = T.simd

    @T.macro
    def swiglu(gate, up, clamp_value):
        if clamp:
            gate = S.vmins(gate, clamp_value)
            up = S.vmaxs(S.vmins(up, clamp_value), -clamp_value)
        denominator = S.vadds(S.vexp(S.vneg(gate)), 1.0)
        return S.vmul(S.vdiv(gate, denominator), up)

    return swiglu
