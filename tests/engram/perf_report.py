"""Engram performance report on a CUDA GPU: this package against TileKernels 2.1.0, side by side, one process.

    python -m tests.engram.perf_report [--ops gate_fwd gate_bwd ...] [--tokens T ...] [--hidden H ...]
        [--rounds N] [--no-compile] [--no-host] [--output report.md]

1. The device-to-device copy ceiling of this GPU, measured first in the same run (one 1 GiB copy, bytes
   read + written per second): the bar of the streaming operators.
2. For every operator and every row of docs/engram.md's tables (gate fwd / bwd: T in 4001, 8001, 32768 x
   H in 2560, 4096, 5120, 7168 at hc = 4; fused_weight and grad_w_reduce per H; hash per T; the four
   Sinkhorn operators once cann_ops_tilelang exports them): this package, TileKernels 2.1.0 (`tile_kernels`,
   where it imports) and `torch.compile` of the pure-PyTorch reference, on the same inputs, timed with
   `tilelang.profiler.bench.do_bench` (CUPTI kernel time, CUDA events where CUPTI is unavailable; median;
   L2 flushed before every call), ours and TileKernels' in `--rounds` alternating rounds (the median of
   each). Our result is checked against the reference once per row. A streaming row of the bar below 90 %
   of the ceiling is followed by what a copy and a read (torch.sum) of the same bytes take under the same
   flush: how far plain kernels get on that row.
3. For the streaming operators, the same call timed again after a clean L2 flush (`--no-clean-l2` skips it),
   against the copy ceiling and against a copy of the same byte count: do_bench's flush zeroes 256 MB, so
   every timed call starts with the L2 full of dirty lines whose write-back the call pays; a copy-like
   kernel (as many bytes written as read) leaves as many of its own dirty lines behind, uncounted, but a
   read-mostly one (the Sinkhorn step) does not, and smaller calls pay a launch and ramp that the 1 GiB
   ceiling does not.
4. The image-token mask's cost on text-only batches (`--no-mask-cost` skips it): gate fwd / bwd with
   `image_token_mask=None`, with an all-False mask, and TileKernels' with both.
5. Every operator's host time: wall time per eager call, back to back, ours and TileKernels', as
   `tests.engram.host_overhead` measures it (`--no-host` skips it).

Where `tile_kernels` cannot be imported the report says so and still prints our figures and the
torch.compile reference. Operators are entries of `OPS` (PerfEntry); an entry whose operator is not
exported yet (the Sinkhorn ones, by hasattr) is listed as such and skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

import torch

from tests.engram.engram_gate_bwd_ref import engram_gate_bwd_ref
from tests.engram.engram_gate_fwd_ref import engram_gate_fwd_ref
from tests.engram.engram_grad_w_reduce_ref import engram_grad_w_reduce_ref
from tests.engram.engram_hash_ref import engram_hash_ref
from tests.testing.device_timing import (
    COPY_BYTES,
    CleanL2Flush,
    alternating_medians,
    clean_l2_bench_us,
    copy_ceiling,
    same_size_copy_us,
    same_traffic_floors,
)
from tests.testing.device_timing import _timed as _timed
from tests.testing.generator import BENCHMARK_HC, BENCHMARK_HIDDEN, BENCHMARK_NUM_TOKENS
from tests.testing.numeric import count_bytes

EPS = 1e-6
CLAMP = 1e-6
HASH_SIZES = {'num_layers': 2, 'max_ngram': 3, 'num_tables': 8}  # the Engram setting
SINKHORN_NUMEL = (1 << 18, 1 << 24, 1 << 29)  # 256K .. 512M, the reference library's range
SINKHORN_ROWS = (1001, 10001, 100001)
SINKHORN_HEAD_DIM = (256, 5120)
ROUNDS = 3  # alternating do_bench rounds of ours and TileKernels' per row: drift between them cancels
BAR_PCT = 90  # docs/engram.md, "The bar": streaming operators at 90 % of the copy ceiling or more


@dataclasses.dataclass(frozen=True)
class PerfEntry:
    """One operator of the report.

    op: the cann_ops_tilelang attribute it times (absent: the entry is skipped as not exported yet).
    rows(args) -> the shape dicts of its table; make_inputs(shape, device) -> dict of inputs;
    ours(inp) / tk(tile_kernels, inp) / ref(inp) -> outputs (ref is wrapped in torch.compile);
    count_bytes(inp, ours_outputs) -> bytes the operation must move; check(ours, ref) raises AssertionError.
    streaming: the copy-ceiling bar applies (docs/engram.md, "The bar").
    """

    op: str
    rows: Callable[[argparse.Namespace], list[dict]]
    make_inputs: Callable[[dict, torch.device], dict]
    ours: Callable[[dict], object]
    tk: Callable[[object, dict], object]
    ref: Callable[[dict], object]
    count_bytes: Callable[[dict, object], int]
    check: Callable[[object, object], None]
    streaming: bool


OPS: dict[str, PerfEntry] = {}


def register(name: str, entry: PerfEntry) -> None:
    if name in OPS:
        raise ValueError(f'perf entry {name!r} is registered twice')
    OPS[name] = entry


def _ops():
    import cann_ops_tilelang

    return cann_ops_tilelang


def _nbytes(*tensors) -> int:
    flat = []
    for t in tensors:
        flat.extend(t if isinstance(t, (tuple, list)) else (t,))
    return count_bytes(*flat)


def _close(name: str, actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, atol_scale: float) -> None:
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(
        actual.double(), expected.double(), rtol=rtol, atol=atol_scale * scale, msg=lambda m: f'{name}: {m}'
    )


def _gate_rows(args) -> list[dict]:
    return [{'num_tokens': t, 'hc': args.hc, 'hidden': h} for t in args.tokens for h in args.hidden]


# ---------------------------------------------------------------- engram_gate_fwd


def _fwd_inputs(shape: dict, device: torch.device) -> dict:
    t, hc, h = shape['num_tokens'], shape['hc'], shape['hidden']
    return {
        'hidden_states': torch.randn(t, hc, h, device=device).to(torch.bfloat16),
        'kv': torch.randn(t, hc + 1, h, device=device).to(torch.bfloat16),
        'weight_fused': 1.0 + 0.5 * torch.randn(hc, h, device=device),
    }


def _fwd_ref(inp: dict):
    kv = inp['kv']
    hc = kv.shape[1] - 1
    return engram_gate_fwd_ref(
        inp['hidden_states'], kv[:, :hc], kv[:, hc], inp['weight_fused'], eps=EPS, clamp_value=CLAMP
    )


def _fwd_check(ours, ref) -> None:
    # The device tests' bounds (tests/engram/test_engram_gate_fwd.py), coarser: this is a sanity check.
    for name in ('rstd_x', 'rstd_k'):
        _close(name, getattr(ours, name), getattr(ref, name), rtol=1e-5, atol_scale=0)
    _close('gate_score', ours.gate_score, ref.gate_score, rtol=0, atol_scale=1e-4)
    same = float((ours.output.view(torch.int16) == ref.output.view(torch.int16)).double().mean())
    if same < 0.999:
        raise AssertionError(f'only {same:.5f} of the outputs are bit-identical to the reference')


register(
    'gate_fwd',
    PerfEntry(
        op='engram_gate_fwd',
        rows=_gate_rows,
        make_inputs=_fwd_inputs,
        ours=lambda inp: _ops().engram_gate_fwd(inp['hidden_states'], inp['kv'], inp['weight_fused'], EPS, CLAMP),
        tk=lambda tk, inp: tk.engram.engram_gate_fwd(inp['hidden_states'], inp['kv'], inp['weight_fused'], EPS, CLAMP),
        ref=_fwd_ref,
        # Reads x and kv, writes the output and the four saved (T, hc) fp32 tensors.
        count_bytes=lambda inp, out: _nbytes(inp['hidden_states'], inp['kv'], *out),
        check=_fwd_check,
        streaming=True,
    ),
)


# ---------------------------------------------------------------- engram_gate_bwd

_BWD_ARGS = ('grad_out', 'hidden_states', 'kv', 'weight_fused', 'dot', 'gate_score', 'rstd_x', 'rstd_k')


def _bwd_inputs(shape: dict, device: torch.device) -> dict:
    inp = _fwd_inputs(shape, device)
    saved = _fwd_ref(inp)
    inp['grad_out'] = torch.randn_like(inp['hidden_states'], dtype=torch.float32).to(torch.bfloat16)
    inp.update(dot=saved.dot, gate_score=saved.gate_score, rstd_x=saved.rstd_x, rstd_k=saved.rstd_k)
    return inp


def _bwd_ref(inp: dict):  # the explicit formulas of docs/engram.md, fp32
    kv = inp['kv']
    hc = kv.shape[1] - 1
    args = [inp[name] for name in _BWD_ARGS]
    return engram_gate_bwd_ref(*args[:2], kv[:, :hc], kv[:, hc], *args[3:], clamp_value=CLAMP)


def _bwd_check(ours, ref) -> None:
    # bf16 grads: rounding (2**-8 relative) plus fp32 reassociation of dL/dg over H; the weight gradient:
    # the fp32 partials summed over P against the reference's sum over T (tests: element-wise bounds).
    hc = ours.grad_kv.shape[1] - 1
    grads = (ours.grad_hidden_states, ours.grad_kv[:, :hc], ours.grad_kv[:, hc])
    for name, a, e in zip(('grad_hidden_states', 'grad_k', 'grad_v'), grads, ref[:3], strict=True):
        _close(name, a, e, rtol=2**-7, atol_scale=1e-3)
    _close('grad_w', ours.grad_w_partial.double().sum(0), ref.grad_weight_fused, rtol=1e-4, atol_scale=1e-4)


register(
    'gate_bwd',
    PerfEntry(
        op='engram_gate_bwd',
        rows=_gate_rows,
        make_inputs=_bwd_inputs,
        ours=lambda inp: _ops().engram_gate_bwd(*(inp[name] for name in _BWD_ARGS), CLAMP),
        tk=lambda tk, inp: tk.engram.engram_gate_bwd(*(inp[name] for name in _BWD_ARGS), CLAMP),
        ref=_bwd_ref,
        # Reads grad_out, x, kv and the saved fp32 tensors (weight_fused stays in L2: not counted); writes
        # grad_x, grad_kv and the fp32 partial weight gradients (docs/engram.md's byte count).
        count_bytes=lambda inp, out: _nbytes(*(inp[n] for n in _BWD_ARGS if n != 'weight_fused'), *out),
        check=_bwd_check,
        streaming=True,
    ),
)


# ---------------------------------------------------------------- engram_fused_weight, engram_grad_w_reduce


def _weights(shape: dict, device: torch.device) -> dict:
    hc, h = shape['hc'], shape['hidden']
    return {
        'weight_hidden': (1.0 + 0.5 * torch.randn(hc, h, device=device)).to(torch.bfloat16),
        'weight_embed': (1.0 + 0.5 * torch.randn(hc, h, device=device)).to(torch.bfloat16),
    }


register(
    'fused_weight',
    PerfEntry(
        op='engram_fused_weight',
        rows=lambda args: [{'hc': args.hc, 'hidden': h} for h in args.hidden],
        make_inputs=_weights,
        ours=lambda inp: _ops().engram_fused_weight(inp['weight_hidden'], inp['weight_embed']),
        tk=lambda tk, inp: tk.engram.fused_weight(inp['weight_hidden'], inp['weight_embed']),
        ref=lambda inp: inp['weight_hidden'].float() * inp['weight_embed'].float(),
        count_bytes=lambda inp, out: _nbytes(inp['weight_hidden'], inp['weight_embed'], out),
        check=lambda ours, ref: _close('weight_fused', ours, ref, rtol=0, atol_scale=0),  # exact
        streaming=False,
    ),
)


def _reduce_inputs(shape: dict, device: torch.device) -> dict:
    inp = _weights(shape, device)
    inp['grad_w_partial'] = torch.randn(shape['num_partials'], shape['hc'], shape['hidden'], device=device)
    inp['grad_weight_hidden'] = torch.zeros(shape['hc'], shape['hidden'], device=device)
    inp['grad_weight_embed'] = torch.zeros(shape['hc'], shape['hidden'], device=device)
    return inp


_REDUCE_ARGS = ('grad_w_partial', 'weight_hidden', 'weight_embed', 'grad_weight_hidden', 'grad_weight_embed')


def _reduce_ref(inp: dict):
    return engram_grad_w_reduce_ref(*(inp[n] for n in _REDUCE_ARGS))


def _reduce_check(ours, ref) -> None:
    # Accumulated in place on every timed call: the check compares the first call (the reference runs first).
    for name, a, e in zip(('grad_weight_hidden', 'grad_weight_embed'), ours, ref, strict=True):
        _close(name, a, e, rtol=1e-5, atol_scale=1e-5)


register(
    'grad_w_reduce',
    PerfEntry(
        op='engram_grad_w_reduce',
        rows=lambda args: [{'hc': args.hc, 'hidden': h, 'num_partials': args.num_partials} for h in args.hidden],
        make_inputs=_reduce_inputs,
        ours=lambda inp: _ops().engram_grad_w_reduce(*(inp[n] for n in _REDUCE_ARGS)),
        tk=lambda tk, inp: tk.engram.grad_w_reduce(*(inp[n] for n in _REDUCE_ARGS)),
        ref=_reduce_ref,
        # Reads the partials, both weights and both gradients; writes both gradients.
        count_bytes=lambda inp, out: _nbytes(*(inp[n] for n in _REDUCE_ARGS), *out),
        check=_reduce_check,
        streaming=False,
    ),
)


# ---------------------------------------------------------------- engram_hash


def _hash_inputs(shape: dict, device: torch.device) -> dict:
    t, L, N, E = shape['num_tokens'], shape['num_layers'], shape['max_ngram'], shape['num_tables']
    vocab = torch.randint(1000, 1 << 20, (L, N - 1, E), dtype=torch.int32, device=device)
    flat = vocab.flatten(1)
    offsets = torch.cat([torch.zeros_like(flat[:, :1]), flat[:, :-1].cumsum(1, dtype=torch.int32)], dim=1)
    return {
        'ngram_token_ids': torch.randint(0, 1 << 17, (t, N), dtype=torch.int32, device=device),
        'multipliers': torch.randint(1, 1 << 40, (L, N), dtype=torch.int64, device=device),
        'vocab_sizes': vocab,
        'offsets': offsets,
    }


_HASH_ARGS = ('ngram_token_ids', 'multipliers', 'vocab_sizes', 'offsets')


def _hash_ref(inp: dict):
    return engram_hash_ref(*(inp[n] for n in _HASH_ARGS))


register(
    'hash',
    PerfEntry(
        op='engram_hash',
        rows=lambda args: [{'num_tokens': t, **HASH_SIZES} for t in args.tokens],
        make_inputs=_hash_inputs,
        ours=lambda inp: _ops().engram_hash(*(inp[n] for n in _HASH_ARGS)),
        tk=lambda tk, inp: tk.engram.engram_hash(*(inp[n] for n in _HASH_ARGS)),
        ref=_hash_ref,
        count_bytes=lambda inp, out: _nbytes(*(inp[n] for n in _HASH_ARGS), out),
        check=lambda ours, ref: _close('rows', ours, ref, rtol=0, atol_scale=0),  # exact
        streaming=False,
    ),
)


# ---------------------------------------------------------------- the Sinkhorn operators (docs/engram.md)


def _momentum_inputs(shape: dict, device: torch.device) -> dict:
    n = shape['numel']
    return {
        'grad': torch.randn(n, device=device).to(torch.bfloat16),
        'momentum_buffer': torch.randn(n, device=device),
        'beta1': 0.9,
    }


def _momentum_ref(inp: dict):
    g, m, b = inp['grad'].float(), inp['momentum_buffer'].float(), inp['beta1']
    m = b * m + (1 - b) * g  # the buffer is updated in place by the operators; the reference leaves it
    return b * m + (1 - b) * g  # nesterov=True


register(
    'sinkhorn_momentum_update',
    PerfEntry(
        op='engram_sinkhorn_momentum_update',
        rows=lambda args: [{'numel': n} for n in SINKHORN_NUMEL],
        make_inputs=_momentum_inputs,
        ours=lambda inp: _ops().engram_sinkhorn_momentum_update(inp['grad'], inp['momentum_buffer'], inp['beta1']),
        tk=lambda tk, inp: tk.engram.engram_sinkhorn_momentum_update(inp['grad'], inp['momentum_buffer'], inp['beta1']),
        ref=_momentum_ref,
        # Reads grad and the buffer, writes the buffer and the fp32 Sinkhorn input.
        count_bytes=lambda inp, out: _nbytes(inp['grad'], inp['momentum_buffer'], inp['momentum_buffer'], out),
        check=lambda ours, ref: _close('sinkhorn_input', ours, ref, rtol=1e-5, atol_scale=1e-6),
        streaming=True,
    ),
)


def _matrix_inputs(shape: dict, device: torch.device) -> dict:
    rows, d = shape['rows'], shape['head_dim']
    return {
        'matrix': torch.randn(rows, d, device=device),
        'row_scale': 0.5 + torch.rand(rows, device=device),
        'col_scale': 0.5 + torch.rand(d, device=device),
    }


def _matrix_rows(args) -> list[dict]:
    return [{'rows': r, 'head_dim': d} for r in SINKHORN_ROWS for d in SINKHORN_HEAD_DIM]


def _row_norm(inp: dict) -> torch.Tensor:
    return (inp['row_scale'][:, None] * inp['matrix'] * inp['col_scale'][None, :]).norm(dim=1)


def _step_check(ours, ref) -> None:
    # Only the row norm: row_scale is updated in place on every timed call (check on the first).
    _close('row_norm', ours[0], ref, rtol=1e-5, atol_scale=1e-6)


register(
    'sinkhorn_step',
    PerfEntry(
        op='engram_sinkhorn_step',
        rows=_matrix_rows,
        make_inputs=_matrix_inputs,
        ours=lambda inp: _ops().engram_sinkhorn_step(inp['matrix'], inp['row_scale'], inp['col_scale'], EPS),
        tk=lambda tk, inp: tk.engram.engram_sinkhorn_step(inp['matrix'], inp['row_scale'], inp['col_scale'], EPS),
        ref=_row_norm,
        # Reads the matrix and both scales, writes row_scale, the row norm and the column partials.
        count_bytes=lambda inp, out: _nbytes(inp['matrix'], inp['row_scale'], inp['col_scale'], inp['row_scale'], *out),
        check=_step_check,
        streaming=True,
    ),
)


def _reduce_partial_inputs(shape: dict, device: torch.device) -> dict:
    # The partials a step produces on this device (P is the kernel's choice), and the column sums.
    inp = _matrix_inputs(shape, device)
    _, partial = _ops().engram_sinkhorn_step(inp['matrix'], inp['row_scale'], inp['col_scale'], EPS)
    return {'col_sumsq_partial': partial, 'col_sumsq': torch.empty(shape['head_dim'], device=device)}


def _step_reduce_ours(inp: dict):
    _ops().engram_sinkhorn_step_reduce(inp['col_sumsq_partial'], inp['col_sumsq'])
    return inp['col_sumsq']


def _step_reduce_tk(tk, inp: dict):
    tk.engram.engram_sinkhorn_step_reduce(inp['col_sumsq_partial'], inp['col_sumsq'])
    return inp['col_sumsq']


register(
    'sinkhorn_step_reduce',
    PerfEntry(
        op='engram_sinkhorn_step_reduce',
        rows=_matrix_rows,
        make_inputs=_reduce_partial_inputs,
        ours=_step_reduce_ours,
        tk=_step_reduce_tk,
        ref=lambda inp: inp['col_sumsq_partial'].sum(0),
        count_bytes=lambda inp, out: _nbytes(inp['col_sumsq_partial'], out),
        check=lambda ours, ref: _close('col_sumsq', ours, ref, rtol=1e-5, atol_scale=1e-6),
        streaming=False,
    ),
)


def _finalize_ref(inp: dict) -> torch.Tensor:
    scale = inp['row_scale'] / (_row_norm(inp) + EPS)
    return 0.5 * scale[:, None] * inp['matrix'] * inp['col_scale'][None, :]  # alpha = 0.5


register(
    'sinkhorn_finalize',
    PerfEntry(
        op='engram_sinkhorn_finalize',
        rows=_matrix_rows,
        make_inputs=_matrix_inputs,
        ours=lambda inp: _ops().engram_sinkhorn_finalize(inp['matrix'], inp['row_scale'], inp['col_scale'], EPS, 0.5),
        tk=lambda tk, inp: tk.engram.engram_sinkhorn_finalize(
            inp['matrix'], inp['row_scale'], inp['col_scale'], EPS, 0.5
        ),
        ref=_finalize_ref,
        count_bytes=lambda inp, out: _nbytes(inp['matrix'], inp['row_scale'], inp['col_scale'], out),
        check=lambda ours, ref: _close('out', ours, ref, rtol=1e-5, atol_scale=1e-6),
        streaming=True,
    ),
)


# ---------------------------------------------------------------- timing and report


def import_tile_kernels():
    """(module, None) or (None, why it is not there)."""
    try:
        import tile_kernels
        import tile_kernels.engram  # the operators live there
    except Exception as exc:  # not installed, or its import fails on this host
        return None, f'{type(exc).__name__}: {exc}'
    return tile_kernels, None


def _fmt_shape(shape: dict) -> str:
    return ', '.join(f'{k}={v}' for k, v in shape.items())


def _cell(value: float | None, fmt: str = '{:.1f}') -> str:
    return '-' if value is None else fmt.format(value)


def _bar_applies(entry: PerfEntry, shape: dict) -> bool:
    """docs/engram.md's 90 %-of-copy bar: streaming operators at T >= 4001 (rows >= 10001, numel >= 16M)."""
    big = shape.get('num_tokens', 0) >= 4001 or shape.get('rows', 0) >= 10001 or shape.get('numel', 0) >= 1 << 24
    return entry.streaming and big


