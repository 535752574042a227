"""Argument checks shared by the public operator interfaces.

Each check raises the exception type a caller can act on: TypeError for a wrong Python or
tensor type (including dtype), ValueError for shape/stride/layout/alignment, RuntimeError for
devices. Messages name the argument and what was expected.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch


def check_tensor(
    name: str, value, *, dtype: torch.dtype | Collection[torch.dtype], ndim: int | None = None
) -> torch.Tensor:
    """`value` is a tensor of `dtype` (or of one of several dtypes) with `ndim` dimensions."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f'{name} must be a torch.Tensor, got {type(value).__name__}')
    actual = value.dtype
    # dtypes are singletons: the identity test is the common case, without building a tuple per call
    if actual is not dtype and (isinstance(dtype, torch.dtype) or actual not in dtype):
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        raise TypeError(f'{name} must have dtype {" or ".join(map(str, allowed))}, got {actual}')
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f'{name} must have {ndim} dimensions, got shape {tuple(value.shape)}')
    return value


def check_shape(name: str, value: torch.Tensor, shape: Sequence[int]) -> None:
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f'{name} must have shape {tuple(shape)}, got {tuple(value.shape)}')


def check_contiguous(name: str, value: torch.Tensor) -> None:
    if not value.is_contiguous():
        raise ValueError(f'{name} must be contiguous, got strides {value.stride()} for shape {tuple(value.shape)}')


def check_strides(name: str, value: torch.Tensor, strides: Sequence[int]) -> None:
    """`value` has `strides` where they address anything: a dimension of size 1 may have any stride, an empty
    tensor any strides (as torch's is_contiguous reads a contiguous layout)."""
    if value.numel() == 0:
        return
    got = value.stride()
    if any(n > 1 and g != s for n, g, s in zip(value.shape, got, strides, strict=True)):
        raise ValueError(
            f'{name} must have strides {tuple(strides)} for shape {tuple(value.shape)} (the layout the call '
            f'returns), got {got}'
        )


def check_last_dim_contiguous(name: str, value: torch.Tensor) -> None:
    """The innermost dimension has stride 1; outer strides are free (non-negative)."""
    if value.dim() and value.shape[-1] > 1 and value.stride(-1) != 1:
        raise ValueError(f'{name} must have a contiguous last dimension (stride 1), got strides {value.stride()}')
    if any(s < 0 for s in value.stride()):
        raise ValueError(f'{name} must not have negative strides, got {value.stride()}')


# Tensors that take an operator's eager route (weights arrive as parameters); subclasses (FakeTensor,
# functional tensors) go through its torch.library op, and the eager fast paths take only these.
PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)

ALIGN_BYTES = 16  # the kernels move 16-byte vectors (CUDA cp.async / uint4 / TMA, Ascend DMA bursts)


def check_aligned(name: str, value: torch.Tensor, *, memory: bool = True) -> None:
    """`value` starts at an ALIGN_BYTES-aligned address (memory=False, fake tensors while torch traces: not
    checked here, but when the traced op runs on real tensors)."""
    if memory and value.data_ptr() % ALIGN_BYTES != 0:
        raise ValueError(
            f'{name} must start at a {ALIGN_BYTES}-byte aligned address, got data_ptr() = {value.data_ptr():#x}'
        )


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f'{name} must be a bool, got {type(value).__name__}')
    return value


def check_int(name: str, value) -> int:
    """A Python int (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f'{name} must be an int, got {type(value).__name__}')
    return value


def check_str(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f'{name} must be a str, got {type(value).__name__}')
    return value


def check_ints(name: str, value) -> tuple[int, ...]:
    """A tuple or list of Python ints (bools are not), returned as a tuple."""
    if not isinstance(value, (tuple, list)) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise TypeError(f'{name} must be a tuple of ints, got {value!r}')
    return tuple(value)


def check_parts(name: str, value, parts: Sequence[str]) -> tuple:
    """A tuple (or list) of len(parts) items, such as a quantised tensor (data, sf); each item's own checks come
    after, naming it `name[i]`."""
    if not isinstance(value, (tuple, list)) or len(value) != len(parts):
        raise TypeError(
            f'{name} must be a tuple ({", ".join(parts)}) of {len(parts)} tensors, got {type(value).__name__}'
            + (f' of length {len(value)}' if isinstance(value, (tuple, list)) else '')
        )
    return tuple(value)


def check_positive_float(name: str, value) -> float:
    """A finite float > 0 (ints are accepted and converted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f'{name} must be a float, got {type(value).__name__}')
    value = float(value)
    if not (value > 0.0 and value != float('inf')):
        raise ValueError(f'{name} must be a finite number > 0, got {value}')
    return value


def check_finite_float(name: str, value) -> float:
    """A finite float of any sign (ints are accepted and converted; bools are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f'{name} must be a float, got {type(value).__name__}')
    value = float(value)
    if value != value or value in (float('inf'), float('-inf')):
        raise ValueError(f'{name} must be a finite number, got {value}')
    return value


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    if t.is_contiguous():  # the common case, without a Python loop over the dimensions
        return (start, start + t.nbytes)
    if t.numel() == 0:
        return (start, start)
    extent = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True)) + 1
    return (start, start + extent * t.element_size())


def span_bytes(t: torch.Tensor) -> int:
    """Bytes from t's first byte to its last: nbytes, or more for a strided view with gaps between its rows."""
    start, end = _byte_span(t)
    return end - start


