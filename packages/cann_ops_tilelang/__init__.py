"""TileLang operators for Ascend NPUs (CANN), with CUDA kernels of the same algorithms.

Stable operators are exported here explicitly. Importing the package touches no device and
compiles nothing: kernels are compiled on an operator's first call.
"""

from cann_ops_tilelang.engram import (
    engram_fused_weight,
    engram_gate_bwd,
    engram_gate_fwd,
    engram_grad_w_reduce,
    engram_hash,
)

__version__ = '0.1.0'

__all__: list[str] = [
    'engram_fused_weight',
    'engram_gate_bwd',
    'engram_gate_fwd',
    'engram_grad_w_reduce',
    'engram_hash',
]
