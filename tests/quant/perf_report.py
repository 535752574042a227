"""The quantisation operators against TileKernels 2.1.0 on one GPU, in one process: whether the bytes are equal,
the time of each (do_bench medians under its L2 flush, CUPTI, rounds alternating between ours and the peer's
call), the copy that moves the same bytes, and our bandwidth.

    PYTHONPATH=<tile_kernels 2.1.0> python -m tests.quant.perf_report [--rounds 5] [--sweep] [--ops a,b]

--sweep: every operator's main configuration over H = 1024 .. 16384 (every 1024, and 7168) at T = 4096 (a
multiple of 128, which the peer's per-block and per-channel kernels need) instead of the fixed table.
Our calls go through the public operators with out= buffers (no allocation), the peer's as it is called.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from cann_ops_tilelang import quant
from tests.testing.device_timing import alternating_medians, compile_in_workers, same_traffic_floors


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    label: str  # block and scale format
    num_tokens: int
    hidden: int
    dtype: torch.dtype = torch.bfloat16
    fmt: str = 'e4m3'  # the quantised format: 'e4m3', or 'e2m1' (FP4)


def _input(case: Case, device) -> torch.Tensor:
    torch.manual_seed(0)
    scale = torch.exp2(torch.randint(-8, 8, (case.num_tokens, 1), device=device).float())
    if case.op == 'per_block_cast_lossless':  # rows of one magnitude: the exponent span the peer asserts on
        scale = torch.ones_like(scale)
    return (torch.randn(case.num_tokens, case.hidden, device=device) * scale).to(case.dtype)


def _flags(sf: str) -> dict:
    """Scale format 'fp32', 'ue8m0' (rounded, packed) or 'e4m3' (E4M3 scales)."""
    if sf == 'e4m3':
        return {'use_e4m3_sf': True}
    return {'round_sf': sf == 'ue8m0', 'use_packed_ue8m0': sf == 'ue8m0'}


def _buffers(result):
    return tuple(torch.empty_like(t) for t in result) if isinstance(result, tuple) else torch.empty_like(result)


def _calls(case: Case, tk, x: torch.Tensor):
    """(ours: () -> result into fixed buffers, peer: () -> result, moved bytes) of a case."""
    if case.op == 'cast':  # label 'plain:<to dtype>' or 'sr:<to dtype>'
        rounding, to = case.label.split(':')
        args, flags = (x, getattr(torch, to)), {'stochastic_rounding': rounding == 'sr'}
        return _pair(quant.cast, tk.cast, args, flags, x)
    if case.op == 'batched_transpose_weight_sf':  # label 'weights:<block size>': a model's weights at hidden H
        return _weight_scales(tk, int(case.label.split(':')[1]), case.hidden, x.device)
    kind, block, sf = case.label.split(':')
    block = tuple(int(b) for b in block.split('x'))
    if case.op == 'per_token_cast_and_cast_back':  # label 'inplace:1x<n>:<fp32 | pow2 | e4m3 scales>'
        return _round_trip(tk, x, case.fmt, block[1], sf)
    flags = _flags(sf)
    if case.op == 'per_token_cast':
        if kind != 'plain':  # '<input block>-<input scales>': an e4m3 x of those scales re-cast (x_block_size)
            in_block, in_sf = kind.split('-')
            in_block = tuple(int(b) for b in in_block.split('x'))
            if in_block[0] == 1:
                q = tuple(quant.per_token_cast(x, 'e4m3', in_block[1], **_flags(in_sf)))
            else:
                q = tuple(quant.per_block_cast(x, 'e4m3', in_block, **_flags(in_sf)))
            return _pair(quant.per_token_cast, tk.per_token_cast, (q, case.fmt, block[1], in_block), flags, q)
        args = (x, case.fmt, block[1])
        ours, peer = quant.per_token_cast, tk.per_token_cast
    elif case.op == 'per_block_cast_lossless':  # label 'plain:<out block>:<out sf>' from (1, 32) UE8M0 FP4
        q = tuple(quant.per_token_cast(x, 'e2m1', 32, **_flags('ue8m0')))
        args = (q, 'e4m3', (1, 32), block)
        return _pair(quant.per_block_cast_lossless, tk.per_block_cast_lossless, args, flags, q)
    elif case.op == 'per_block_cast':
        args = (x, 'e4m3', block)
        ours, peer = quant.per_block_cast, tk.per_block_cast
    elif case.op == 'per_block_cast_with_sf_only':
        args = (x, 'e4m3', block)
        ours, peer = quant.per_block_cast_with_sf_only, tk.per_block_cast_with_sf_only
    elif case.op == 'per_block_cast_with_precomputed_sf':
        sf_tensor = quant.per_block_cast_with_sf_only(x, 'e4m3', block)
        args, flags = (x, 'e4m3', block, sf_tensor), {}
        ours, peer = quant.per_block_cast_with_precomputed_sf, tk.per_block_cast_with_precomputed_sf
    elif case.op == 'per_channel_cast':
        if kind == 'rescale':  # a per-token quantised x (128-channel fp32 scales) cast per channel
            x = quant.per_token_cast(x, 'e4m3', 128)
            return _pair(quant.per_channel_cast, tk.per_channel_cast, (x, 'e4m3', block[0], False, 128), {}, x)
        args = (x, 'e4m3', block[0])
        ours, peer = quant.per_channel_cast, tk.per_channel_cast
        flags = {'round_sf': flags['round_sf'], 'use_packed_ue8m0': flags['use_packed_ue8m0']}
    elif case.op in ('cast_back', 'per_token_cast_back'):
        if block[0] == 1:
            q = quant.per_token_cast(x, case.fmt, block[1], **flags)
        elif block[1] == 1:
            q = quant.per_channel_cast(x, 'e4m3', block[0], **flags)
        else:
            q = quant.per_block_cast(x, 'e4m3', block, **flags)
        fmt = 'fp32' if kind == 'fp32' else 'bf16'
        if case.op == 'per_token_cast_back':
            return _pair(quant.per_token_cast_back, tk.per_token_cast_back, (tuple(q), fmt, block[1]), {}, q)
        return _pair(quant.cast_back, tk.cast_back, (tuple(q), fmt, block), {}, q)
    else:
        raise ValueError(f'unknown operator {case.op!r}')
    return _pair(ours, peer, args, flags, x)


def _round_trip(tk, x: torch.Tensor, fmt: str, block: int, sf: str):
    """per_token_cast_and_cast_back in place on copies of x: the first call of each side is the one compared (both
    on a fresh copy), later calls time the same kernel on the round-tripped rows; x read and written once."""
    args = (fmt, block, sf == 'pow2', sf == 'e4m3')
    mine, theirs = x.clone(), x.clone()
    quant.per_token_cast_and_cast_back(mine, *args)

    def peer():
        tk.per_token_cast_and_cast_back(theirs, *args)
        return theirs

    return (lambda: quant.per_token_cast_and_cast_back(mine, *args)), peer, mine.clone(), 2 * x.nbytes


def _weight_scales(tk, bs: int, hidden: int, device):
    """batched_transpose_weight_sf over nine weights of a layer (attention and MLP shapes at hidden H), fp32
    power-of-two scales; results flattened to one tuple for the comparison."""
    shapes = [(hidden, 2048), (2048, hidden), (4 * 1024, hidden)] * 3
    sf = [torch.exp2(torch.randint(-12, 4, (n // bs, k // bs), device=device).float()) for n, k in shapes]
    flags, outs = [i % 2 == 1 for i in range(len(sf))], [None] * len(sf)

    def flat(call):
        return lambda: tuple(t for pair in call(sf, bs, flags, outs) for t in pair)

    result = flat(quant.batched_transpose_weight_sf)()
    moved = sum(t.nbytes for t in (*sf, *result))
    return flat(quant.batched_transpose_weight_sf), flat(tk.batched_transpose_weight_sf), result, moved


def out_name(public) -> str:
    """The name of a public function's output-buffer argument: out, or out_sf for the scales alone (not always the
    last argument: keyword-only scalars such as seed may follow it)."""
    return public.operator.args[public.operator.out_index].name


def _pair(ours, peer, args, flags, inputs):
    result = ours(*args, **flags)
    buffers = _buffers(result)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    moved = sum(t.nbytes for t in (*inputs, *(result if isinstance(result, tuple) else (result,))))
    return (lambda: ours(*args, **flags, **{out_name(ours): buffers})), (lambda: peer(*args, **flags)), result, moved


def _same(ours, theirs) -> bool:
    ours = ours if isinstance(ours, tuple) else (ours,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    return len(ours) == len(theirs) and all(
        a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        for a, b in zip(ours, theirs, strict=True)
    )


TABLE = [
    Case('per_token_cast', 'plain:1x128:fp32', 4001, 7168),
    Case('per_token_cast', 'plain:1x32:ue8m0', 4001, 7168),
    Case('per_token_cast', 'plain:1x128:fp32', 8001, 4096),
    Case('per_token_cast', 'plain:1x128:fp32', 4001, 7168, torch.float32),
    Case('per_token_cast', 'plain:1x128:fp32', 1, 7168),
    Case('per_token_cast', '128x128-fp32:1x128:fp32', 4096, 7168),  # re-cast: ours one fused launch on CUDA
    Case('per_token_cast', '128x128-ue8m0:1x32:ue8m0', 4096, 7168),
    Case('per_token_cast', '1x32-ue8m0:1x128:fp32', 4001, 7168),
    Case('per_block_cast', 'plain:128x128:fp32', 4096, 7168),
    Case('per_block_cast', 'plain:32x32:ue8m0', 4096, 7168),
    Case('per_block_cast_with_sf_only', 'plain:128x128:fp32', 4096, 7168),
    Case('per_block_cast_with_precomputed_sf', 'plain:128x128:fp32', 4096, 7168),
    Case('per_channel_cast', 'plain:128x1:fp32', 4096, 7168),
    Case('per_channel_cast', 'plain:32x1:ue8m0', 4096, 7168),
    Case('per_channel_cast', 'rescale:128x1:fp32', 4096, 7168),
    Case('cast_back', 'bf16:1x128:fp32', 4001, 7168),
    Case('cast_back', 'bf16:1x32:ue8m0', 4001, 7168),
    Case('cast_back', 'fp32:128x128:fp32', 4096, 7168),
    Case('cast_back', 'bf16:128x1:fp32', 4096, 7168),
    Case('per_token_cast_back', 'bf16:1x128:fp32', 8001, 4096),
    Case('per_token_cast', 'plain:1x32:ue8m0', 4001, 7168, fmt='e2m1'),
    Case('per_token_cast', 'plain:1x16:e4m3', 4001, 7168, fmt='e2m1'),
    Case('cast_back', 'bf16:1x32:ue8m0', 4001, 7168, fmt='e2m1'),
    Case('cast_back', 'bf16:1x16:e4m3', 4001, 7168, fmt='e2m1'),
    Case('per_block_cast_lossless', 'plain:128x128:fp32', 4096, 7168),
    Case('per_block_cast_lossless', 'plain:32x32:ue8m0', 4096, 7168),
    Case('batched_transpose_weight_sf', 'weights:128', 1, 7168),
    Case('batched_transpose_weight_sf', 'weights:32', 1, 7168),
    Case('per_token_cast_and_cast_back', 'inplace:1x128:fp32', 4001, 7168),
    Case('per_token_cast_and_cast_back', 'inplace:1x16:e4m3', 4001, 7168, fmt='e2m1'),  # NVFP4's fake quantisation
    Case('per_token_cast_and_cast_back', 'inplace:1x32:pow2', 4001, 7168, fmt='e2m1'),  # MXFP4's
    Case('cast', 'plain:bfloat16', 4096, 7168, torch.float32),
    Case('cast', 'sr:bfloat16', 4096, 7168, torch.float32),
    Case('cast', 'plain:float8_e4m3fn', 4096, 7168),
    Case('cast', 'sr:float8_e4m3fn', 4096, 7168),
    Case('cast', 'sr:float8_e4m3fn', 4096, 7168, torch.float32),
]
SWEEP_HIDDEN = sorted({*range(1024, 16385, 1024), 7168})
SWEEP_LABELS = {
    'per_token_cast': 'plain:1x128:fp32',
    'per_block_cast': 'plain:128x128:fp32',
    'per_channel_cast': 'plain:128x1:fp32',
    'cast_back': 'bf16:1x128:fp32',
}


def _warm(case: Case) -> str | None:
    """Compile ours and the peer's kernels of `case` (a worker of compile_in_workers): one call of each."""
    import tile_kernels.quant as tk

    try:
        ours, peer, _, _ = _calls(case, tk, _input(case, torch.device('cuda')))
        ours()
        peer()
    except Exception as exc:  # the timing pass reports it (the peer refuses some shapes)
        return f'{case.op} {case.label} H={case.hidden}: {type(exc).__name__}'
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--sweep', action='store_true')
    parser.add_argument('--ops', default='', help='comma-separated operator names (default: all)')
    parser.add_argument('--labels', default='', help='comma-separated case labels (default: all)')
    parser.add_argument('--jobs', type=int, default=12, help='compile worker processes')
    args = parser.parse_args()
    import tile_kernels.quant as tk  # the peer, where it is installed

    device = torch.device('cuda')
    cases = (
        [Case(op, label, 4096, h) for op, label in SWEEP_LABELS.items() for h in SWEEP_HIDDEN] if args.sweep else TABLE
    )
    if args.ops:
        cases = [c for c in cases if c.op in args.ops.split(',')]
    if args.labels:
        cases = [c for c in cases if c.label in args.labels.split(',')]
    compile_in_workers(_warm, cases, args.jobs)
    columns = 'operator | case | fmt | T | H | dtype | equal | ours us | TK us | copy us | ours / TK | % of copy | GB/s'
    print(f'| {columns} |')
    print('|' + ' --- |' * len(columns.split('|')))
    for case in cases:
        head = f'| {case.op} | {case.label} | {case.fmt} | {case.num_tokens} | {case.hidden} |'
        x = _input(case, device)
        ours, peer, result, moved = _calls(case, tk, x)
        try:
            same = _same(result, peer())
        except Exception as exc:  # the peer refuses the shape: ours alone
            same, peer = f'TK: {type(exc).__name__}', None
        (ours_us, why), (tk_us, _) = alternating_medians([ours, peer], args.rounds)
        if ours_us is None:
            print(f'{head} failed: {why} |', flush=True)
            continue
        copy_us, _ = same_traffic_floors(moved, device)
        ratio = f'{ours_us / tk_us:.2f}' if tk_us else 'n/a'
        tk_text = f'{tk_us:.1f}' if tk_us else 'n/a'
        print(
            f'{head} {str(case.dtype)[6:]} | {same} | '
            f'{ours_us:.1f} | {tk_text} | {copy_us:.1f} | {ratio} | {100 * copy_us / ours_us:.0f} | '
            f'{moved / ours_us / 1e3:.0f} |',
            flush=True,
        )


if __name__ == '__main__':
    main()