def _misses_bar(pct: float | None, bar: bool) -> bool:
    return bar and pct is not None and pct < BAR_PCT


def _pct_cell(pct: float | None, bar: bool) -> str:
    return f'{_cell(pct)}%' + (f' (< {BAR_PCT} %)' if _misses_bar(pct, bar) else '')


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """The copy ceilings of this run (GB/s, bytes read + written): do_bench's flush, and the clean flush
    with its flush object (None: the clean-L2 columns are skipped)."""

    gbs: float
    clean_gbs: float | None = None
    clean_flush: CleanL2Flush | None = None


def report_op(name: str, entry: PerfEntry, args, device, tk, ceilings: Ceilings, out: Callable[[str], None]) -> None:
    ops = _ops()
    out(f'### {name} (`{entry.op}`)')
    out('')
    if not hasattr(ops, entry.op):
        out('not exported by cann_ops_tilelang yet: skipped')
        out('')
        return
    compiled = torch.compile(entry.ref) if args.compile else None
    clean = entry.streaming and ceilings.clean_flush is not None
    header = '| shape | ours (us) | GB/s | % of copy | TileKernels 2.1.0 (us) | TK / ours | torch.compile (us) |'
    rule = '| --- | --- | --- | --- | --- | --- | --- |'
    if clean:
        header += ' clean L2: ours (us) | % of copy | % of a same-size copy |'
        rule += ' --- | --- | --- |'
    out(header)
    out(rule)
    notes, timer = [], 'n/a'
    for shape in entry.rows(args):
        try:
            inp = entry.make_inputs(shape, device)
            expected = entry.ref(inp)  # first: some operators update their inputs in place
            ours = entry.ours(inp)
            entry.check(ours, expected)
            nbytes = entry.count_bytes(inp, ours)
            del expected
            del ours
        except Exception as exc:
            out(f'| {_fmt_shape(shape)} | error: {type(exc).__name__}: {str(exc)[:200]} | | | | | |')
            torch.cuda.empty_cache()
            continue
        theirs = (lambda inp=inp: entry.tk(tk, inp)) if tk is not None else None
        (ours_us, timer), (tk_us, why) = alternating_medians([lambda inp=inp: entry.ours(inp), theirs], args.rounds)
        if ours_us is None:
            notes.append(f'{_fmt_shape(shape)}: timing ours failed ({timer[:200]})')
        if tk is not None and tk_us is None:
            notes.append(f'{_fmt_shape(shape)}: TileKernels failed ({why[:200]})')
        ref_us = _timed(lambda inp=inp: compiled(inp))[0] if compiled is not None else None
        gbs = nbytes / ours_us / 1e3 if ours_us else None
        pct = 100 * gbs / ceilings.gbs if gbs else None
        ratio = tk_us / ours_us if tk_us and ours_us else None
        bar = _bar_applies(entry, shape)
        if _misses_bar(pct, bar):
            copy_us, read_us = same_traffic_floors(nbytes, device)
            notes.append(
                f'{_fmt_shape(shape)}: below {BAR_PCT} %; under the same flush a copy of its {nbytes / 1e6:.1f} MB '
                f'took {copy_us:.1f} us ({100 * nbytes / copy_us / 1e3 / ceilings.gbs:.1f} % of copy) and a read '
                f'of them (torch.sum) {read_us:.1f} us ({100 * nbytes / read_us / 1e3 / ceilings.gbs:.1f} %)'
            )
        line = (
            f'| {_fmt_shape(shape)} | {_cell(ours_us)} | {_cell(gbs, "{:.0f}")} | {_pct_cell(pct, bar)} '
            f'| {_cell(tk_us)} | {_cell(ratio, "{:.2f}")} | {_cell(ref_us)} |'
        )
        if clean:
            clean_us = clean_l2_bench_us(lambda inp=inp: entry.ours(inp), ceilings.clean_flush)
            copy_us = same_size_copy_us(nbytes, device, ceilings.clean_flush)
            clean_pct = 100 * nbytes / clean_us / 1e3 / ceilings.clean_gbs
            line += f' {clean_us:.1f} | {_pct_cell(clean_pct, bar)} | {_pct_cell(100 * copy_us / clean_us, bar)} |'
        out(line)
        del inp
        torch.cuda.empty_cache()
    out('')
    out(
        f'(timer: {timer}, median of {args.rounds} alternating rounds of ours and TileKernels; bytes = inputs read + '
        'outputs written once; TK / ours > 1: ours is faster)'
    )
    if clean:
        out('(clean L2: CUPTI mean after a flush that reads 256 MB, so no call starts with dirty lines to write back)')
    for note in notes:
        out(f'- {note}')
    out('')


