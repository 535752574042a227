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
    engram_sinkhorn_finalize,
    engram_sinkhorn_momentum_update,
    engram_sinkhorn_step,
    engram_sinkhorn_step_reduce,
)

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
]


def __getattr__(name: str):
    """`cann_ops_tilelang.<domain>` without importing it first (PEP 562), e.g. an experimental domain's
    `cann_ops_tilelang.foo.foo_bar`: the subpackage is imported on first access. Its import, like this
    package's, touches no device and compiles nothing."""
    import importlib
    import importlib.util

    if not name.startswith('_') and importlib.util.find_spec(f'{__name__}.{name}') is not None:
        return importlib.import_module(f'{__name__}.{name}')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
