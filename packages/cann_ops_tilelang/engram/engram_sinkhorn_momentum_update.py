"""engram_sinkhorn_momentum_update: momentum step of the Engram tables' optimizer, input of the Sinkhorn step."""

from __future__ import annotations

import math

import torch

from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.operator import Operator, traced
from cann_ops_tilelang.validation import (
    ALIGN_BYTES,
    PLAIN_TENSOR_TYPES,
    check_aligned,
    check_bool,
    check_contiguous,
    check_finite_float,
    check_shape,
    check_tensor,
    may_overlap,
)

from .engram_sinkhorn_momentum_update_kernel import choose_engram_sinkhorn_momentum_update_config as _choose_config
from .engram_sinkhorn_momentum_update_kernel import cuda_wide_block_max_numel
from .engram_sinkhorn_momentum_update_kernel import get_engram_sinkhorn_momentum_update_kernel as _get_kernel

MAX_NUMEL = 2**31 - 2**20  # int32 element indices, with room for the last block of the grid
_DTYPES = (torch.bfloat16, torch.float32)
_DTYPE_NAMES = {torch.bfloat16: 'bfloat16', torch.float32: 'float32'}
# CUDA device index -> the largest numel that takes the wide blocks there (cuda_wide_block_max_numel of its
# SM count), known once a call has chosen its launcher on that device: part of the fast path's key.
_WIDE_MAX_NUMEL: dict[int, int] = {}


def _check(grad, momentum_buffer, beta1, nesterov=True, *, memory=True) -> tuple[str, float]:
    """(backend, beta1 as a float) of valid arguments."""
    check_tensor('grad', grad, dtype=_DTYPES)
    check_tensor('momentum_buffer', momentum_buffer, dtype=_DTYPES)
    check_shape('momentum_buffer', momentum_buffer, grad.shape)
    beta1 = check_finite_float('beta1', beta1)
    check_bool('nesterov', nesterov)
    numel = grad.numel()
    if numel > MAX_NUMEL:
        raise ValueError(f'{OP.name}: numel must be at most 2**31 - 2**20 = {MAX_NUMEL}, got {numel}')
    for name, value in (('grad', grad), ('momentum_buffer', momentum_buffer)):
        check_contiguous(name, value)
        check_aligned(name, value, memory=memory)
    if may_overlap(momentum_buffer, grad, memory=memory):
        raise ValueError(f'{OP.name}: momentum_buffer (updated in place) must not alias the input grad')
    return require_accelerator(grad, momentum_buffer), beta1


OP = Operator('engram_sinkhorn_momentum_update', _check, _choose_config, _get_kernel)


def _plan(grad, momentum_buffer, beta1, nesterov=True):
    backend, _ = OP.check(grad, momentum_buffer, beta1, nesterov)
    wide = False  # the kernel depends on numel only through the CUDA block shape: wide blocks or streaming ones
    if backend == 'cuda':
        index = grad.device.index
        if index not in _WIDE_MAX_NUMEL:
            _WIDE_MAX_NUMEL[index] = cuda_wide_block_max_numel(get_num_cores(grad.device))
        wide = grad.numel() <= _WIDE_MAX_NUMEL[index]
    # One launcher per block shape, chosen with a numel of that shape: 0 is wide, and MAX_NUMEL streams
    # wherever a valid numel does (every valid numel is at most MAX_NUMEL).
    dtypes = {'grad_dtype': _DTYPE_NAMES[grad.dtype], 'momentum_dtype': _DTYPE_NAMES[momentum_buffer.dtype]}
    return OP.launcher(backend, grad.device, **dtypes, nesterov=nesterov, numel=0 if wide else MAX_NUMEL)


