"""mhc_head_compute_mix_fwd: the head layer's mix of the mHC residual streams, sigmoid(x * scale + base) + eps
(TileKernels 2.1.0's call; docs/mhc.md)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from ._mixes_common import check_elements, check_mhc_mult, check_token_block_size
from ._mixes_kernel import choose_mhc_mixes_config, get_mhc_mixes_kernel


def _limits(name, T, M):
    check_mhc_mult(name, M, 'input_mix.shape[1]')
    check_elements(name, 'input_mix', T, M)


def _extra(name, token_block_size):
    check_token_block_size(name, token_block_size)


# The contract, checked in the mechanism's order: types and dtypes (TypeError), shapes and sizes (ValueError),
# output_mix apart from the inputs (ValueError), then the device (RuntimeError).
OP = Operator(
    'mhc_head_compute_mix_fwd',
    tensor('input_mix', torch.float32, 'T, M'),
    tensor('mhc_scale', torch.float32, '1'),
    tensor('mhc_base', torch.float32, 'M'),
    tensor('output_mix', torch.float32, 'T, M', written='written'),
    scalar('mhc_pre_eps', 'float'),
    scalar('token_block_size', 'int'),
    limits=_limits,
    extra=_extra,
    choice=lambda input_mix, token_block_size: {
        'kind': 'head_fwd',
        'mhc_mult': input_mix.shape[1],
        'token_block_size': token_block_size,
    },
    choose_config=choose_mhc_mixes_config,
    get_kernel=get_mhc_mixes_kernel,
)


def _eager(input_mix, mhc_scale, mhc_base, output_mix, mhc_pre_eps, token_block_size):
    """Every check (or the fast path's), then one launch; none for 0 tokens. Fast path, for tokens: by (M,
    token_block_size, CUDA index)."""
    args = (input_mix, mhc_scale, mhc_base, output_mix, mhc_pre_eps, token_block_size)
    shape = OP.fast_ok(*args)
    key = (shape[1], token_block_size, input_mix.get_device()) if shape is not None and shape[0] else None
    launcher, fast = OP.prepare(key, args)
    launch_args = (input_mix, mhc_scale, mhc_base, output_mix, float(mhc_pre_eps))
    OP.finish(launcher, fast, key, launch_args, args, empty=not input_mix.shape[0])
    return output_mix


@OP.public(_eager)
def mhc_head_compute_mix_fwd(
    input_mix: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    output_mix: torch.Tensor,
    mhc_pre_eps: float,
    token_block_size: int = 0,
) -> torch.Tensor:
    """The head layer's mix, per token t and stream j, in fp32:

        output_mix[t, j] = sigmoid(input_mix[t, j] * mhc_scale[0] + mhc_base[j]) + mhc_pre_eps

    Args:
        input_mix: (T, M) fp32, contiguous; M = mhc_mult in 1 .. 8, T >= 0 (0: nothing is launched),
            T * M <= 2**30 (int32 indices).
        mhc_scale: (1,) fp32, contiguous.
        mhc_base: (M,) fp32, contiguous.
        output_mix: (T, M) fp32 contiguous buffer on input_mix's device, apart from the inputs: written.
        mhc_pre_eps: finite float.
        token_block_size: tokens per tile, 0 (the backend's choice: 64 on Ascend, 32 on CUDA) or a power of two
            up to 64 (Ascend takes at least 8).

    Returns:
        output_mix (the peer returns None).
    """