def report_mask_cost(args, device, tk, out: Callable[[str], None]) -> None:
    """docs/engram.md, "Image tokens": a text-only batch through the mask variant (an all-False mask) against
    image_token_mask=None, gate fwd and bwd, ours and TileKernels'."""
    ops = _ops()
    out('### image_token_mask on text-only batches (gate fwd / bwd)')
    out('')
    out('| op | shape | ours: None (us) | ours: all False (us) | ratio | TK: None (us) | TK: all False (us) | ratio |')
    out('| --- | --- | --- | --- | --- | --- | --- | --- |')
    fwd_args = ('hidden_states', 'kv', 'weight_fused')
    for shape in _gate_rows(args):
        inp = _bwd_inputs(shape, device)
        text_only = torch.zeros(shape['num_tokens'], dtype=torch.bool, device=device)
        fwd = [inp[n] for n in fwd_args]
        bwd = [inp[n] for n in _BWD_ARGS]
        calls = {
            'fwd': (
                lambda mask, fwd=fwd: ops.engram_gate_fwd(*fwd, EPS, CLAMP, image_token_mask=mask),
                lambda mask, fwd=fwd: tk.engram.engram_gate_fwd(*fwd, EPS, CLAMP, image_token_mask=mask),
            ),
            'bwd': (
                lambda mask, bwd=bwd: ops.engram_gate_bwd(*bwd, CLAMP, image_token_mask=mask),
                lambda mask, bwd=bwd: tk.engram.engram_gate_bwd(*bwd, CLAMP, image_token_mask=mask),
            ),
        }
        for op_name, (ours, theirs) in calls.items():
            fns = []
            for fn in (ours, theirs if tk is not None else None):
                fns += [None, None] if fn is None else [lambda fn=fn: fn(None), lambda fn=fn, m=text_only: fn(m)]
            medians = [us for us, _ in alternating_medians(fns, args.rounds)]
            cells = []
            for plain, masked in (medians[:2], medians[2:]):
                ratio = masked / plain if plain and masked else None
                cells += [_cell(plain), _cell(masked), _cell(ratio, '{:.3f}')]
            out(f'| {op_name} | {_fmt_shape(shape)} | ' + ' | '.join(cells) + ' |')
        del inp, fwd, bwd, calls
        torch.cuda.empty_cache()
    out('')
    out(
        f'(timer: do_bench CUPTI, L2 flushed, median of {args.rounds} alternating rounds; ratio = all-False mask / '
        'None: above 1, the mask variant costs)'
    )
    out('')


