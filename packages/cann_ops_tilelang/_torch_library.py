"""What the public operators share for torch.library: the namespace, and when a call takes the op route.

Every public operator is two things: the plain Python function (the public API, with its signature,
defaults and typed errors), and one or more `torch.library` custom ops `cann_ops_tilelang::<name>` that
torch.compile, make_fx / torch.export, FakeTensorMode and opcheck see (registered per domain, e.g.
`engram/_torch_ops.py`). An eager call on plain tensors goes straight from the function to its kernel
(no dispatcher on the host path); a call that torch is tracing goes through the op. Both routes run the
same validation and the same kernel.
"""

from __future__ import annotations

import torch

from cann_ops_tilelang.validation import PLAIN_TENSOR_TYPES

NAMESPACE = 'cann_ops_tilelang'


def traced(tensor) -> bool:
    """Whether a call whose first tensor argument is `tensor` must go through its torch.library op.

    True under torch.compile (Dynamo folds is_compiling() to True, so the other tests, which it could not
    trace, are never reached), for tensor subclasses other than nn.Parameter (FakeTensor, functional
    tensors) and while a dispatch mode is active (make_fx, FakeTensorMode, opcheck's schema check). A
    non-tensor first argument takes the eager route, whose validation raises the TypeError.
    """
    return torch.compiler.is_compiling() or (
        isinstance(tensor, torch.Tensor)
        and (type(tensor) not in PLAIN_TENSOR_TYPES or torch._C._len_torch_dispatch_stack() > 0)
    )


def op(name: str):
    """The op `cann_ops_tilelang::<name>` (an OpOverloadPacket; registered when the package is imported)."""
    return getattr(getattr(torch.ops, NAMESPACE), name)
