"""MoE routing: top-k gating forward and backward, stable top-k, weight normalisation (exported from the root
package), and the SwiGLU activation over the expert layout with its FP8 casts (experimental: `moe.moe_swiglu_*`)."""

from .moe_normalize_weight import moe_normalize_weight
from .moe_swiglu_backward import moe_swiglu_backward
from .moe_swiglu_backward_and_per_token_cast import moe_swiglu_backward_and_per_token_cast
from .moe_swiglu_forward import moe_swiglu_forward
from .moe_swiglu_forward_and_per_token_cast import moe_swiglu_forward_and_per_token_cast
from .moe_topk import moe_topk
from .moe_topk_gate import moe_topk_gate
from .moe_topk_gate_backward import moe_topk_gate_backward

__all__ = [
    'moe_normalize_weight',
    'moe_swiglu_backward',
    'moe_swiglu_backward_and_per_token_cast',
    'moe_swiglu_forward',
    'moe_swiglu_forward_and_per_token_cast',
    'moe_topk',
    'moe_topk_gate',
    'moe_topk_gate_backward',
]
