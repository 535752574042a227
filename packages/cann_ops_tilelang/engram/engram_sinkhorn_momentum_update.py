"""engram_sinkhorn_momentum_update: momentum step of the Engram tables' optimizer, input of the Sinkhorn step."""

from __future__ import annotations

import functools
import math

import torch

from cann_ops_tilelang._torch_library import op, traced
from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.kernel_target import Launcher, launch_or_explain
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

from .engram_sinkhorn_momentum_update_kernel import (
    EngramSinkhornMomentumUpdateConfig,
    choose_engram_sinkhorn_momentum_update_config,
    cuda_wide_block_max_numel,
    get_engram_sinkhorn_momentum_update_kernel,
)

_NAME = 'engram_sinkhorn_momentum_update'
MAX_NUMEL = 2**31 - 2**20  # int32 element indices, with room for the last block of the grid
_DTYPES = (torch.bfloat16, torch.float32)
_DTYPE_NAMES = {torch.bfloat16: 'bfloat16', torch.float32: 'float32'}


# One launcher per (device, backend, dtypes, nesterov, CUDA wide blocks): chosen and looked up once.
# (The core count is the device's, fixed for a process.)
_LAUNCHERS: dict[tuple, Launcher] = {}
# The fast path's launchers (their entries check every tensor's layout, Launcher.checks_arguments), by
# (grad dtype, momentum_buffer dtype, nesterov, CUDA device index, wide blocks): found there, a call with
# 1-D tensors checks in Python only what the entry cannot (argument types, beta1, numel, alignment, the
# overlap) and leaves the explanation of a rejection to _check.
_CHECKED: dict[tuple, Launcher] = {}
# CUDA device index -> the largest numel that takes the wide blocks there (cuda_wide_block_max_numel of its
# SM count), known once a call has chosen its launcher on that device.
_WIDE_MAX_NUMEL: dict[int, int] = {}


def _check(grad, momentum_buffer, beta1, nesterov, *, memory) -> tuple[str, float]:
    """Validate the arguments (memory=False: fake tensors, see validation.may_overlap); (backend, beta1)."""
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
        check_aligned(name, value, memory=memory)
    if may_overlap(momentum_buffer, grad, memory=memory):
        raise ValueError(f'{_NAME}: momentum_buffer (updated in place) must not alias the input grad')
    return require_accelerator(grad, momentum_buffer), beta1


_check_real = functools.partial(_check, memory=True)  # what explains a rejected fast-path launch


def _wide_blocks(backend, device, numel) -> bool:
    """Whether a CUDA call of `numel` elements takes the kernel's wide blocks (False on other backends)."""
    if backend != 'cuda':
        return False
    limit = _WIDE_MAX_NUMEL.get(device.index)
    if limit is None:
        limit = _WIDE_MAX_NUMEL[device.index] = cuda_wide_block_max_numel(get_num_cores(device))
    return numel <= limit


def _launcher(backend, grad, momentum_buffer, nesterov, wide) -> Launcher:
    device = grad.device
    key = (device, backend, grad.dtype, momentum_buffer.dtype, nesterov, wide)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        cfg = choose_engram_sinkhorn_momentum_update_config(
            backend=backend,
            grad_dtype=_DTYPE_NAMES[grad.dtype],
            momentum_dtype=_DTYPE_NAMES[momentum_buffer.dtype],
            nesterov=nesterov,
            num_cores=get_num_cores(device),
            numel=grad.numel(),
        )
        launcher = _LAUNCHERS[key] = Launcher(get_engram_sinkhorn_momentum_update_kernel, cfg, device)
    return launcher


def _eager(grad, momentum_buffer, beta1, nesterov) -> torch.Tensor:
    """The call on real tensors: every check, then the launch (also the torch.library op's kernel)."""
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
        launcher = _CHECKED.get(fast_key)
        if launcher is not None and 0 < numel <= MAX_NUMEL:
            grad_start, buffer_start = grad.data_ptr(), momentum_buffer.data_ptr()
            if not (grad_start | buffer_start) % ALIGN_BYTES and not (
                grad_start < buffer_start + momentum_buffer.nbytes and buffer_start < grad_start + grad.nbytes
            ):
                result = momentum_buffer.new_empty((numel,), dtype=torch.float32)
                launch_or_explain(
                    launcher,
                    (grad, momentum_buffer, result, beta1, 1.0 - beta1),
                    _check_real,
                    grad,
                    momentum_buffer,
                    beta1,
                    nesterov,
                )
                return result
    backend, beta1 = _check(grad, momentum_buffer, beta1, nesterov, memory=True)
    wide = _wide_blocks(backend, grad.device, grad.numel())
    launcher = _launcher(backend, grad, momentum_buffer, nesterov, wide)
    result = momentum_buffer.new_empty(momentum_buffer.shape, dtype=torch.float32)
    if grad.numel() == 0:
        return result
    if grad.dim() != 1:  # the kernel takes (numel,); 1-D tensors (the common case) need no view
        grad, momentum_buffer, flat_result = grad.view(-1), momentum_buffer.view(-1), result.view(-1)
    else:
        flat_result = result
    # 1 - beta1 is rounded once to fp32 at the launch, as torch rounds the scalar of `grad * (1 - beta1)`
    launcher.launch(grad, momentum_buffer, flat_result, beta1, 1.0 - beta1)
    if fast_key is not None and launcher.checks_arguments:
        _CHECKED[(*fast_key[:4], wide)] = launcher
    return result


def _fake(grad, momentum_buffer, beta1, nesterov) -> torch.Tensor:
    """While torch traces: the checks that need no memory, then the contiguous fp32 result."""
    _check(grad, momentum_buffer, beta1, nesterov, memory=False)
    return torch.empty(momentum_buffer.shape, dtype=torch.float32, device=momentum_buffer.device)


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
    if traced(grad):  # torch.compile, fake tensors, make_fx: the torch.library op (_torch_ops.py)
        _check(grad, momentum_buffer, beta1, nesterov, memory=False)
        return op('engram_sinkhorn_momentum_update')(grad, momentum_buffer, float(beta1), nesterov)
    return _eager(grad, momentum_buffer, beta1, nesterov)


def engram_sinkhorn_momentum_update_config(
    grad: torch.Tensor, momentum_buffer: torch.Tensor, beta1: float, nesterov: bool = True
) -> EngramSinkhornMomentumUpdateConfig:
    """The kernel configuration engram_sinkhorn_momentum_update launches for these arguments (validated
    alike; no launch)."""
    backend, _ = _check(grad, momentum_buffer, beta1, nesterov, memory=True)
    return _launcher(backend, grad, momentum_buffer, nesterov, _wide_blocks(backend, grad.device, grad.numel())).cfg