def _steps(t: torch.Tensor) -> list[tuple[int, int]]:
    """(index range, byte stride) of each dimension of t that has more than one index."""
    size = t.element_size()
    return [(n - 1, stride * size) for n, stride in zip(t.shape, t.stride(), strict=True) if n > 1]


def _apart_by_period(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether, for a period among the two tensors' byte strides, their bytes modulo it lie in disjoint arcs (then
    no byte is shared): views of one buffer that interleave, such as the query and key heads of a fused qkv
    projection, or the columns of a matrix split in two. A tensor's arc modulo a period starts at its first byte;
    the dimensions whose strides are multiples of the period add nothing to it, the others their extent."""
    steps_a, steps_b = _steps(a), _steps(b)
    size_a, size_b = a.element_size(), b.element_size()
    start_a, start_b = a.data_ptr(), b.data_ptr()
    for period in sorted({step for _, step in steps_a + steps_b} - {0}, reverse=True):
        arc_a = size_a + sum(n * step for n, step in steps_a if step % period)
        arc_b = size_b + sum(n * step for n, step in steps_b if step % period)
        if arc_a <= period and arc_b <= period:
            x, y = start_a % period, start_b % period
            if (y - x) % period >= arc_a and (x - y) % period >= arc_b:
                return True
    return False


def may_overlap(a: torch.Tensor, b: torch.Tensor, *, memory: bool = True) -> bool:
    """Whether two tensors may share memory: their byte ranges intersect and, for strided views, no period of their
    strides keeps them apart (_apart_by_period; still conservative where none proves it).

    With memory=False (tensors without storage: fake tensors while torch traces) only the same tensor
    passed twice counts; the memory ranges are checked when the traced op runs on real tensors."""
    if not memory:
        return a is b
    a0, a1 = _byte_span(a)
    b0, b1 = _byte_span(b)
    # Addresses of different devices may coincide: the device comparison (two torch.device objects) only
    # where the ranges intersect.
    if not (a0 < b1 and b0 < a1 and a.device == b.device):
        return False
    return (a.is_contiguous() and b.is_contiguous()) or not _apart_by_period(a, b)


def check_no_overlap(
    name: str, value: torch.Tensor, others: dict[str, torch.Tensor], *, what: str, memory: bool = True
) -> None:
    """ValueError naming both when `value` (written: `what`) may share memory with one of `others`
    (memory=False: see may_overlap)."""
    for other_name, other in others.items():
        if other is not value and may_overlap(value, other, memory=memory):
            raise ValueError(f'{name} ({what}) must not overlap the input {other_name}')


def check_out(
    name: str,
    out,
    *,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    inputs: dict[str, torch.Tensor],
    memory: bool = True,
    strides: Sequence[int] | None = None,
) -> torch.Tensor:
    """Validate a caller-provided output buffer: type, dtype, shape, device, contiguity (or, given `strides`, those
    strides: check_strides), aliasing (memory=False: see may_overlap)."""
    check_tensor(name, out, dtype=dtype)
    check_shape(name, out, shape)
    if out.device != device:
        raise RuntimeError(f'{name} must be on {device}, got {out.device}')
    if strides is None:
        check_contiguous(name, out)
    else:
        check_strides(name, out, strides)
    for input_name, value in inputs.items():
        if value is not None and may_overlap(out, value, memory=memory):
            raise ValueError(f'{name} must not alias the input {input_name}')
    return out


def batch_rows(name: str, label: str, value, lead: tuple[int, ...]):
    """A tensor of a batched call, (*lead, ...), as the rows its unbatched call takes, (prod(lead), ...): a view, so
    a buffer written through it is the caller's. None, and what is not a tensor (the unbatched call's checks name
    it), pass as they are; ValueError for another leading shape or rows that no view can merge."""
    if not isinstance(value, torch.Tensor):
        return value
    if tuple(value.shape[: len(lead)]) != lead or value.dim() <= len(lead):
        raise ValueError(f'{name}: {label} must have the batch and tokens of x, {lead}, got shape {tuple(value.shape)}')
    try:
        return value.view(-1, *value.shape[len(lead) :])
    except (RuntimeError, ValueError):  # torch's view error (ValueError on fake tensors)
        raise ValueError(
            f'{name}: the batches of {label} must be one batch of rows apart (its rows merge into one (B * T, ...) '
            f'view; the last dimension contiguous), got strides {value.stride()} for shape {tuple(value.shape)}'
        ) from None


def is_strided(t: torch.Tensor | None) -> bool:
    """Whether t's rows are apart by another stride than its row length (a view of a wider buffer); one row: any
    stride is contiguous."""
    return t is not None and t.shape[0] > 1 and t.stride(0) != t.shape[1]


def check_row_starts(name: str, memory: bool, **tensors) -> bool:
    """TileKernels' strided rows (the last dimension contiguous, declared layout 'rows'): each row of a strided
    tensor must start on ALIGN_BYTES (16) bytes, the kernels' vector accesses; ValueError naming the tensor.
    Returns whether any of them is strided (the kernels of strided rows then run). None and contiguous tensors
    pass (fake tensors, memory=False: their strides only)."""
    strided = False
    for label, t in tensors.items():
        if not is_strided(t):
            continue
        strided = True
        misaligned = t.stride(0) * t.element_size() % ALIGN_BYTES or (memory and t.data_ptr() % ALIGN_BYTES)
        if misaligned:
            raise ValueError(
                f'{name}: the rows of a strided {label} must each start on {ALIGN_BYTES} bytes, got row stride '
                f'{t.stride(0)} ({t.element_size()}-byte elements) and data_ptr() = {t.data_ptr() if memory else "?"}'
            )
    return strided