def report_host(device, tk, out: Callable[[str], None]) -> None:
    """docs/engram.md's second table: wall time per eager call of every operator, measured as
    `python -m tests.engram.host_overhead` does (its shapes, calls and alternating rounds)."""
    from tests.engram import host_overhead

    sync = torch.cuda.synchronize if device.type == 'cuda' else (lambda: None)  # CPU: host_overhead's stub
    inp = host_overhead.make_inputs(device)
    libraries = {'ours': host_overhead.calls(_ops(), inp, tile_kernels=False)}
    if tk is not None:
        libraries['tk'] = host_overhead.calls(tk.engram, inp, tile_kernels=True)
    sizes = {'calls': host_overhead.CALLS, 'rounds': host_overhead.ROUNDS}
    results = host_overhead.measure(libraries, host_overhead.OPS, sync, **sizes)
    shape = {'num_tokens': host_overhead.T, 'hc': host_overhead.HC, 'hidden': host_overhead.H}
    sinkhorn = f'{host_overhead.SINKHORN_ROWS} x {host_overhead.SINKHORN_HEAD_DIM}'
    out(f'### host time per eager call ({_fmt_shape(shape)}; Sinkhorn at {sinkhorn}, back to back)')
    out('')
    out('| op | ours (us) | TileKernels 2.1.0 (us) | ours / TK |')
    out('| --- | --- | --- | --- |')
    for name in host_overhead.OPS:
        ours, theirs = results['ours'][name], results.get('tk', {}).get(name)
        ratio = ours / theirs if isinstance(ours, float) and isinstance(theirs, float) else None
        cells = [value if isinstance(value, str) else _cell(value) for value in (ours, theirs)]
        out(f'| {name} | {cells[0]} | {cells[1]} | {_cell(ratio, "{:.2f}")} |')
    out('')
    out(
        f"(median of {host_overhead.ROUNDS} rounds of {host_overhead.CALLS} calls, the libraries' rounds "
        'alternating; ours / TK < 1: ours is faster)'
    )
    out('')


