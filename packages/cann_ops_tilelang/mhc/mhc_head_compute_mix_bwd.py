"""mhc_head_compute_mix_bwd: the gradients of mhc_head_compute_mix_fwd, the shared scale's and base's as
per-worker partial sums, deterministic (TileKernels 2.1.0's call; docs/mhc.md)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from ._mixes_common import MAX_PARTIALS, check_elements, check_mhc_mult, check_token_block_size
from ._mixes_kernel import choose_mhc_mixes_config, get_mhc_mixes_kernel


class MhcHeadComputeMixBwdResult(NamedTuple):
    input_mix_grad: torch.Tensor  # (T, M)
    mhc_scale_grad_partial: torch.Tensor  # (num_sms, 1)
    mhc_base_grad_partial: torch.Tensor  # (num_sms, M)


def _limits(name, T, M, P):
    check_mhc_mult(name, M, 'input_mix.shape[1]')
    check_elements(name, 'input_mix', T, M)
    if not 1 <= P <= MAX_PARTIALS:
        raise ValueError(f'{name}: the partial buffers must have num_sms rows in [1, {MAX_PARTIALS}], got {P}')


def _extra(name, num_sms, token_block_size, P):
    if num_sms != P:
        raise ValueError(
            f'{name}: num_sms ({num_sms}) must be the row count of mhc_scale_grad_partial and '
            f'mhc_base_grad_partial ({P}): one partial row per worker'
        )
    check_token_block_size(name, token_block_size)


OP = Operator(
    'mhc_head_compute_mix_bwd',
    tensor('output_mix_grad', torch.float32, 'T, M'),
    tensor('input_mix', torch.float32, 'T, M'),
    tensor('mhc_scale', torch.float32, '1'),
    tensor('mhc_base', torch.float32, 'M'),
    tensor('input_mix_grad', torch.float32, 'T, M', written='written'),
    tensor('mhc_scale_grad_partial', torch.float32, 'P, 1', written='written'),
    tensor('mhc_base_grad_partial', torch.float32, 'P, M', written='written'),
    scalar('num_sms', 'int'),
    scalar('token_block_size', 'int'),
    limits=_limits,
    extra=_extra,
    choice=lambda input_mix, num_sms, token_block_size: {
        'kind': 'head_bwd',
        'mhc_mult': input_mix.shape[1],
        'token_block_size': token_block_size,
        'num_partials': num_sms,
    },
    choose_config=choose_mhc_mixes_config,
    get_kernel=get_mhc_mixes_kernel,
)


def _eager(output_mix_grad, input_mix, mhc_scale, mhc_base, input_mix_grad, mhc_scale_grad_partial,
           mhc_base_grad_partial, num_sms, token_block_size) -> MhcHeadComputeMixBwdResult:  # fmt: skip
    """Every check (or the fast path's), then one launch; for 0 tokens zero partials and no launch. Fast path,
    for tokens: by (M, num_sms, token_block_size, CUDA index)."""
    args = (output_mix_grad, input_mix, mhc_scale, mhc_base, input_mix_grad, mhc_scale_grad_partial,
            mhc_base_grad_partial, num_sms, token_block_size)  # fmt: skip
    shape = OP.fast_ok(*args)
    key = None
    if shape is not None and shape[0]:
        key = (shape[1], num_sms, token_block_size, input_mix.get_device())
    launcher, fast = OP.prepare(key, args)
    empty = not input_mix.shape[0]
    if empty:
        mhc_scale_grad_partial.zero_()
        mhc_base_grad_partial.zero_()
    launch_args = args[:7]
    OP.finish(launcher, fast, key, launch_args, args, empty=empty)
    return MhcHeadComputeMixBwdResult(input_mix_grad, mhc_scale_grad_partial, mhc_base_grad_partial)


@OP.public(_eager, result=MhcHeadComputeMixBwdResult)
def mhc_head_compute_mix_bwd(
    output_mix_grad: torch.Tensor,
    input_mix: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    input_mix_grad: torch.Tensor,
    mhc_scale_grad_partial: torch.Tensor,
    mhc_base_grad_partial: torch.Tensor,
    num_sms: int,
    token_block_size: int = 0,
) -> MhcHeadComputeMixBwdResult:
    """The gradients of mhc_head_compute_mix_fwd. Per token t and stream j, in fp32, with
    s = sigmoid(input_mix[t, j] * mhc_scale[0] + mhc_base[j]) recomputed:

        dz[t, j] = output_mix_grad[t, j] * s * (1 - s)
        input_mix_grad[t, j] = dz[t, j] * mhc_scale[0]
        mhc_base_grad_partial[w, j] = sum over worker w's tokens of dz[t, j]
        mhc_scale_grad_partial[w, 0] = sum over worker w's tokens and j of dz[t, j] * input_mix[t, j]

    Worker w of num_sms takes the tiles w, w + num_sms, ... of token_block_size tokens, in order, and adds in a
    fixed order (CUDA: per column the tokens in order, then the columns in order; Ascend: per register lane the
    tokens in order, then the lanes by fixed folds): no atomics, the same bits on every run. The caller adds the
    num_sms rows (the parameters' gradients are their sums over the rows).

    Args:
        output_mix_grad: (T, M) fp32, contiguous; M = mhc_mult in 1 .. 8, T >= 0, T * M <= 2**30.
        input_mix: (T, M) fp32, contiguous: the forward's input.
        mhc_scale: (1,) fp32; mhc_base: (M,) fp32, contiguous.
        input_mix_grad: (T, M) fp32 buffer, written.
        mhc_scale_grad_partial: (num_sms, 1) fp32 buffer, written (zeros for T = 0).
        mhc_base_grad_partial: (num_sms, M) fp32 buffer, written (zeros for T = 0).
        num_sms: workers, the partial buffers' row count, 1 .. 4096 (any count on either backend).
        token_block_size: 0 (the backend's choice: 64 on Ascend, 32 on CUDA) or a power of two up to 64 (Ascend
            takes at least 8).
        The buffers: contiguous, on input_mix's device, apart from every other argument.

    Returns:
        MhcHeadComputeMixBwdResult(input_mix_grad, mhc_scale_grad_partial, mhc_base_grad_partial): the written
        buffers (the peer returns None).
    """
