"""engram_sinkhorn_momentum_update: momentum step of the Engram tables' optimizer, input of the Sinkhorn step."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.validation import (
    check_aligned,
    check_bool,
    check_contiguous,
    check_finite_float,
    check_shape,
    check_tensor,
    may_overlap,
)

from .engram_sinkhorn_momentum_update_kernel import (
    EngramSinkhornMomentumUpdateConfig,
    choose_engram_sinkhorn_momentum_update_config,
    get_engram_sinkhorn_momentum_update_kernel,
)

_NAME = 'engram_sinkhorn_momentum_update'
MAX_NUMEL = 2**31 - 2**20  # int32 element indices, with room for the last block of the grid
_DTYPES = (torch.bfloat16, torch.float32)
_DTYPE_NAMES = {torch.bfloat16: 'bfloat16', torch.float32: 'float32'}


class _Plan(NamedTuple):
    cfg: EngramSinkhornMomentumUpdateConfig
    device: torch.device
    beta1: float


def _plan(grad, momentum_buffer, beta1, nesterov) -> _Plan:
    """Validate the arguments and choose the kernel configuration (no allocation, no launch)."""
    check_tensor('grad', grad, dtype=_DTYPES)
    check_tensor('momentum_buffer', momentum_buffer, dtype=_DTYPES)
    check_shape('momentum_buffer', momentum_buffer, grad.shape)
    beta1 = check_finite_float('beta1', beta1)
    nesterov = check_bool('nesterov', nesterov)
    numel = grad.numel()
    if numel > MAX_NUMEL:
        raise ValueError(f'{_NAME}: numel must be at most 2**31 - 2**20 = {MAX_NUMEL}, got {numel}')
    for name, value in (('grad', grad), ('momentum_buffer', momentum_buffer)):
        check_contiguous(name, value)
        check_aligned(name, value)
    if may_overlap(momentum_buffer, grad):
        raise ValueError(f'{_NAME}: momentum_buffer (updated in place) must not alias the input grad')

    backend = require_accelerator(grad, momentum_buffer)
    device = grad.device
    cfg = choose_engram_sinkhorn_momentum_update_config(
        backend=backend,
        grad_dtype=_DTYPE_NAMES[grad.dtype],
        momentum_dtype=_DTYPE_NAMES[momentum_buffer.dtype],
        nesterov=nesterov,
        num_cores=get_num_cores(device),
    )
    return _Plan(cfg, device, beta1)


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
        grad: bf16 or fp32, contiguous, 16-byte aligned; 1-D (numel,) as in the reference library, any
            shape accepted.
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
    cfg, device, beta1 = _plan(grad, momentum_buffer, beta1, nesterov)
    result = torch.empty(momentum_buffer.shape, dtype=torch.float32, device=device)
    if grad.numel() == 0:
        return result
    launch_kernel(
        get_engram_sinkhorn_momentum_update_kernel,
        cfg,
        device,
        grad.view(-1),
        momentum_buffer.view(-1),
        result.view(-1),
        beta1,
        1.0 - beta1,  # rounded once to fp32 at the launch, as torch rounds the scalar of `grad * (1 - beta1)`
    )
    return result


def engram_sinkhorn_momentum_update_config(
    grad: torch.Tensor, momentum_buffer: torch.Tensor, beta1: float, nesterov: bool = True
) -> EngramSinkhornMomentumUpdateConfig:
    """The kernel configuration engram_sinkhorn_momentum_update launches for these arguments (validated
    alike; no launch)."""
    return _plan(grad, momentum_buffer, beta1, nesterov).cfg