def report(args, device: torch.device) -> str:
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    tk, why = (None, 'disabled (--no-tilekernels)') if not args.tilekernels else import_tile_kernels()
    ceiling_gbs, ceiling_us = copy_ceiling(device)
    ceilings = Ceilings(ceiling_gbs)
    if args.clean_l2:
        flush = CleanL2Flush(device)
        clean_us = same_size_copy_us(2 * COPY_BYTES, device, flush)  # COPY_BYTES read and written
        ceilings = Ceilings(ceiling_gbs, 2 * COPY_BYTES / clean_us / 1e3, flush)
    out(
        f'Device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}; tilelang {_version("tilelang")}; '
        f'TileKernels {_version("tile_kernels") if tk is not None else "not imported"}; hc = {args.hc}'
    )
    out(f'Copy ceiling: {ceiling_gbs:.0f} GB/s ({COPY_BYTES >> 20} MiB copied in {ceiling_us:.1f} us, read + written)')
    if ceilings.clean_gbs is not None:
        out(f'Copy ceiling after a clean L2 flush: {ceilings.clean_gbs:.0f} GB/s')
    if tk is None:
        out(f'TileKernels 2.1.0 is not importable here ({why}): its columns stay empty.')
    out('')
    for name in args.ops:
        report_op(name, OPS[name], args, device, tk, ceilings, out)
    if args.mask_cost:
        report_mask_cost(args, device, tk, out)
    if args.host:
        report_host(device, tk, out)
    if args.width_sweep:
        from tests.engram import width_sweep  # (it imports this module)

        width_sweep.report(args, device, ceiling_gbs, out)
    return '\n'.join(lines)


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:
        return 'unknown'


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f'must be at least 1, got {value}')
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--ops', nargs='+', default=list(OPS), choices=list(OPS), help='entries to report')
    parser.add_argument('--tokens', nargs='+', type=int, default=list(BENCHMARK_NUM_TOKENS), help='T of gate / hash')
    parser.add_argument('--hidden', nargs='+', type=int, default=sorted(BENCHMARK_HIDDEN), help='H of the gate ops')
    parser.add_argument('--hc', type=int, default=BENCHMARK_HC)
    parser.add_argument('--num-partials', type=int, default=132, help='P of grad_w_reduce (the H200 SM count)')
    parser.add_argument('--rounds', type=_positive_int, default=ROUNDS, help='alternating timing rounds per row')
    parser.add_argument('--no-compile', dest='compile', action='store_false', help='skip the torch.compile column')
    parser.add_argument('--no-tilekernels', dest='tilekernels', action='store_false', help='skip TileKernels')
    parser.add_argument('--no-host', dest='host', action='store_false', help='skip the host-time table')
    parser.add_argument('--no-clean-l2', dest='clean_l2', action='store_false', help='skip the clean-L2 columns')
    parser.add_argument('--no-mask-cost', dest='mask_cost', action='store_false', help='skip the mask-cost table')
    from tests.engram import width_sweep

    parser.add_argument('--width-sweep', action='store_true', help='end with the gate width sweep (width_sweep.py)')
    width_sweep.add_arguments(parser, prefix='sweep-')
    parser.add_argument('--output', help='also write the report (markdown) to this file')
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print('perf_report needs a CUDA GPU', file=sys.stderr)
        return 2
    text = report(args, torch.device('cuda', torch.cuda.current_device()))
    if args.output:
        with open(args.output, 'w', encoding='utf-8') as f:
            f.write(text + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
