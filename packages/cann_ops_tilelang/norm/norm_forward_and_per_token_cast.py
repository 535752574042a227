"""norm_forward_and_per_token_cast: norm_forward's RMSNorm, its output cast to e4m3 with per-token block scales
(docs/norm.md): per_token_cast(norm_forward(x).out) bit for bit, in one pass over memory."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from cann_ops_tilelang.operator import Operator, new_output, scalar, tensor
from cann_ops_tilelang.quant import _contract as contract
from cann_ops_tilelang.quant._quant_tensor import QuantTensor
from cann_ops_tilelang.quant.per_token_cast import sf_layout
from cann_ops_tilelang.quant.per_token_cast_kernel import CAST_BLOCK_SIZES, CAST_HIDDEN_UNIT
from cann_ops_tilelang.validation import batch_rows, check_out, check_row_starts

from ._norm_common import any_strided, check_hidden, check_same_dtype, forward_launch_args
from .norm_forward import DTYPES
from .norm_forward_kernel import CAST_FORMATS, choose_norm_forward_config, get_norm_forward_kernel


class NormForwardAndPerTokenCastResult(NamedTuple):
    out: QuantTensor  # (data (T, H) float8_e4m3fn, sf)
    out_bf16: torch.Tensor | None  # (T, H) bf16 with with_out_bf16
    rstd: torch.Tensor | None  # (T,) fp32 with with_rstd
    norm_input: torch.Tensor  # residual_out (x + residual), or x itself without residual


def _results(x, num_per_channels, use_packed_ue8m0, col_major=False):
    """(shape, dtype) of data, (shape, dtype[, strides]) of sf: per_token_cast's layouts (column-major scales:
    its strides, the peer's rule on x's backend)."""
    sf = contract.scale_result(sf_layout(*x.shape, num_per_channels, use_packed_ue8m0), col_major, x.device)
    return (tuple(x.shape), torch.float8_e4m3fn), sf


def _new_outputs(x, num_per_channels, use_packed_ue8m0, col_major) -> tuple:
    """New (data, sf) of these layouts (the eager path and the fake kernels alike)."""
    return tuple(new_output(x, layout) for layout in _results(x, num_per_channels, use_packed_ue8m0, col_major))


def _options(name, x, weight, fmt, num_per_channels, residual, use_tma_aligned_col_major_sf, round_sf,
             use_packed_ue8m0, with_out_bf16, out, out_bf16, residual_out, mega_moe_sf, mega_moe_block_m,
             memory):  # fmt: skip
    check_same_dtype(name, x, weight=weight, residual=residual, residual_out=residual_out)
    check_row_starts(name, memory, x=x, residual=residual, out_bf16=out_bf16,
               residual_out=residual_out if residual is not None else None)  # fmt: skip
    contract.check_cast_format(name, fmt, CAST_FORMATS)
    contract.check_block(name, 'num_per_channels', num_per_channels, CAST_BLOCK_SIZES)
    contract.check_unsupported(name, mega_moe_sf=mega_moe_sf is not None, mega_moe_block_m=mega_moe_block_m)
    contract.check_scale_flags(name, round_sf, use_packed_ue8m0)
    contract.check_hidden(name, x.shape[1], CAST_HIDDEN_UNIT, 'whole 64-lane registers')  # per_token_cast's H
    if out_bf16 is not None and not with_out_bf16:
        raise ValueError(f'{name}: out_bf16 needs with_out_bf16=True')
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(f'{name}: out must be a tuple (data, sf) of tensors, got {type(out).__name__}')
        others = {'x': x, 'weight': weight, 'residual': residual, 'out_bf16': out_bf16, 'residual_out': residual_out}
        others = {k: v for k, v in others.items() if v is not None}
        layouts = _results(x, num_per_channels, use_packed_ue8m0, use_tma_aligned_col_major_sf)
        for i, (layout, part) in enumerate(zip(layouts, out, strict=False)):
            strides = layout[2] if len(layout) > 2 else None
            check_out(f'out[{i}]', part, shape=layout[0], dtype=layout[1], device=x.device, inputs=others,
                      memory=memory, strides=strides)  # fmt: skip
            others[f'out[{i}]'] = part


def _strided(x, residual, out_bf16, residual_out) -> bool:
    """Whether the call takes the kernels of strided rows (residual_out counts only with residual)."""
    return any_strided(x, residual, out_bf16, residual_out if residual is not None else None)


def _choice(x, weight, num_per_channels, residual, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
            with_out_bf16, out_bf16, residual_out, with_rstd):  # fmt: skip
    return {
        'hidden': x.shape[1],
        'dtype': x.dtype,
        'with_weight': weight is not None,
        'with_residual': residual is not None,
        'with_rstd': with_rstd,
        'block_size': num_per_channels,
        'round_sf': round_sf,
        'packed_ue8m0': use_packed_ue8m0,
        'with_out_bf16': with_out_bf16,
        'col_major_sf': use_tma_aligned_col_major_sf,
        'strided_rows': _strided(x, residual, out_bf16, residual_out),
    }


OP = Operator(
    'norm_forward_and_per_token_cast',
    tensor('x', DTYPES, 'T, H', layout='rows'),
    tensor('weight', DTYPES, 'H', optional=True),
    scalar('eps', 'positive'),
    scalar('fmt', 'str'),
    scalar('num_per_channels', 'int'),
    tensor('residual', DTYPES, 'T, H', optional=True, layout='rows'),
    scalar('out_scale', 'float'),
    scalar('use_tma_aligned_col_major_sf', 'bool'),
    scalar('round_sf', 'bool'),
    scalar('use_packed_ue8m0', 'bool'),
    scalar('with_out_bf16', 'bool'),
    scalar('out', 'any', optional=True),
    tensor('out_bf16', torch.bfloat16, 'T, H', optional=True, written='written', layout='rows'),
    tensor('residual_out', DTYPES, 'T, H', optional=True, written='written', layout='rows'),
    tensor('mega_moe_sf', torch.int32, optional=True),
    scalar('mega_moe_block_m', 'int'),
    scalar('with_rstd', 'bool'),
    limits=check_hidden,
    extra=_options,
    choice=_choice,
    choose_config=choose_norm_forward_config,
    get_kernel=get_norm_forward_kernel,
)


def _run(*args, rstd=None) -> NormForwardAndPerTokenCastResult:
    """Every check (or the fast path's), the outputs the call did not give, the launch (none for T = 0). Fast
    path, without out= and TileKernels' options these kernels do not take, for T > 0: by (H, dtype, CUDA index,
    weight given, residual given, fmt, block, round_sf, packed, with_out_bf16, with_rstd, column-major scales), for
    contiguous rows (strided rows take the full check, their alignment included); a key is remembered only after
    a fully checked call with it, so an unsupported fmt or block never takes it.
    Column-major scales reach the kernel transposed, sf.T (UE8M0 bytes: sf.T.view(torch.uint8))."""
    (x, weight, eps, fmt, num_per_channels, residual, out_scale, col_major, round_sf, packed, with_out_bf16, out,
     out_bf16, residual_out, mega_moe_sf, mega_moe_block_m, with_rstd) = args  # fmt: skip
    key = None
    if out is None and mega_moe_sf is None and mega_moe_block_m == 0:
        shape = OP.fast_ok(*args)
        if shape is not None and shape[0] and not _strided(x, residual, None, None):
            key = (shape[1], x.dtype, x.get_device(), weight is None, residual is None, fmt, num_per_channels,
                   round_sf, packed, with_out_bf16, with_rstd, col_major)  # fmt: skip
    launcher, fast = OP.prepare(key, args)
    if out is None:
        out = _new_outputs(x, num_per_channels, packed, col_major)
    data, sf = out
    kernel_sf = sf.T if col_major else sf
    if with_out_bf16 and out_bf16 is None:
        out_bf16 = x.new_empty(x.shape, dtype=torch.bfloat16)
    if residual is not None and residual_out is None:
        residual_out = x.new_empty(x.shape)
    if with_rstd and rstd is None:
        rstd = x.new_empty(x.shape[:1], dtype=torch.float32)
    # bf16 x: its bf16 output is y itself, the kernel's `out`; fp32 x: a separate bf16 row.
    y_out, bf16_out = (out_bf16, None) if x.dtype == torch.bfloat16 else (None, out_bf16)
    launch_args = forward_launch_args(
        x, weight, residual, residual_out, y_out, rstd, data, kernel_sf.view(torch.uint8) if packed else kernel_sf,
        bf16_out,
        eps, out_scale,
    )  # fmt: skip
    OP.finish(launcher, fast, key, launch_args, args, empty=not x.shape[0])
    norm_input = x if residual is None else residual_out
    return tuple.__new__(NormForwardAndPerTokenCastResult, (QuantTensor(data, sf), out_bf16, rstd, norm_input))


def _eager(*args) -> NormForwardAndPerTokenCastResult:
    return _run(*args)


def _fake(*args) -> NormForwardAndPerTokenCastResult:
    """While torch traces: what `_run` returns (new tensors contiguous, column-major scales of their strides)."""
    OP.check(*args, memory=False)
    x, num_per_channels, residual, col_major, packed, with_out_bf16, out, out_bf16, residual_out, with_rstd = (
        args[i] for i in (0, 4, 5, 7, 9, 10, 11, 12, 13, 16)
    )
    if out is None:
        out = _new_outputs(x, num_per_channels, packed, col_major)
    if with_out_bf16 and out_bf16 is None:
        out_bf16 = x.new_empty(x.shape, dtype=torch.bfloat16)
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x)
    rstd = x.new_empty(x.shape[:1], dtype=torch.float32) if with_rstd else None
    norm_input = x if residual is None else residual_out
    return NormForwardAndPerTokenCastResult(QuantTensor(*out), out_bf16, rstd, norm_input)


def _public(x, w, eps, fmt, bs, res, scale, col_major, round_sf, packed, with_bf16, out=None, out_bf16=None,
            res_out=None, with_rstd=False) -> tuple:  # fmt: skip
    """The public arguments of an op call (TileKernels' options these kernels do not take at their defaults)."""
    return (x, w, eps, fmt, bs, res, scale, col_major, round_sf, packed, with_bf16, out, out_bf16, res_out, None, 0,
            with_rstd)  # fmt: skip


def _listed(result: NormForwardAndPerTokenCastResult, residual) -> list:
    """The functional op's outputs: data, sf, then out_bf16, rstd and residual_out where the call makes them."""
    optional = [result.out_bf16, result.rstd, None if residual is None else result.norm_input]
    return [*result.out, *(t for t in optional if t is not None)]


_HEAD = (
    'Tensor x, Tensor? weight, float eps, str fmt, int num_per_channels, Tensor? residual, float out_scale, '
    'bool use_tma_aligned_col_major_sf, bool round_sf, bool use_packed_ue8m0, bool with_out_bf16'
)
_functional = OP.define(
    'norm_forward_and_per_token_cast',
    f'({_HEAD}, bool with_rstd) -> Tensor[]',
    lambda *a: _listed(_eager(*_public(*a[:-1], with_rstd=a[-1])), a[5]),
    lambda *a: _listed(_fake(*_public(*a[:-1], with_rstd=a[-1])), a[5]),
)
_into = OP.define(
    'norm_forward_and_per_token_cast_out',
    f'({_HEAD}, Tensor(a!) out_data, Tensor(b!) out_sf, Tensor(c!)? out_bf16, Tensor(d!)? residual_out, '
    'Tensor(e!)? rstd) -> ()',
    lambda *a: _run(*_public(*a[:11], (a[11], a[12]), a[13], a[14], a[15] is not None), rstd=a[15]),
    lambda *a: None,
)


def _traced(*args) -> NormForwardAndPerTokenCastResult:
    """torch.compile, fake tensors, make_fx: the op of the call's form."""
    (x, weight, eps, fmt, num_per_channels, residual, out_scale, col_major, round_sf, packed, with_out_bf16, out,
     out_bf16, residual_out, _, _, with_rstd) = args  # fmt: skip
    head = (x, weight, float(eps), fmt, num_per_channels, residual, float(out_scale), col_major, round_sf, packed,
            with_out_bf16)  # fmt: skip
    if out is None and out_bf16 is None and residual_out is None:
        values = iter(_functional(*head, with_rstd))
        data, sf = next(values), next(values)
        bf16 = next(values) if with_out_bf16 else None
        rstd = next(values) if with_rstd else None
        norm_input = x if residual is None else next(values)
        return NormForwardAndPerTokenCastResult(QuantTensor(data, sf), bf16, rstd, norm_input)
    result = _fake(*args)  # the buffers the call did not give
    _into(*head, *result.out, result.out_bf16, None if residual is None else result.norm_input, result.rstd)
    return result


def _batched(function, x, weight, eps, fmt, num_per_channels, residual, out_scale, use_tma_aligned_col_major_sf,
             round_sf, use_packed_ue8m0, with_out_bf16, out, out_bf16, residual_out, mega_moe_sf, mega_moe_block_m,
             with_rstd) -> NormForwardAndPerTokenCastResult:  # fmt: skip
    """A (B, T, H) x (the peer's batched call): the call on its B * T rows, the results (B, T, ...); column-major
    scales per batch (_batched_col_major)."""
    if use_tma_aligned_col_major_sf:
        return _batched_col_major(function, x, weight, eps, fmt, num_per_channels, residual, out_scale, round_sf,
                                  use_packed_ue8m0, with_out_bf16, out, out_bf16, residual_out, mega_moe_sf,
                                  mega_moe_block_m, with_rstd)  # fmt: skip
    lead = tuple(x.shape[:2])
    rows = functools.partial(batch_rows, 'norm_forward_and_per_token_cast', lead=lead)
    flat_out = out
    if isinstance(out, tuple) and len(out) == 2:
        flat_out = (rows('out[0]', out[0]), rows('out[1]', out[1]))
    residual_out = None if residual is None else residual_out  # ignored without residual, as unbatched
    flat = function(
        rows('x', x), weight, eps, fmt, num_per_channels, rows('residual', residual), out_scale,
        use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, with_out_bf16, flat_out, rows('out_bf16', out_bf16),
        rows('residual_out', residual_out), mega_moe_sf, mega_moe_block_m, with_rstd,
    )  # fmt: skip
    data, sf = flat.out
    if out is None:
        out = QuantTensor(data.view(x.shape), sf.view(*lead, *sf.shape[1:]))
    norm_input = x if residual is None else residual_out if residual_out is not None else flat.norm_input.view(x.shape)
    return NormForwardAndPerTokenCastResult(
        QuantTensor(*out),
        None if flat.out_bf16 is None else out_bf16 if out_bf16 is not None else flat.out_bf16.view(x.shape),
        None if flat.rstd is None else flat.rstd.view(lead),
        norm_input,
    )


def _batch(t: torch.Tensor | None, b: int) -> torch.Tensor | None:
    """Batch b of t, a view (select: an int index of a fake CUDA tensor needs CUDA, which a CPU-only host lacks)."""
    return None if t is None else t.select(0, b)


def _batched_col_major(function, x, weight, eps, fmt, num_per_channels, residual, out_scale, round_sf,
                       use_packed_ue8m0, with_out_bf16, out, out_bf16, residual_out, mega_moe_sf, mega_moe_block_m,
                       with_rstd) -> NormForwardAndPerTokenCastResult:  # fmt: skip
    """use_tma_aligned_col_major_sf with a (B, T, H) x, in the peer's layout: each batch's (T, K) scales column-major
    in a block of their own, (B, T, K) of strides (K * T_pad, 1, T_pad) over a (B * K, T_pad) buffer (T_pad as the
    2-D call's). A batch's block is the 2-D call's layout of its T rows, which no view of the B * T rows' scales
    gives, so the call runs once per batch (B launches) into its views. A given `out` is refused, as the peer
    refuses it with this option."""
    name = 'norm_forward_and_per_token_cast'
    B, T, H = x.shape
    if out is not None:
        raise ValueError(
            f'{name}: out is not supported with use_tma_aligned_col_major_sf=True and a batched (B, T, H) x '
            '(TileKernels 2.1.0 takes none either): the call allocates the scales in its layout'
        )
    rows = functools.partial(batch_rows, name, lead=(B, T))
    residual_out = None if residual is None else residual_out  # ignored without residual, as unbatched
    for label, value in (('residual', residual), ('out_bf16', out_bf16), ('residual_out', residual_out)):
        rows(label, value)  # the batch and tokens of x, viewable as rows (the per-batch calls check the rest)
    each = (weight, eps, fmt, num_per_channels)
    options = (out_scale, True, round_sf, use_packed_ue8m0, with_out_bf16)
    if not B:  # no batch to call: the rows' call checks the arguments
        function(rows('x', x), *each, rows('residual', residual), *options, None, rows('out_bf16', out_bf16),
                 rows('residual_out', residual_out), mega_moe_sf, mega_moe_block_m, with_rstd)  # fmt: skip
    (_, K), dtype = sf_layout(T, H, num_per_channels, use_packed_ue8m0)
    _, t_pad = contract.col_major_sf_strides(T, dtype, x.device)
    data = x.new_empty(x.shape, dtype=torch.float8_e4m3fn)
    sf = new_output(x, ((B, T, K), dtype, (K * t_pad, 1, t_pad)))
    if with_out_bf16 and out_bf16 is None:
        out_bf16 = x.new_empty(x.shape, dtype=torch.bfloat16)
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x)
    rstd = []
    for b in range(B):
        result = function(
            _batch(x, b), *each, _batch(residual, b), *options, (_batch(data, b), _batch(sf, b)), _batch(out_bf16, b),
            _batch(residual_out, b), mega_moe_sf, mega_moe_block_m, with_rstd,
        )  # fmt: skip
        rstd.append(result.rstd)
    return NormForwardAndPerTokenCastResult(
        QuantTensor(data, sf),
        out_bf16 if with_out_bf16 else None,
        (torch.stack(rstd) if B else x.new_empty(0, T, dtype=torch.float32)) if with_rstd else None,
        x if residual is None else residual_out,
    )


