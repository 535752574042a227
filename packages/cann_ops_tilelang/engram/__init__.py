"""Engram: hashed n-gram memory lookups gated into hyper-connection hidden states."""

from .engram_fused_weight import engram_fused_weight
from .engram_gate_bwd import EngramGateBwdResult, engram_gate_bwd
from .engram_gate_fwd import EngramGateFwdResult, engram_gate_fwd
from .engram_grad_w_reduce import EngramGradWReduceResult, engram_grad_w_reduce
from .engram_hash import engram_hash
from .engram_sinkhorn_finalize import engram_sinkhorn_finalize
from .engram_sinkhorn_momentum_update import engram_sinkhorn_momentum_update
from .engram_sinkhorn_step import EngramSinkhornStepResult, engram_sinkhorn_step
from .engram_sinkhorn_step_reduce import engram_sinkhorn_step_reduce

__all__: list[str] = [
    'EngramGateBwdResult',
    'EngramGateFwdResult',
    'EngramGradWReduceResult',
    'EngramSinkhornStepResult',
    'engram_fused_weight',
    'engram_gate_bwd',
    'engram_gate_fwd',
    'engram_grad_w_reduce',
    'engram_hash',
    'engram_sinkhorn_finalize',
    'engram_sinkhorn_momentum_update',
    'engram_sinkhorn_step',
    'engram_sinkhorn_step_reduce',
]
