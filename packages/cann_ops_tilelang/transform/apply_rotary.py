"""apply_rotary: rotary position embedding of query (and key), in place (TileKernels 2.1.0's call)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, scalar, tensor

from .apply_rotary_kernel import (
    ACCESS_BYTES,
    DTYPE_NAMES,
    ROT_DIMS,
    choose_apply_rotary_config,
    get_apply_rotary_kernel,
)

# The kernels index x, the cache and positions with int32: every element offset of each stays below this.
MAX_SPAN = 2**31 - 1
_OFFSET_RANGE = (-(2**31), 2**31 - 1)  # seqlen_offset is the kernels' int32 argument
_CACHE_ACCESS_ELEMENTS = 4  # the widest cos/sin access of the CUDA kernel (16 bytes of fp32)


def _span(x: torch.Tensor) -> int:
    """Elements from x's first to its last element, inclusive (0 for an empty tensor)."""
    if x.is_contiguous() or x.numel() == 0:
        return x.numel()
    return 1 + sum((size - 1) * stride for size, stride in zip(x.shape, x.stride(), strict=True))


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """(tokens, heads, rot_dim) as (1, tokens, heads, rot_dim): the kernels' layout."""
    return x if x.dim() == 4 else x.unsqueeze(0)


def _access_width(x: torch.Tensor, limit_bytes: int) -> int:
    """Elements of the widest access (up to `limit_bytes`) that x's address and outer strides are multiples of
    (a 3-D x's batch stride as the kernels see it, tokens * stride(0), is a multiple of stride(0))."""
    size = x.element_size()
    bits = x.data_ptr() | limit_bytes
    for stride in x.stride()[:-1]:
        bits |= stride * size
    return (bits & -bits) // size


def _limits(name, seqlen_ro, rot_dim):
    if rot_dim not in ROT_DIMS:
        raise ValueError(
            f'{name}: cos_sin_cache.shape[1] (rot_dim) must be a multiple of 32 in [32, 256], got {rot_dim}'
        )
    if seqlen_ro < 1:
        raise ValueError(f'{name}: cos_sin_cache must have at least one row, got shape ({seqlen_ro}, {rot_dim})')


def _check_rotated(name, label, x, query, rot_dim):
    """query or key: 3-D or 4-D, rot_dim wide, within the int32 index range; key like query but its heads."""
    if x.dim() not in (3, 4) or x.shape[-2] == 0:
        raise ValueError(
            f'{name}: {label} must be (tokens, heads, rot_dim) or (batch, seqlen, heads, rot_dim) with heads >= 1, '
            f'got shape {tuple(x.shape)}'
        )
    if x is not query:
        if x.dtype != query.dtype:
            raise TypeError(f'{name}: key must have the dtype of query ({query.dtype}), got {x.dtype}')
        if x.dim() != query.dim() or x.shape[:-2] != query.shape[:-2]:
            raise ValueError(
                f'{name}: key must have the tokens of query, {tuple(query.shape[:-2])} then (heads, rot_dim), '
                f'got shape {tuple(x.shape)}'
            )
    if x.shape[-1] != rot_dim:
        raise ValueError(
            f'{name}: the last dimension of {label} must be rot_dim = cos_sin_cache.shape[1] = {rot_dim} (a partial '
            f'rotary view such as q[..., :rot_dim] is taken as it is), got shape {tuple(x.shape)}'
        )
    if _span(x) > MAX_SPAN:
        raise ValueError(f'{name}: {label} must span at most {MAX_SPAN} elements (int32 indices), got {_span(x)}')


