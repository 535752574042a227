"""The interface rules the SwiGLU forwards and backwards share (one home): the expert layout and weights, and the
fast path's key."""

from __future__ import annotations


def check_layout_options(name: str, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor) -> None:
    """The expert layout and weights: psum (E,) int32 with E >= 1; routed_scaling_factor only with topk_weights."""
    psum = psum_num_tokens_per_expert
    if psum is not None and (psum.dim() != 1 or psum.shape[0] < 1):
        raise ValueError(
            f'{name}: psum_num_tokens_per_expert must be 1-D with at least one expert, got shape {tuple(psum.shape)}'
        )
    if routed_scaling_factor is not None and topk_weights is None:
        raise ValueError(f'{name}: routed_scaling_factor needs topk_weights')


def swiglu_fast_key(shape, x, psum, topk_weights, routed_scaling_factor, clamp_value, *options) -> tuple | None:
    """The fast path's key of a call that its operator's fast_ok let on (`shape`, x's): the width, x's dtype and
    device, the expert count and which optional arguments are given (what the configuration and the rules of
    check_layout_options read), and `options` (the rest of the operator's choice); None without rows or with an
    expert table those rules refuse, or topk_weights of another length than the rows (the full path decides: the
    kernels take topk_weights of a size of its own, so their entries do not check it against T)."""
    if shape is None or not shape[0] or (psum is not None and (psum.dim() != 1 or not psum.shape[0])):
        return None
    if topk_weights is not None and (topk_weights.dim() != 1 or topk_weights.shape[0] != shape[0]):
        return None
    return (shape[1], x.dtype, x.get_device(), None if psum is None else psum.shape[0], topk_weights is None,
            routed_scaling_factor is None, clamp_value is None, *options)  # fmt: skip
