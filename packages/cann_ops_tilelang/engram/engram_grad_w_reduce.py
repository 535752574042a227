"""engram_grad_w_reduce: finish the Engram RMSNorm weight gradients from per-block partials, in place."""

from __future__ import annotations

from typing import NamedTuple

import torch

from cann_ops_tilelang.engram._contract import check_hc_hidden
from cann_ops_tilelang.operator import Operator, tensor

from .engram_grad_w_reduce_kernel import choose_engram_grad_w_reduce_config, get_engram_grad_w_reduce_kernel


class EngramGradWReduceResult(NamedTuple):
    grad_weight_hidden: torch.Tensor  # (hc, H) fp32, the updated input tensor
    grad_weight_embed: torch.Tensor  # (hc, H) fp32, the updated input tensor


OP = Operator(
    'engram_grad_w_reduce',
    tensor('grad_w_partial', torch.float32, 'P, hc, hidden', aligned=True),
    tensor('weight_hidden', torch.bfloat16, 'hc, hidden', aligned=True),
    tensor('weight_embed', torch.bfloat16, 'hc, hidden', aligned=True),
    tensor('grad_weight_hidden', torch.float32, 'hc, hidden', aligned=True, written='updated'),
    tensor('grad_weight_embed', torch.float32, 'hc, hidden', aligned=True, written='updated'),
    limits=check_hc_hidden,
    choice=lambda grad_w_partial: {'hc': grad_w_partial.shape[1], 'hidden': grad_w_partial.shape[2]},
    choose_config=choose_engram_grad_w_reduce_config,
    get_kernel=get_engram_grad_w_reduce_kernel,
)


def _eager(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
    """Every check, then the launch. Fast path: by (hc, H, CUDA index), for P > 0 and what fast_ok checks (the
    entry rejects any other layout before a launch)."""
    args = (grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    # EngramGradWReduceResult(...) without the NamedTuple's Python-level __new__ (the host path of every call)
    result = tuple.__new__(EngramGradWReduceResult, (grad_weight_hidden, grad_weight_embed))
    if (shape := OP.fast_ok(*args)) is not None:
        num_partials, hc, hidden = shape
        launcher = OP.fast.get((hc, hidden, grad_w_partial.get_device())) if num_partials else None
        if launcher is not None:
            OP.launch(launcher, args, args)
            return result
    launcher = OP.plan(*args)
    if grad_w_partial.shape[0]:  # P = 0, the empty sum: nothing to add
        launcher.launch(*args)
        OP.remember((*grad_w_partial.shape[1:], grad_w_partial.get_device()), launcher)
    return result


@OP.public(_eager, result=EngramGradWReduceResult)
def engram_grad_w_reduce(
    grad_w_partial: torch.Tensor,
    weight_hidden: torch.Tensor,
    weight_embed: torch.Tensor,
    grad_weight_hidden: torch.Tensor,
    grad_weight_embed: torch.Tensor,
) -> EngramGradWReduceResult:
    """Accumulate the weight gradients in place (fp32):

        s = sum_p grad_w_partial[p]
        grad_weight_hidden += s * float(weight_embed)
        grad_weight_embed  += s * float(weight_hidden)

    Args:
        grad_w_partial: (P, hc, H) fp32; any P >= 0 (P = 0 leaves the gradients unchanged).
        weight_hidden, weight_embed: (hc, H) bf16.
        grad_weight_hidden, grad_weight_embed: (hc, H) fp32, updated in place. They must
            not overlap each other or any input (ValueError).

    All tensors contiguous and 16-byte aligned, on one device; hc in 1..8, H a multiple of 64 up to 16384.

    Returns:
        EngramGradWReduceResult(grad_weight_hidden, grad_weight_embed): the two updated tensors.

    The fp32 sum over P runs in another order than torch's, so results differ from an fp32
    reference by rounding only (a few ulps of sum_p |partial[p]| * |w|).
    """