def _eager(grad, momentum_buffer, beta1, nesterov) -> torch.Tensor:
    """Every check, then the launch. Fast path, for 1-D tensors: by (dtypes, nesterov, CUDA index, wide blocks),
    checking in Python the argument types, beta1, numel, the alignment and the overlap."""
    fast_key = None
    if (
        type(grad) in PLAIN_TENSOR_TYPES
        and type(momentum_buffer) in PLAIN_TENSOR_TYPES
        and grad.is_cuda
        and grad.dim() == 1
        and type(beta1) is float
        and -math.inf < beta1 < math.inf
        and type(nesterov) is bool
    ):
        index, numel = grad.get_device(), grad.shape[0]
        fast_key = (grad.dtype, momentum_buffer.dtype, nesterov, index, numel <= _WIDE_MAX_NUMEL.get(index, -1))
        launcher = OP.fast.get(fast_key)
        if launcher is not None and 0 < numel <= MAX_NUMEL:
            grad_start, buffer_start = grad.data_ptr(), momentum_buffer.data_ptr()
            if not (grad_start | buffer_start) % ALIGN_BYTES and not (
                grad_start < buffer_start + momentum_buffer.nbytes and buffer_start < grad_start + grad.nbytes
            ):
                result = momentum_buffer.new_empty((numel,), dtype=torch.float32)
                args = (grad, momentum_buffer, result, beta1, 1.0 - beta1)
                OP.launch(launcher, args, grad, momentum_buffer, beta1, nesterov)
                return result
    launcher = _plan(grad, momentum_buffer, beta1, nesterov)
    beta1 = float(beta1)  # checked: a finite int or float
    result = momentum_buffer.new_empty(momentum_buffer.shape, dtype=torch.float32)
    if grad.numel() == 0:
        return result
    if grad.dim() != 1:  # the kernel takes (numel,); 1-D tensors (the common case) need no view
        grad, momentum_buffer, flat_result = grad.view(-1), momentum_buffer.view(-1), result.view(-1)
    else:
        flat_result = result
    # 1 - beta1 is rounded once to fp32 at the launch, as torch rounds the scalar of `grad * (1 - beta1)`
    launcher.launch(grad, momentum_buffer, flat_result, beta1, 1.0 - beta1)
    if fast_key is not None:  # keyed by the block shape it launched, now that the device's limit is known
        OP.remember((*fast_key[:4], grad.shape[0] <= _WIDE_MAX_NUMEL[fast_key[3]]), launcher)
    return result


def _fake(grad, momentum_buffer, beta1, nesterov) -> torch.Tensor:
    """While torch traces: the checks that need no memory, then the contiguous fp32 result."""
    OP.check(grad, momentum_buffer, beta1, nesterov, memory=False)
    return torch.empty(momentum_buffer.shape, dtype=torch.float32, device=momentum_buffer.device)


_SCHEMA = '(Tensor grad, Tensor(a!) momentum_buffer, float beta1, bool nesterov) -> Tensor'
_functional = OP.define('engram_sinkhorn_momentum_update', _SCHEMA, _eager, _fake)


@OP.public(_plan)
def engram_sinkhorn_momentum_update(
    grad: torch.Tensor,
    momentum_buffer: torch.Tensor,
    beta1: float,
    nesterov: bool = True,
) -> torch.Tensor:
    """Update the momentum buffer in place and return the fp32 input of the Sinkhorn normalisation.

        g = float(grad), m = float(momentum_buffer)
        m' = beta1 * m + (1 - beta1) * g            -> momentum_buffer (in place, rounded to its dtype)
        sinkhorn_input = beta1 * m' + (1 - beta1) * g  if nesterov else m'     (fp32, m' unrounded)

    Args:
        grad: bf16 or fp32, contiguous, 16-byte aligned, of any shape: 1-D (numel,) as in the reference
            library, 2-D such as a (rows, head_dim) table, or more (the update is elementwise: the kernels
            see the tensors flattened).
        momentum_buffer: bf16 or fp32 (any pairing with grad), the shape of grad, contiguous, 16-byte
            aligned; updated in place, so it must not overlap grad (ValueError).
        beta1: momentum decay, a finite float.
        nesterov: whether to return the Nesterov lookahead (True) or the updated momentum (False).

    Any numel from 0 to 2**31 - 2**20 works (the reference library asks for a multiple of 256; tails are
    handled in the kernels); numel 0 returns an empty tensor without a launch.

    Returns:
        sinkhorn_input: fp32, the shape of momentum_buffer, on its device.

    In fp32: s = fl32(1 - beta1) * g rounded once, m' = fma(m, beta1, s), lookahead fma(m', beta1, s). An fp32
    torch evaluation that rounds beta1 * m separately differs by at most about one ulp of |beta1 m| + |s|.
    """
    if not traced(grad):
        return _eager(grad, momentum_buffer, beta1, nesterov)
    OP.check(grad, momentum_buffer, beta1, nesterov, memory=False)
    return _functional(grad, momentum_buffer, float(beta1), nesterov)