def _extra(name, query, cos_sin_cache, key, positions, seqlen_offset, seqlen_ro, rot_dim):
    _check_rotated(name, 'query', query, query, rot_dim)
    if key is not None:
        _check_rotated(name, 'key', key, query, rot_dim)
    if _span(cos_sin_cache) > MAX_SPAN:
        raise ValueError(f'{name}: cos_sin_cache must span at most {MAX_SPAN} elements (int32 indices)')
    if not _OFFSET_RANGE[0] <= seqlen_offset <= _OFFSET_RANGE[1]:
        raise ValueError(f'{name}: seqlen_offset must fit int32, got {seqlen_offset}')
    tokens = tuple(query.shape[:-2])
    if positions is not None:
        if tuple(positions.shape) != tokens:
            raise ValueError(
                f'{name}: positions must have shape {tokens} (the tokens of query), got {tuple(positions.shape)}'
            )
        if _span(positions) > MAX_SPAN:
            raise ValueError(f'{name}: positions must span at most {MAX_SPAN} elements (int32 indices)')
    elif not 0 <= seqlen_offset <= seqlen_ro - tokens[-1]:
        # Without positions the rows seqlen_offset .. seqlen_offset + seqlen - 1 are read: checked here, no sync.
        raise ValueError(
            f'{name}: without positions, cos_sin_cache rows seqlen_offset .. seqlen_offset + seqlen - 1 are read: '
            f'seqlen_offset must be in [0, {seqlen_ro - tokens[-1]}] for seqlen {tokens[-1]} and {seqlen_ro} rows, '
            f'got {seqlen_offset}'
        )


def _choice(query, cos_sin_cache, key, positions, interleaved, backend):
    """The CUDA kernel rotates query and key in one launch; the Ascend kernel one tensor (key: see _eager)."""
    if backend != 'cuda':
        return {
            'dtype': query.dtype,
            'rot_dim': cos_sin_cache.shape[1],
            'heads': query.shape[-2],
            'interleaved': interleaved,
            'positions': None if positions is None else positions.dtype,
        }
    vec = _access_width(query, ACCESS_BYTES)
    if key is not None:
        vec = min(vec, _access_width(key, ACCESS_BYTES))
    return {
        'dtype': query.dtype,
        'rot_dim': cos_sin_cache.shape[1],
        'heads': query.shape[-2],
        'interleaved': interleaved,
        'positions': None if positions is None else positions.dtype,
        'key_heads': 0 if key is None else key.shape[-2],
        'vec': vec,
        'cs_vec': _access_width(cos_sin_cache, _CACHE_ACCESS_ELEMENTS * 4),
    }


DTYPES = tuple(DTYPE_NAMES)
# The contract, checked in the mechanism's order: types and dtypes (TypeError), layouts and sizes (ValueError),
# query and key apart from each other and from the inputs (ValueError), then the device (RuntimeError).
OP = Operator(
    'apply_rotary',
    tensor('query', DTYPES, layout='rows', written='updated'),
    tensor('cos_sin_cache', torch.float32, 'seqlen_ro, rot_dim', layout='rows'),
    tensor('key', DTYPES, layout='rows', optional=True, written='updated', fast_when_given=True),
    tensor('positions', (torch.int32, torch.int64), layout='rows', optional=True),
    scalar('interleaved', 'bool'),
    scalar('conjugate', 'bool'),
    scalar('seqlen_offset', 'int'),
    limits=_limits,
    extra=_extra,
    choice=_choice,
    choose_config=choose_apply_rotary_config,
    get_kernel=get_apply_rotary_kernel,
)


def _tail(positions, interleaved, conjugate, seqlen_offset) -> tuple:
    """The launch arguments after the tensors rotated and the cache: positions (batch, seqlen) where given, the
    offset, sin's sign (the inverse rotation negates sin)."""
    tail = (seqlen_offset, -1.0 if conjugate else 1.0)
    return tail if positions is None else (positions if positions.dim() == 2 else positions.unsqueeze(0), *tail)


def _fast_key(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset) -> tuple | None:
    """The fast path's key of a call (CUDA, tokens, OP.fast_ok's checks passed; None: the full path decides): the
    configuration's choice, which the key holds whole, and the rank. Here too, what the compiled entry cannot
    check: the int32 spans, the offset, and without positions the cache rows read."""
    shape = OP.fast_ok(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset)
    if shape is None or len(shape) not in (3, 4) or not query.numel() or (key is not None and key.dim() != len(shape)):
        return None
    rows = cos_sin_cache.shape[0]
    if positions is None and not 0 <= seqlen_offset <= rows - shape[-3]:
        return None
    if not (_OFFSET_RANGE[0] <= seqlen_offset <= _OFFSET_RANGE[1] and rows and _span(query) <= MAX_SPAN):
        return None
    if any(t is not None and _span(t) > MAX_SPAN for t in (key, cos_sin_cache, positions)):
        return None
    choice = _choice(query, cos_sin_cache, key, positions, interleaved, 'cuda')
    return (query.get_device(), len(shape), *choice.values())


