"""TileLang operators for Ascend NPUs (CANN), with CUDA kernels of the same algorithms.

Stable operators are exported here explicitly. Importing the package touches no device and
compiles nothing: kernels are compiled on an operator's first call.
"""

# Every domain subpackage, imported by name so that `cann_ops_tilelang.<domain>` is an attribute from the start
# (an experimental operator, not exported below, is `cann_ops_tilelang.<domain>.<op>`). Importing a domain
# touches no device and compiles nothing, so none is imported lazily.
from cann_ops_tilelang import engram as engram
from cann_ops_tilelang import mhc as mhc
from cann_ops_tilelang import moe as moe
from cann_ops_tilelang import norm as norm
from cann_ops_tilelang import quant as quant
from cann_ops_tilelang import rand as rand
from cann_ops_tilelang import transform as transform
from cann_ops_tilelang.engram import (
    engram_fused_weight,
    engram_gate_bwd,
    engram_gate_fwd,
    engram_grad_w_reduce,
    engram_hash,
    engram_sinkhorn_finalize,
    engram_sinkhorn_momentum_update,
    engram_sinkhorn_step,
    engram_sinkhorn_step_reduce,
)
from cann_ops_tilelang.moe import moe_normalize_weight, moe_topk, moe_topk_gate, moe_topk_gate_backward

__version__ = '0.1.0'

__all__: list[str] = [
    'engram_fused_weight',
    'engram_gate_bwd',
    'engram_gate_fwd',
    'engram_grad_w_reduce',
    'engram_hash',
    'engram_sinkhorn_finalize',
    'engram_sinkhorn_momentum_update',
    'engram_sinkhorn_step',
    'engram_sinkhorn_step_reduce',
    'moe_normalize_weight',
    'moe_topk',
    'moe_topk_gate',
    'moe_topk_gate_backward',
]
