"""mhc_sinkhorn_fwd: Sinkhorn normalisation of each token's mhc_mult x mhc_mult residual mix (TileKernels 2.1.0's
call), written into a given buffer."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from .mhc_sinkhorn_kernel import MHC_MULTS, choose_mhc_sinkhorn_config, get_mhc_sinkhorn_kernel

# The kernels index a token's elements with int32 (token * mhc_mult**2 + element, plus one block of tokens).
MAX_NUMEL = 2**30


def check_matrices(name, label, x):
    """x: (..., mhc_mult, mhc_mult) with at least one leading dimension, mhc_mult in 1..8, within MAX_NUMEL."""
    if x.dim() < 3 or x.shape[-1] != x.shape[-2] or x.shape[-1] not in MHC_MULTS:
        raise ValueError(
            f'{name}: {label} must have shape (..., mhc_mult, mhc_mult) with at least one leading dimension and '
            f'mhc_mult in 1..8, got {tuple(x.shape)}'
        )
    if x.numel() > MAX_NUMEL:
        raise ValueError(f'{name}: {label} must have at most {MAX_NUMEL} elements, got {x.numel()}')


def check_repeat(name, repeat, limit):
    if not 1 <= repeat <= limit:
        raise ValueError(f'{name}: repeat must be in [1, {limit}], got {repeat}')


def _extra(name, comb_res_mix, repeat):
    check_matrices(name, 'comb_res_mix', comb_res_mix)
    check_repeat(name, repeat, 2**31 - 1)  # the forward keeps nothing per step: any repeat (an int32 loop)


# The contract, checked in the mechanism's order: types and dtypes (TypeError), layouts and sizes (ValueError),
# the written buffer apart from the input, then the device (RuntimeError: an Ascend NPU or a CUDA GPU).
OP = Operator(
    'mhc_sinkhorn_fwd',
    tensor('comb_res_mix', torch.float32),
    tensor('comb_res_mix_out', torch.float32, like='comb_res_mix', written='written'),
    scalar('repeat', 'int'),
    scalar('eps', 'float'),
    extra=_extra,
    choice=lambda comb_res_mix, repeat: {'direction': 'fwd', 'mhc_mult': comb_res_mix.shape[-1], 'repeat': repeat},
    choose_config=choose_mhc_sinkhorn_config,
    get_kernel=get_mhc_sinkhorn_kernel,
)


def _eager(comb_res_mix, comb_res_mix_out, repeat, eps):
    """Every check (or the fast path's), then one launch over the tokens (none without tokens). Fast path: by
    (mhc_mult, repeat, CUDA index)."""
    args = (comb_res_mix, comb_res_mix_out, repeat, eps)
    shape = OP.fast_ok(*args)
    key = None if shape is None else (shape[-1], repeat, comb_res_mix.get_device())
    launcher, fast = OP.prepare(key, args)
    mm = comb_res_mix.shape[-1] ** 2
    launch_args = (comb_res_mix.view(-1, mm), comb_res_mix_out.view(-1, mm), float(eps))
    OP.finish(launcher, fast, key, launch_args, args, empty=not comb_res_mix.numel())
    return comb_res_mix_out


@OP.public(_eager)
def mhc_sinkhorn_fwd(
    comb_res_mix: torch.Tensor, comb_res_mix_out: torch.Tensor, repeat: int, eps: float
) -> torch.Tensor:
    """Sinkhorn normalisation of each token's residual mix, written into comb_res_mix_out. Per token, in fp32,
    with X the token's mhc_mult x mhc_mult matrix of logits:

        P = softmax(X, rows) + eps
        P = P / (column sums of P + eps)
        repeat - 1 times:  P = P / (row sums of P + eps);  P = P / (column sums of P + eps)

    (TileKernels' sinkhorn_normalize_ref). A row's softmax subtracts its maximum; each division is one reciprocal
    per row or column and a product per element.

    Args:
        comb_res_mix: (..., mhc_mult, mhc_mult) fp32, contiguous, at least one leading dimension (the tokens: any
            count, 0 included), mhc_mult in 1..8, at most 2**30 elements.
        comb_res_mix_out: fp32 of comb_res_mix's shape, contiguous, on its device, not overlapping it; written.
        repeat: >= 1 rounds (no upper bound but int32: the forward keeps nothing per round).
        eps: finite.

    Returns:
        comb_res_mix_out (TileKernels returns None). Without tokens nothing is launched.
    """