def _eager(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset) -> None:
    """A call on real tensors (also the kernel of the torch.library form): every check (or the fast path's), then,
    for tokens, one launch on CUDA (query and key together), one per tensor on Ascend (query, then key with its
    head count)."""
    args = (query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset)
    fast_key = _fast_key(*args)
    if fast_key is not None:  # CUDA, with tokens: one launch of a remembered launcher
        launcher, fast = OP.prepare(fast_key, args)
        launch_args = (_as_4d(query), *(() if key is None else (_as_4d(key),)), cos_sin_cache, *_tail(*args[3:]))
        OP.finish(launcher, fast, fast_key, launch_args, args, empty=False)
        return
    launcher = OP.plan(*args)
    if not query.numel():  # no tokens (heads and rot_dim are >= 1): nothing to launch
        return
    tail = _tail(*args[3:])
    backend = launcher.cfg.backend
    if backend == 'cuda' and key is not None:
        launcher.launch(_as_4d(query), _as_4d(key), cos_sin_cache, *tail)
        return
    launcher.launch(_as_4d(query), cos_sin_cache, *tail)
    if key is not None:
        choice = _choice(key, cos_sin_cache, None, positions, interleaved, backend)
        OP.launcher(backend, key.device, **choice).launch(_as_4d(key), cos_sin_cache, *tail)


def _returns_none(query, key) -> None:
    """The traced call's result: nothing, as the eager one (query and key are updated in place)."""


@OP.public(_eager, result=_returns_none)
def apply_rotary(
    query: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    key: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    interleaved: bool = False,
    conjugate: bool = False,
    seqlen_offset: int = 0,
) -> None:
    """Rotary position embedding of query and key, in place. Token t rotates by the cos/sin row

        row = clamp(positions[t] + seqlen_offset, 0, seqlen_ro - 1)   with positions
        row = seqlen_offset + s                                       without (s: the token's index in its sequence)

    each pair (x1, x2) of every head, pair j by the angle of (cos, sin) = (cache[row, j], cache[row, rot_dim / 2 + j]):

        x1' = x1 cos - x2 sin,  x2' = x1 sin + x2 cos          (conjugate: sin -> -sin, the inverse rotation)

    with NeoX pairs (x[j], x[j + rot_dim / 2]) or, interleaved, GPT-J pairs (x[2j], x[2j + 1]). Computed in fp32
    (two roundings per element: a product and a fused multiply-add), rounded to x's dtype.

    Args:
        query: (tokens, heads, rot_dim) or (batch, seqlen, heads, rot_dim), heads >= 1, bf16, fp16 or fp32, updated
            in place;
            its last dimension contiguous, the other strides free: a partial rotary view q[..., :rot_dim] (GPT-NeoX
            rotary_pct) or q[..., -rot_dim:] (DeepSeek MLA) of a wider head is rotated where it lies. At most 2**31
            - 1 elements from its first to its last element.
        cos_sin_cache: (seqlen_ro, rot_dim) fp32, last dimension contiguous, seqlen_ro >= 1; cos in the first half of
            a row, sin in the second. rot_dim: a multiple of 32 in [32, 256].
        key: None, or like query (same dtype, rank and tokens) with its own number of heads (GQA / MQA), updated in
            place; query and key must not share a byte (the query and key heads of one fused qkv buffer, whose
            token rows interleave, do not).
        positions: None, or int32 / int64 of shape (tokens,) / (batch, seqlen), last dimension contiguous. A row
            outside [0, seqlen_ro) after adding seqlen_offset is clamped into it (read on the device: no host
            sync, no fault).
        interleaved: GPT-J pairing when True, NeoX half-split when False.
        conjugate: the inverse rotation (sin negated).
        seqlen_offset: int32, added to every position; without positions it must keep the rows read,
            seqlen_offset .. seqlen_offset + seqlen - 1, inside the cache (ValueError otherwise).

    Returns None (as TileKernels). Without tokens nothing is launched; on CUDA query and key are rotated in one
    launch, on Ascend in one each.
    """
