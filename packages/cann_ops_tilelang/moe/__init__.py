"""moe operators (scaffolded by `invoke new-op`: describe the domain here)."""

from .moe_normalize_weight import moe_normalize_weight
from .moe_topk import moe_topk
from .moe_topk_gate import moe_topk_gate
from .moe_topk_gate_backward import moe_topk_gate_backward

__all__ = ['moe_normalize_weight', 'moe_topk', 'moe_topk_gate', 'moe_topk_gate_backward']
