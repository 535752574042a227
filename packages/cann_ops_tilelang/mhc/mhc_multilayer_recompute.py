"""mhc_multilayer_recompute: the residual streams and layer inputs of several consecutive mHC layers, recomputed
from the first residual and each layer's mixes and output (TileKernels 2.1.0's call; docs/mhc.md).

Eagerly, on both backends, one fused launch per LAYERS_PER_LAUNCH layers (mhc_multilayer_recompute_kernel.py)
keeps each residual on chip between its layers. While torch traces, a composition of the domain's operators, two
per layer: mhc_pre_apply_mix_fwd (the layer input) and mhc_post_fwd (the next residual). Neither takes a table of
pointers: each launch gets its layers' tensors as arguments (the peer builds a pinned host table of data pointers
per call and copies it to the device)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from cann_ops_tilelang.config import require_accelerator
from cann_ops_tilelang.kernel_target import placeholder
from cann_ops_tilelang.operator import Launchers, traced
from cann_ops_tilelang.validation import ALIGN_BYTES, check_contiguous, check_tensor

from ._mhc_expand_apply_common import check_sizes
from .mhc_multilayer_recompute_kernel import (
    LAYERS_PER_LAUNCH,
    choose_mhc_multilayer_recompute_config,
    get_mhc_multilayer_recompute_kernel,
)
from .mhc_post_fwd import mhc_post_fwd
from .mhc_pre_apply_mix_fwd import mhc_pre_apply_mix_fwd

NAME = 'mhc_multilayer_recompute'


def _items(name: str, values, count: int | None = None) -> list:
    """`values`, a list or tuple (TypeError otherwise) of `count` items (ValueError otherwise; None: any)."""
    if not isinstance(values, (list, tuple)):
        raise TypeError(f'{NAME}: {name} must be a list of tensors, got {type(values).__name__}')
    if count is not None and len(values) != count:
        raise ValueError(f'{NAME}: {name} must hold {count} tensors, got {len(values)}')
    return list(values)


def _checked(
    name: str, value, dtype: torch.dtype, shape: tuple[int, ...], *, aligned: bool = False, memory: bool = True
) -> torch.Tensor:
    """`value` (any shape with these elements, contiguous: the peer reads it through a pointer) as `shape`, the
    fused kernel's, viewed only where its shape differs (a view costs microseconds, and a call checks 6 L tensors;
    memory=False, fake tensors while torch traces: the alignment is the stages' ops' to check when they run)."""
    label = f'{NAME}: {name}'
    check_tensor(label, value, dtype=dtype)
    check_contiguous(label, value)
    if aligned and memory and value.data_ptr() % ALIGN_BYTES:
        raise ValueError(f'{label} must start at a {ALIGN_BYTES}-byte aligned address')
    if value.shape == shape:
        return value
    if value.numel() != math.prod(shape):
        raise ValueError(f'{label} must hold {math.prod(shape)} elements, got shape {tuple(value.shape)}')
    return value.view(shape)


def _check_apart(read: list[tuple[str, torch.Tensor]], written: list[tuple[str, torch.Tensor]]) -> None:
    """Every written tensor apart from every other tensor of the call: one sweep over the contiguous byte spans in
    address order, against the span reaching furthest so far (any overlap with a written span meets it)."""
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.nbytes, name, is_written)
        for tensors, is_written in ((read, False), (written, True))
        for name, t in tensors
        if t.numel()
    )
    reach, owner, owner_written = 0, None, False
    for start, end, name, is_written in spans:
        if owner is not None and start < reach and (is_written or owner_written):
            raise ValueError(f'{NAME}: {owner} and {name} overlap (a written tensor must be apart from the others)')
        if end > reach:
            reach, owner, owner_written = end, name, is_written


def mhc_multilayer_recompute(
    initial_residual: torch.Tensor,
    pre_mix_list: Sequence[torch.Tensor],
    layer_output_list: Sequence[torch.Tensor],
    post_mix_list: Sequence[torch.Tensor],
    comb_mix_list: Sequence[torch.Tensor],
    layer_input_list: Sequence[torch.Tensor],
    residual_list: Sequence[torch.Tensor],
) -> None:
    """Recompute L consecutive mHC layers' inputs and residual streams (the activations a training step dropped),
    per token, with M = mhc_mult streams of H, r_0 = initial_residual:

        layer_input_list[l][t, h] = bf16(sum over m of pre_mix_list[l][t, m] * r_l[t, m, h])        l < L
        residual_list[l][t, o, h] = bf16(post_mix_list[l][t, o] * layer_output_list[l][t, h]
                                         + sum over i of comb_mix_list[l][t, i, o] * r_l[t, i, h])  l < L_post
        r_{l+1} = residual_list[l]

    L_post = len(layer_output_list) is L or L - 1 (then the last layer's input only). Each layer is the pair of
    public operators mhc_pre_apply_mix_fwd and mhc_post_fwd, whose docstrings give the rounding and the
    summation order, and the results equal, bit for bit, those operators called layer by layer. Beyond the peer:
    every mhc_mult of 1 .. 8 and any token count on both backends.

    Args:
        initial_residual: (..., M, H) bf16, contiguous, 16-byte aligned; T tokens = its elements / (M * H), T >= 0
            (0: nothing launched). M in 1 .. 8, H a positive multiple of 64, T * M * H <= 2**30.
        pre_mix_list: L >= 1 fp32 tensors of T * M elements ((T, M) or (T, M, 1)).
        layer_output_list: L_post bf16 tensors of T * H elements, the layers' outputs.
        post_mix_list: L_post fp32 tensors of T * M elements.
        comb_mix_list: L_post fp32 tensors of T * M * M elements, row-major [input stream i, output stream o].
        layer_input_list: L bf16 tensors of T * H elements, 16-byte aligned: written.
        residual_list: L_post bf16 tensors of T * M * H elements, 16-byte aligned: written.
        Every tensor contiguous (any shape with its element count: the peer reads them through pointers) and on
        initial_residual's device; the written tensors apart from each other and from every input.

    Returns:
        None: the results are in layer_input_list and residual_list (as the peer's).
    """
    name = 'initial_residual'
    check_tensor(f'{NAME}: {name}', initial_residual, dtype=torch.bfloat16)
    if initial_residual.dim() < 2:
        raise ValueError(f'{NAME}: {name} must have at least 2 dimensions (..., mhc_mult, hidden)')
    M, H = initial_residual.shape[-2:]
    check_sizes(NAME, 0, M, H)  # mhc_mult and hidden first: T is the elements over M * H
    T = initial_residual.numel() // (M * H)
    check_sizes(NAME, T, M, H)
    pre_mix_list = _items('pre_mix_list', pre_mix_list)
    layer_output_list = _items('layer_output_list', layer_output_list)
    L, L_post = len(pre_mix_list), len(layer_output_list)
    if L < 1 or L_post not in (L, L - 1):
        raise ValueError(
            f'{NAME}: pre_mix_list must hold L >= 1 tensors and layer_output_list L or L - 1, got {L} and {L_post}'
        )
    memory = not traced(initial_residual)  # fake tensors have no addresses: the stages' ops check them later
    x = _checked(name, initial_residual, torch.bfloat16, (T, M, H), aligned=True, memory=memory)
    pre = [_checked(f'pre_mix_list[{i}]', t, torch.float32, (T, M)) for i, t in enumerate(pre_mix_list)]
    out = [_checked(f'layer_output_list[{i}]', t, torch.bfloat16, (T, H)) for i, t in enumerate(layer_output_list)]
    post = [
        _checked(f'post_mix_list[{i}]', t, torch.float32, (T, M))
        for i, t in enumerate(_items('post_mix_list', post_mix_list, L_post))
    ]
    comb = [
        _checked(f'comb_mix_list[{i}]', t, torch.float32, (T, M * M))
        for i, t in enumerate(_items('comb_mix_list', comb_mix_list, L_post))
    ]
    layer_inputs = [
        _checked(f'layer_input_list[{i}]', t, torch.bfloat16, (T, H), aligned=True, memory=memory)
        for i, t in enumerate(_items('layer_input_list', layer_input_list, L))
    ]
    residuals = [
        _checked(f'residual_list[{i}]', t, torch.bfloat16, (T, M, H), aligned=True, memory=memory)
        for i, t in enumerate(_items('residual_list', residual_list, L_post))
    ]
    read = [
        ('initial_residual', x),
        *((f'{what}[{i}]', t) for what, ts in (('pre_mix_list', pre), ('layer_output_list', out),
                                               ('post_mix_list', post), ('comb_mix_list', comb))
          for i, t in enumerate(ts)),
    ]  # fmt: skip
    written = [
        *((f'layer_input_list[{i}]', t) for i, t in enumerate(layer_inputs)),
        *((f'residual_list[{i}]', t) for i, t in enumerate(residuals)),
    ]
    if memory:
        _check_apart(read, written)
    backend = require_accelerator(*(t for _, t in (*read, *written)))  # one device, with kernels (RuntimeError)
    if not T:
        return
    # While torch traces, the composition: its stages are torch.library ops.
    if memory:
        fused_launches(backend, x, pre, out, post, comb, layer_inputs, residuals)
        return
    residual = x
    for layer in range(L):
        mhc_pre_apply_mix_fwd(residual, pre[layer], layer_inputs[layer])
        if layer < L_post:
            mhc_post_fwd(
                out[layer].view(1, T, H),
                residual.view(1, T, M, H),
                post[layer].view(1, T, M, 1),
                comb[layer].view(1, T, M, M),
                residuals[layer].view(1, T, M, H),
            )
            residual = residuals[layer]


# The fused kernel's launchers, one per (device, backend, mhc, hidden, layers, post_layers).
_KERNEL = Launchers(choose_mhc_multilayer_recompute_config, get_mhc_multilayer_recompute_kernel)


def _slots(tensors: list[torch.Tensor], dtype: torch.dtype, device) -> list[torch.Tensor]:
    """A launch's LAYERS_PER_LAUNCH slots of one list: its layers' tensors (already in the kernel's shapes), then
    placeholders."""
    missing = LAYERS_PER_LAUNCH - len(tensors)
    return tensors if not missing else [*tensors, *[placeholder(device, dtype)] * missing]


def fused_launches(backend, x, pre, out, post, comb, layer_inputs, residuals) -> None:
    """The fused kernel of `backend` on checked arguments in the kernel's shapes (x and residuals (T, M, H), pre and
    post (T, M), comb (T, M * M), outputs and layer inputs (T, H)), one launch per LAYERS_PER_LAUNCH layers; a
    launch after the first starts from the residual the previous one wrote. Slots past a launch's layers take
    placeholders."""
    _, M, H = x.shape
    L, L_post = len(pre), len(out)
    device = x.device
    residual = x
    for first in range(0, L, LAYERS_PER_LAUNCH):
        layers = min(LAYERS_PER_LAUNCH, L - first)
        posts = min(layers, L_post - first)
        launcher = _KERNEL.launcher(backend, device, mhc=M, hidden=H, layers=layers, post_layers=posts)
        launcher.launch(
            residual,
            *_slots(pre[first : first + layers], torch.float32, device),
            *_slots(out[first : first + posts], torch.bfloat16, device),
            *_slots(post[first : first + posts], torch.float32, device),
            *_slots(comb[first : first + posts], torch.float32, device),
            *_slots(layer_inputs[first : first + layers], torch.bfloat16, device),
            *_slots(residuals[first : first + posts], torch.bfloat16, device),
        )
        if posts:
            residual = residuals[first + posts - 1]