@OP.public(_eager, traced=_traced, batched=_batched)
def norm_forward_and_per_token_cast(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    fmt: str,
    num_per_channels: int,
    residual: torch.Tensor | None = None,
    out_scale: float = 1.0,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    with_out_bf16: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    out_bf16: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    mega_moe_sf: torch.Tensor | None = None,
    mega_moe_block_m: int = 0,
    with_rstd: bool = False,
) -> NormForwardAndPerTokenCastResult:
    """norm_forward's RMSNorm, then per_token_cast of its output (TileKernels 2.1.0's call): y, rounded to x's
    dtype, is cast in blocks of `num_per_channels` channels by the quant domain's scale rules, so that
    (data, sf) == per_token_cast(norm_forward(x, weight, eps, residual, out_scale).out, fmt, num_per_channels,
    round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0) bit for bit, on either backend.

    Args:
        x, weight, eps, residual, out_scale, residual_out, with_rstd: as norm_forward (x, residual and
            residual_out rows of any 16-byte-aligned row stride, as there). H a multiple of 64 as per_token_cast
            takes it: with num_per_channels 128 an odd multiple (e.g. gpt-oss's 2880) ends each row in a short
            block of 64 channels, whose scale is its 64 channels'.
        fmt: 'e4m3'.
        num_per_channels: channels per scale factor, 16, 32, 64 or 128.
        round_sf: power-of-two scale factors; use_packed_ue8m0 (with round_sf): UE8M0 bytes packed four per int32.
        with_out_bf16: also return y as bf16 (for bf16 x the output norm_forward returns).
        out: optional (data, sf) buffers of the result's shapes and dtypes.
        out_bf16: optional (T, H) bf16 buffer, with with_out_bf16; rows, as residual_out.
        use_tma_aligned_col_major_sf: sf column-major, as per_token_cast's option: the same shape and values,
            strides (1, T_pad), a view buf[:, :T].T of a (K, T_pad) buffer (T_pad: T rounded up to 16 bytes of
            sf's dtype on CUDA, T on Ascend). With a batched (B, T, H) x, TileKernels' batched layout: each
            batch's scales a block of their own, sf (B, T, K) of strides (K * T_pad, 1, T_pad) over a (B * K,
            T_pad) buffer; one launch per batch, and no given `out` (ValueError, as the peer).
        mega_moe_sf, mega_moe_block_m: TileKernels' mega-MoE scale layout; only their defaults are supported
            (ValueError otherwise).
        Buffers are on x's device and overlap no other argument; out's data is contiguous, its sf row-major
        contiguous or column-major of the strides above; the outputs the call allocates are contiguous.

    Returns:
        NormForwardAndPerTokenCastResult(out, out_bf16, rstd, norm_input), a tuple: out QuantTensor(data (T, H)
        float8_e4m3fn, sf (T, ceil(H / num_per_channels)) fp32, or with use_packed_ue8m0 (T, ceil(ceil(H /
        num_per_channels) / 4)) int32); out_bf16 (T, H) bf16 or None; rstd (T,) fp32 or None; norm_input as
        norm_forward's. A (B, T, H) x (norm_forward's batched call): each of them (B, T, ...).
    """
