"""batched_transpose_weight_sf: the fp32 power-of-two scales of a batch of FP8 weights -> the packed UE8M0 scale
layouts DeepGEMM reads for the weight and for its transpose, in one launch.

The operator mechanism (operator.py) declares a fixed list of tensors; this call takes lists of them, so it is
plain code: the checks below (typed errors, in the mechanism's order: types and dtypes, ranks, layouts, the
scalars, the operator's rules, the outs, the limits, last the device), then one kernel launch, its launcher from
operator.Launchers (batched_transpose_weight_sf_kernel.py says what the kernel computes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cann_ops_tilelang.config import Backend, require_accelerator
from cann_ops_tilelang.operator import Launchers
from cann_ops_tilelang.validation import check_tensor, may_overlap

from ._contract import PACKED_SF_DTYPE
from ._scale_rules import UE8M0_PACK
from .batched_transpose_weight_sf_kernel import (
    BLOCK_SIZES,
    MAX_ELEMENTS,
    WEIGHT_FIELDS,
    WEIGHT_MULTIPLE,
    choose_batched_transpose_weight_sf_config,
    get_batched_transpose_weight_sf_kernel,
    tasks_per_group,
)

_NAME = 'batched_transpose_weight_sf'
OUT_ALIGNMENT = 32  # bytes: the peer's rule for given outputs (DeepGEMM reads the scales with 16-byte loads or TMA)
# A launcher per (device, backend, block_size).
_KERNEL = Launchers(choose_batched_transpose_weight_sf_config, get_batched_transpose_weight_sf_kernel)


def _layouts(groups: int | None, sf_rows: int, sf_cols: int, block_size: int, transpose_sf1: bool):
    """((shape, strides), (shape, strides)) of sf0 and sf1 for scales (groups, sf_rows, sf_cols) (groups None: a
    2-D weight), as views of their (G, P, n) / (G, P, k) int32 storage: sf0 (n, P0) with stride (1, n); sf1 (k,
    P1) with stride (1, k), or transpose_sf1 (P1, k) with stride (k, 1)."""
    n, k = sf_rows * block_size, sf_cols * block_size
    p0, p1 = -(-sf_cols // UE8M0_PACK), -(-sf_rows // UE8M0_PACK)
    lead, lead0, lead1 = ((), (), ()) if groups is None else ((groups,), (p0 * n,), (p1 * k,))
    sf1 = ((p1, k), (k, 1)) if transpose_sf1 else ((k, p1), (1, k))
    return ((*lead, n, p0), (*lead0, 1, n)), ((*lead, *sf1[0]), (*lead1, *sf1[1]))


def _check_lists(sf, transpose_sf1s, outs) -> None:
    for what, value in (('sf', sf), ('transpose_sf1s', transpose_sf1s), ('outs', outs)):
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
            raise TypeError(f'{_NAME}: {what} must be a list or tuple, got {type(value).__name__}')
    if not len(sf) == len(transpose_sf1s) == len(outs):
        raise ValueError(
            f'{_NAME}: sf, transpose_sf1s and outs must have one entry per weight, got lengths '
            f'{len(sf)}, {len(transpose_sf1s)}, {len(outs)}'
        )


def _check_scales(sf) -> None:
    for i, s in enumerate(sf):
        check_tensor(f'{_NAME}: sf[{i}]', s, dtype=torch.float32)
        if s.dim() not in (2, 3):
            raise ValueError(
                f'{_NAME}: sf[{i}] must be (n / bs, k / bs) or (groups, n / bs, k / bs), got {tuple(s.shape)}'
            )
    for i, s in enumerate(sf):
        if not s.is_contiguous():
            raise ValueError(f'{_NAME}: sf[{i}] must be contiguous, got strides {s.stride()}')


def _check_scalars(block_size, transpose_sf1s) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f'{_NAME}: block_size must be an int, got {type(block_size).__name__}')
    for i, flag in enumerate(transpose_sf1s):
        if not isinstance(flag, bool):
            raise TypeError(f'{_NAME}: transpose_sf1s[{i}] must be a bool, got {type(flag).__name__}')


def _check_rules(sf, block_size) -> None:
    if block_size not in BLOCK_SIZES:
        raise ValueError(f'{_NAME}: block_size must be one of {BLOCK_SIZES}, got {block_size}')
    for i, s in enumerate(sf):
        sf_rows, sf_cols = s.shape[-2:]
        n, k = sf_rows * block_size, sf_cols * block_size
        if not (n and k) or n % WEIGHT_MULTIPLE or k % WEIGHT_MULTIPLE:
            raise ValueError(
                f'{_NAME}: sf[{i}] of shape {tuple(s.shape)} with block_size {block_size} is a weight of n = {n}, '
                f'k = {k}: both must be positive multiples of {WEIGHT_MULTIPLE}'
            )


def _check_outs(sf, block_size, transpose_sf1s, outs) -> None:
    device = sf[0].device
    for i, (s, flag, out) in enumerate(zip(sf, transpose_sf1s, outs, strict=True)):
        if out is None:
            continue
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f'{_NAME}: outs[{i}] must be None or a pair (sf0_out, sf1_out), got {type(out).__name__}')
        groups = s.shape[0] if s.dim() == 3 else None
        layouts = _layouts(groups, *s.shape[-2:], block_size, flag)
        for part, (buffer, (shape, strides)) in enumerate(zip(out, layouts, strict=True)):
            name = f'{_NAME}: outs[{i}][{part}]'
            check_tensor(name, buffer, dtype=PACKED_SF_DTYPE)
            if tuple(buffer.shape) != shape or buffer.stride() != strides:
                raise ValueError(
                    f'{name} must have shape {shape} and strides {strides}, got {tuple(buffer.shape)} and '
                    f'{buffer.stride()}'
                )
            if buffer.data_ptr() % OUT_ALIGNMENT:
                raise ValueError(f'{name} must start at a {OUT_ALIGNMENT}-byte aligned address')
            if buffer.device != device:
                raise RuntimeError(f'{name} must be on {device} (sf[0]), got {buffer.device}')
            for j, other in enumerate(sf):
                if may_overlap(buffer, other):
                    raise ValueError(f'{name} must not overlap the input sf[{j}]')
    written = [(f'outs[{i}][{part}]', b) for i, out in enumerate(outs) if out is not None for part, b in enumerate(out)]
    for a in range(len(written)):
        for b in range(a):
            if may_overlap(written[a][1], written[b][1]):
                raise ValueError(f'{_NAME}: {written[a][0]} must not overlap {written[b][0]}')


def _check_devices(sf) -> tuple[torch.device, Backend]:
    device = sf[0].device
    for i, s in enumerate(sf):
        if s.device != device:
            raise RuntimeError(f'{_NAME}: every sf must be on one device: sf[0] is on {device}, sf[{i}] on {s.device}')
    return device, require_accelerator(sf[0])


def batched_transpose_weight_sf(
    sf: Sequence[torch.Tensor],
    block_size: int,
    transpose_sf1s: Sequence[bool],
    outs: Sequence[tuple[torch.Tensor, torch.Tensor] | None],
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The scales of FP8 weights in the layouts DeepGEMM reads (TileKernels 2.1.0's call, same arguments and
    results), one launch for the batch.

    Weight i (n, k), quantised in blocks of block_size x block_size, has fp32 scales sf[i] of shape (n / bs, k /
    bs), or (groups, n / bs, k / bs) for grouped (expert) weights. Each scale becomes its UE8M0 byte, the biased
    exponent e = (bits >> 23) & 0xFF: exact for a positive power of two (2**m gives m + 127). Any other value is
    taken as its exponent byte too (the sign and mantissa are dropped: 3.0 and -2.0 give 128 (2.0), 0.0 and
    subnormals give 0, inf and NaN 255); the peer asserts on the device instead, which this call cannot do without
    a synchronisation. Four bytes make an int32 word, byte j in bits 8 j .. 8 j + 7:

        sf0_out (n, P0), strides (1, n): word [i, p] has byte j = e(sf[i // bs, 4 p + j]), P0 = ceil(k / bs / 4)
        sf1_out (k, P1), strides (1, k): word [c, q] has byte j = e(sf[4 q + j, c // bs]), P1 = ceil(n / bs / 4)
        transpose_sf1s[i]: sf1_out is its transpose (P1, k), strides (k, 1) (the same memory)

    with a leading groups dimension (stride P0 * n, P1 * k) for 3-D scales; a byte past the last scale block is 0.
    These are the peer's CUDA layouts on both backends (its Ascend side packs two bytes per int16 instead).

    Args:
        sf: fp32 scales per weight, contiguous, all on one device; n and k positive multiples of 128.
        block_size: 32 or 128.
        transpose_sf1s: one bool per weight.
        outs: one entry per weight: None (new outputs: views of one buffer of the batch, as the peer returns
            them) or a pair (sf0_out, sf1_out) of int32 tensors of exactly the shapes and strides above, on sf's
            device, 32-byte aligned, overlapping neither the scales nor each other, rewritten in place.

    Returns:
        One (sf0_out, sf1_out) pair per weight (outs[i] itself where given). An empty batch returns [].

    Typed errors: TypeError for wrong types and dtypes; ValueError for shapes, layouts, values and sizes (the
    scales and the outputs of one call each below 2**31 elements); RuntimeError for devices (CPU tensors need
    the Ascend emulator).
    """
    _check_lists(sf, transpose_sf1s, outs)
    _check_scales(sf)
    _check_scalars(block_size, transpose_sf1s)
    if not sf:
        return []
    _check_rules(sf, block_size)
    _check_outs(sf, block_size, transpose_sf1s, outs)

    weights, task_counts, regions = [], [], []
    num_sf = num_words = num_tasks = 0
    for s in sf:
        groups = s.shape[0] if s.dim() == 3 else 1
        sf_rows, sf_cols = s.shape[-2:]
        n, k = sf_rows * block_size, sf_cols * block_size
        sf0_words = groups * -(-sf_cols // UE8M0_PACK) * n
        sf1_words = groups * -(-sf_rows // UE8M0_PACK) * k
        tasks = groups * tasks_per_group(block_size, sf_rows, sf_cols)
        weights.append((num_tasks, groups, sf_rows, sf_cols, num_sf, num_words, num_words + sf0_words))
        regions.append((num_words, num_words + sf0_words))
        task_counts.append(tasks)
        num_sf += s.numel()
        num_words += sf0_words + sf1_words
        num_tasks += tasks
    if num_sf > MAX_ELEMENTS or num_words > MAX_ELEMENTS:
        raise ValueError(
            f'{_NAME}: the batch has {num_sf} scales and {num_words} output words; each must be below 2**31'
        )
    device, backend = _check_devices(sf)

    pool = torch.empty(num_words, dtype=PACKED_SF_DTYPE, device=device)
    pool_views = []
    for s, flag, offsets in zip(sf, transpose_sf1s, regions, strict=True):
        groups = s.shape[0] if s.dim() == 3 else None
        layouts = _layouts(groups, *s.shape[-2:], block_size, flag)
        pool_views.append(tuple(pool.as_strided(*lay, offset) for lay, offset in zip(layouts, offsets, strict=True)))
    if num_tasks:
        # The tables go to the device in one copy, from host data: no synchronisation with the device.
        table = torch.tensor(weights, dtype=torch.int32).flatten()
        task_weight = torch.repeat_interleave(torch.arange(len(sf), dtype=torch.int32), torch.tensor(task_counts))
        tables = torch.cat((table, task_weight)).to(device, non_blocking=True)
        sf_flat = sf[0].view(-1) if len(sf) == 1 else torch.cat([s.view(-1) for s in sf])
        _KERNEL.launcher(backend, device, block_size=block_size).launch(
            sf_flat, tables[: table.numel()].view(len(sf), len(WEIGHT_FIELDS)), tables[table.numel() :], pool
        )
    pairs = []
    for views, out in zip(pool_views, outs, strict=True):
        if out is None:
            pairs.append(views)
            continue
        for buffer, view in zip(out, views, strict=True):
            buffer.copy_(view)  # the same strides: a plain copy
        pairs.append(tuple(out))
    return pairs
