"""engram_sinkhorn_momentum_update: momentum step of the Engram tables' optimizer, input of the Sinkhorn step."""

from __future__ import annotations

import torch

from cann_ops_tilelang.config import get_num_cores
from cann_ops_tilelang.operator import Operator, scalar, tensor

from .engram_sinkhorn_momentum_update_kernel import choose_engram_sinkhorn_momentum_update_config as _choose_config
from .engram_sinkhorn_momentum_update_kernel import cuda_wide_block_max_numel
from .engram_sinkhorn_momentum_update_kernel import get_engram_sinkhorn_momentum_update_kernel as _get_kernel

MAX_NUMEL = 2**31 - 2**20  # int32 element indices, with room for the last block of the grid
_DTYPES = (torch.bfloat16, torch.float32)
_DTYPE_NAMES = {torch.bfloat16: 'bfloat16', torch.float32: 'float32'}
# CUDA device index -> the largest numel that takes the wide blocks there (cuda_wide_block_max_numel of its
# SM count), known once a call has chosen its launcher on that device: part of the fast path's key.
_WIDE_MAX_NUMEL: dict[int, int] = {}


def _check_numel(name, grad):
    if grad.numel() > MAX_NUMEL:
        raise ValueError(f'{name}: numel must be at most 2**31 - 2**20 = {MAX_NUMEL}, got {grad.numel()}')


def _choice(grad, momentum_buffer, nesterov, backend):
    wide = False  # the kernel depends on numel only through the CUDA block shape: wide blocks or streaming ones
    if backend == 'cuda':
        index = grad.device.index
        if index not in _WIDE_MAX_NUMEL:
            _WIDE_MAX_NUMEL[index] = cuda_wide_block_max_numel(get_num_cores(grad.device))
        wide = grad.numel() <= _WIDE_MAX_NUMEL[index]
    # One launcher per block shape, chosen with a numel of that shape: 0 is wide, and MAX_NUMEL streams
    # wherever a valid numel does (every valid numel is at most MAX_NUMEL).
    dtypes = {'grad_dtype': _DTYPE_NAMES[grad.dtype], 'momentum_dtype': _DTYPE_NAMES[momentum_buffer.dtype]}
    return {**dtypes, 'nesterov': nesterov, 'numel': 0 if wide else MAX_NUMEL}


OP = Operator(
    'engram_sinkhorn_momentum_update',
    tensor('grad', _DTYPES, aligned=True),
    tensor('momentum_buffer', _DTYPES, like='grad', aligned=True, written='updated'),
    scalar('beta1', 'float'),
    scalar('nesterov', 'bool'),
    extra=_check_numel,
    choice=_choice,
    choose_config=_choose_config,
    get_kernel=_get_kernel,
)


def _eager(grad, momentum_buffer, beta1, nesterov) -> torch.Tensor:
    """Every check, then the launch. Fast path, for 1-D tensors: by (dtypes, nesterov, CUDA index, wide blocks)."""
    fast_key = None
    shape = OP.fast_ok(grad, momentum_buffer, beta1, nesterov)
    if shape is not None and len(shape) == 1:
        index, numel = grad.get_device(), shape[0]
        fast_key = (grad.dtype, momentum_buffer.dtype, nesterov, index, numel <= _WIDE_MAX_NUMEL.get(index, -1))
        launcher = OP.fast.get(fast_key)
        if launcher is not None and 0 < numel <= MAX_NUMEL:
            result = momentum_buffer.new_empty(numel, dtype=torch.float32)
            args = (grad, momentum_buffer, result, beta1, 1.0 - beta1)
            OP.launch(launcher, args, (grad, momentum_buffer, beta1, nesterov))
            return result
    launcher = OP.plan(grad, momentum_buffer, beta1, nesterov)
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
    return torch.empty(momentum_buffer.shape, dtype=torch.float32, device=momentum_buffer.device)  # contiguous


@OP.public(_eager, returns='Tensor', fake=_fake)
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
