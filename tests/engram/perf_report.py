"""Engram performance report on a CUDA GPU: our kernels vs torch.compile of the references.

    python3 -m tests.engram.perf_report [--ops fwd ...] [--shapes T:H ...]

1. The device-to-device copy ceiling: one large tensor copy, bytes read + written per second.
2. For every registered op and benchmark shape (T in 4001, 8001, 32768; H in 4096, 7168; hc = 4): our
   operator and `torch.compile` of its pure-PyTorch reference on the same inputs, timed with
   `tilelang.profiler.bench.do_bench` (CUPTI kernel time, CUDA events where CUPTI is unavailable;
   median; L2 flushed before every call), our output checked against the reference once per shape.
3. A markdown table per op: T, H, ours (us), GB/s, % of the copy ceiling, torch.compile (us), speedup.

Ops are entries of `OPS` (name -> PerfEntry: make_inputs, run_ours, run_ref, count_bytes, check);
add an operator by registering one entry, nothing else changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

import torch

from tests.testing.generator import BENCHMARK_HC, BENCHMARK_HIDDEN, BENCHMARK_NUM_TOKENS

COPY_BYTES = 1 << 30  # 1 GiB source: far beyond the L2 cache


@dataclasses.dataclass(frozen=True)
class PerfEntry:
    """One operator of the report.

    make_inputs(num_tokens, hc, hidden, device) -> dict of inputs (generated once per shape);
    run_ours(inputs) / run_ref(inputs) -> outputs (run_ref is wrapped in torch.compile);
    count_bytes(inputs, ours_outputs) -> bytes the operation must move (read + written);
    check(ours_outputs, ref_outputs) -> None, raises AssertionError on a mismatch.
    """

    make_inputs: Callable[[int, int, int, torch.device], dict]
    run_ours: Callable[[dict], object]
    run_ref: Callable[[dict], object]
    count_bytes: Callable[[dict, object], int]
    check: Callable[[object, object], None]


OPS: dict[str, PerfEntry] = {}


def register(name: str, entry: PerfEntry) -> None:
    if name in OPS:
        raise ValueError(f'perf entry {name!r} is registered twice')
    OPS[name] = entry


# ---------------------------------------------------------------- engram_gate_fwd


def _fwd_inputs(num_tokens: int, hc: int, hidden: int, device: torch.device) -> dict:
    return {
        'hidden_states': torch.randn(num_tokens, hc, hidden, device=device).to(torch.bfloat16),
        'k': torch.randn(num_tokens, hc, hidden, device=device).to(torch.bfloat16),
        'v': torch.randn(num_tokens, hidden, device=device).to(torch.bfloat16),
        'weight_fused': 1.0 + 0.5 * torch.randn(hc, hidden, device=device),
    }


def _fwd_ours(inp: dict):
    import cann_ops_tilelang

    return cann_ops_tilelang.engram_gate_fwd(inp['hidden_states'], inp['k'], inp['v'], inp['weight_fused'])


def _fwd_ref(inp: dict):
    from tests.engram.engram_gate_fwd_ref import engram_gate_fwd_ref

    return engram_gate_fwd_ref(inp['hidden_states'], inp['k'], inp['v'], inp['weight_fused'])


def _fwd_bytes(inp: dict, out) -> int:
    from tests.testing.numeric import count_bytes

    return count_bytes(inp['hidden_states'], inp['k'], inp['v'], *out)  # out, dot, gate, rstd_x, rstd_k


def _fwd_check(ours, ref) -> None:
    # Same tolerances as the device tests (tests/engram/test_engram_gate_fwd.py): the saved fp32 tensors
    # to fp32 reassociation, the bf16 output to the rounding of x + g*v (>= 99.9 % bit-identical).
    torch.testing.assert_close(ours.rstd_x, ref.rstd_x, rtol=1e-5, atol=0)
    torch.testing.assert_close(ours.rstd_k, ref.rstd_k, rtol=1e-5, atol=0)
    torch.testing.assert_close(ours.gate_score, ref.gate_score, rtol=0, atol=1e-4)
    same = float((ours.output.view(torch.int16) == ref.output.view(torch.int16)).double().mean())
    if same < 0.999:
        raise AssertionError(f'only {same:.5f} of the outputs are bit-identical to the reference')
    torch.testing.assert_close(ours.output.float(), ref.output.float(), rtol=2**-7, atol=1e-2)


register('fwd', PerfEntry(_fwd_inputs, _fwd_ours, _fwd_ref, _fwd_bytes, _fwd_check))


# ---------------------------------------------------------------- engram_gate_bwd

_BWD_ARGS = ('grad_out', 'hidden_states', 'k', 'v', 'weight_fused', 'dot', 'gate_score', 'rstd_x', 'rstd_k')


def _bwd_inputs(num_tokens: int, hc: int, hidden: int, device: torch.device) -> dict:
    from tests.engram.engram_gate_fwd_ref import engram_gate_fwd_ref

    inp = _fwd_inputs(num_tokens, hc, hidden, device)
    saved = engram_gate_fwd_ref(inp['hidden_states'], inp['k'], inp['v'], inp['weight_fused'])
    inp['grad_out'] = torch.randn(num_tokens, hc, hidden, device=device).to(torch.bfloat16)
    inp.update(dot=saved.dot, gate_score=saved.gate_score, rstd_x=saved.rstd_x, rstd_k=saved.rstd_k)
    return inp


def _bwd_ours(inp: dict):
    import cann_ops_tilelang

    return cann_ops_tilelang.engram_gate_bwd(*(inp[name] for name in _BWD_ARGS))


def _bwd_ref(inp: dict):
    from tests.engram.engram_gate_bwd_ref import engram_gate_bwd_ref  # the explicit formulas, fp32

    return engram_gate_bwd_ref(*(inp[name] for name in _BWD_ARGS))


def _bwd_bytes(inp: dict, out) -> int:
    from tests.testing.numeric import count_bytes

    # Reads grad_out, x, k, v and the four saved fp32 tensors; writes grad_x, grad_k, grad_v and the
    # fp32 partial weight gradients (engram.md's byte count; weight_fused stays in L2, not counted).
    saved = (inp['dot'], inp['gate_score'], inp['rstd_x'], inp['rstd_k'])
    return count_bytes(inp['grad_out'], inp['hidden_states'], inp['k'], inp['v'], *saved, *out)


def _bwd_check(ours, ref) -> None:
    # bf16 grads: rounding of the fp32 value (2**-8 relative) plus fp32 reassociation of dL/dg over H;
    # the weight gradient: the fp32 partials summed over P vs the reference's sum over T (tests use
    # element-wise bounds, tests/engram/test_engram_gate_bwd.py; this is the report's sanity check).
    for name, a, e in zip(('grad_hidden_states', 'grad_k', 'grad_v'), ours[:3], ref[:3], strict=True):
        scale = float(e.abs().max())
        torch.testing.assert_close(a.float(), e, rtol=2**-7, atol=1e-3 * scale, msg=lambda m, n=name: f'{n}: {m}')
    grad_w = ours.grad_w_partial.double().sum(0)
    scale = float(ref.grad_weight_fused.abs().max())
    torch.testing.assert_close(grad_w, ref.grad_weight_fused.double(), rtol=1e-4, atol=1e-4 * scale)


register('bwd', PerfEntry(_bwd_inputs, _bwd_ours, _bwd_ref, _bwd_bytes, _bwd_check))


# ---------------------------------------------------------------- timing and report


def bench_us(fn: Callable[[], object]) -> tuple[float, str]:
    """Median device time of fn() in microseconds, and the do_bench backend that measured it."""
    from tilelang.profiler.bench import do_bench

    try:
        ms = do_bench(fn, warmup=25, rep=100, backend='cupti', return_mode='median')
        if ms > 0:
            return ms * 1e3, 'cupti'
    except Exception as exc:  # CUPTI missing or unusable in this torch build
        print(f'(CUPTI unavailable: {type(exc).__name__}: {exc}; using CUDA events)', file=sys.stderr)
    return do_bench(fn, warmup=25, rep=100, backend='event', return_mode='median') * 1e3, 'event'


def copy_ceiling(device: torch.device) -> tuple[float, float]:
    """(GB/s, us) of a device-to-device copy of COPY_BYTES, counting bytes read + written."""
    src = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    us, _ = bench_us(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / us / 1e3, us


def report(ops: list[str], shapes: list[tuple[int, int]], hc: int, device: torch.device) -> str:
    ceiling_gbs, ceiling_us = copy_ceiling(device)
    lines = [
        f'Device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}; '
        f'tilelang {_tilelang_version()}; hc = {hc}',
        f'Copy ceiling: {ceiling_gbs:.0f} GB/s ({COPY_BYTES >> 20} MiB copied in {ceiling_us:.1f} us, read + written)',
        '',
    ]
    print('\n'.join(lines), flush=True)
    for name in ops:
        entry = OPS[name]
        compiled = torch.compile(entry.run_ref)
        rows = [
            f'### {name}',
            '',
            '| T | H | ours (us) | GB/s | % of copy | torch.compile (us) | speedup |',
            '| --- | --- | --- | --- | --- | --- | --- |',
        ]
        print('\n'.join(rows), flush=True)
        timer = 'n/a'
        for num_tokens, hidden in shapes:
            inp = entry.make_inputs(num_tokens, hc, hidden, device)
            ours = entry.run_ours(inp)
            entry.check(ours, entry.run_ref(inp))
            nbytes = entry.count_bytes(inp, ours)
            del ours
            ours_us, timer = bench_us(lambda entry=entry, inp=inp: entry.run_ours(inp))
            ref_us, _ = bench_us(lambda compiled=compiled, inp=inp: compiled(inp))
            gbs = nbytes / ours_us / 1e3
            row = (
                f'| {num_tokens} | {hidden} | {ours_us:.1f} | {gbs:.0f} | {100 * gbs / ceiling_gbs:.1f}% '
                f'| {ref_us:.1f} | {ref_us / ours_us:.2f}x |'
            )
            rows.append(row)
            print(row, flush=True)
            del inp
            torch.cuda.empty_cache()
        rows.append(f'\n(timer: {timer}, median; bytes = inputs read + outputs written once)')
        print(rows[-1], flush=True)
        lines += [*rows, '']
    return '\n'.join(lines)


def _tilelang_version() -> str:
    import tilelang

    return tilelang.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--ops', nargs='+', default=list(OPS), choices=list(OPS), help='entries to report')
    parser.add_argument(
        '--shapes',
        nargs='+',
        default=[f'{t}:{h}' for t in BENCHMARK_NUM_TOKENS for h in BENCHMARK_HIDDEN],
        help='T:H pairs (default: the Engram benchmark grid)',
    )
    parser.add_argument('--hc', type=int, default=BENCHMARK_HC)
    parser.add_argument('--output', help='also write the report (markdown) to this file')
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print('perf_report needs a CUDA GPU', file=sys.stderr)
        return 2
    shapes = [tuple(int(p) for p in s.split(':')) for s in args.shapes]
    text = report(args.ops, shapes, args.hc, torch.device('cuda', torch.cuda.current_device()))
    if args.output:
        with open(args.output, 'w', encoding='utf-8') as f:
            f.write(text + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
