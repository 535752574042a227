"""The Engram gate at every width: forward and backward, with and without an image-token mask, over hc and H.

    python -m tests.engram.width_sweep [--hc 1 2 4 6 8] [--hidden H ...] [--tokens 4001 32768] [--rounds N]
        [--jobs N] [--output sweep.md]

(also the last section of `python -m tests.engram.perf_report --width-sweep`). One row per (hc, H, T): GB/s
of ours and its share of the copy ceiling, forward and backward, the all-False mask against mask=None (text-only
batches: above 1 the mask variant costs), and TileKernels 2.1.0 beside ours where it runs (its backward takes
hc = 4 only). Default grid (issue #36): hc in 1, 2, 4, 6, 8 and H every 1024 from 1024 to 16384 plus 2560,
5120 and 7168, at T = 4001 and 32768.

What keeps it within one 10-minute device call: every kernel it times is compiled first, in `--jobs` worker
processes (TileLang's disk cache hands them to the timing process), with small calls of each library;
inputs are random tensors with saved forward values drawn directly (no fp32 reference over 40 GB of rows);
each cell is one do_bench median (5 ms warm-up, 20 ms of calls, L2 flushed before each), ours and
TileKernels' in `--rounds` alternating rounds where TileKernels runs. Values are the device tests' business.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch

from tests.engram import perf_report
from tests.engram.perf_report import CLAMP, EPS
from tests.testing.device_timing import compile_in_workers

SWEEP_HC = (1, 2, 4, 6, 8)
SWEEP_HIDDEN = tuple(sorted({*range(1024, 16385, 1024), 2560, 5120, 7168}))
SWEEP_TOKENS = (4001, 32768)
WARMUP_MS, REP_MS = 5, 20


def _inputs(num_tokens: int, hc: int, hidden: int, device) -> dict:
    """The gate's tensors: bf16 rows, fp32 weight, and saved forward values of the right size and range
    (|d| far above the clamp, so every token takes the full backward)."""
    x = torch.randn(num_tokens, hc, hidden, device=device, dtype=torch.bfloat16)
    saved = torch.rand(4, num_tokens, hc, device=device) + 0.5
    return {
        'hidden_states': x,
        'kv': torch.randn(num_tokens, hc + 1, hidden, device=device, dtype=torch.bfloat16),
        'weight_fused': 1.0 + 0.5 * torch.randn(hc, hidden, device=device),
        'grad_out': torch.randn_like(x),
        'dot': saved[0] * hidden**0.5,
        'gate_score': saved[1] - 0.5,
        'rstd_x': saved[2],
        'rstd_k': saved[3],
    }


def _calls(lib, inp: dict, mask) -> dict[str, Callable[[], object]]:
    fwd = (inp['hidden_states'], inp['kv'], inp['weight_fused'])
    bwd = tuple(inp[n] for n in ('grad_out', 'hidden_states', 'kv', 'weight_fused', 'dot', 'gate_score'))
    bwd += (inp['rstd_x'], inp['rstd_k'])
    return {
        'fwd': lambda: lib.engram_gate_fwd(*fwd, EPS, CLAMP, image_token_mask=mask),
        'bwd': lambda: lib.engram_gate_bwd(*bwd, CLAMP, image_token_mask=mask),
    }


def _bytes(op: str, num_tokens: int, hc: int, hidden: int, num_partials: int) -> int:
    """Bytes the call must move, as perf_report counts them (the weight stays in L2)."""
    row = num_tokens * hidden * 2
    if op == 'fwd':  # x, kv read; output and four (T, hc) fp32 saved tensors written
        return (3 * hc + 1) * row + 4 * num_tokens * hc * 4
    # grad_out, x, kv and the saved tensors read; grad_x, grad_kv and the (P, hc, H) fp32 partials written
    return (5 * hc + 2) * row + 4 * num_tokens * hc * 4 + num_partials * hc * hidden * 4


def _libraries(with_tk: bool) -> dict:
    import cann_ops_tilelang

    libs = {'ours': cann_ops_tilelang}
    if with_tk:
        try:
            import tile_kernels.engram as tk

            libs['tk'] = tk
        except Exception:  # not installed, or no GPU backend
            pass
    return libs


def _compile_shape(job: tuple[int, int, bool]) -> str | None:
    """Compile (into TileLang's disk cache) every kernel the sweep times at (hc, H): one small call of each."""
    from cann_ops_tilelang.config import get_num_cores
    from cann_ops_tilelang.engram.engram_gate_bwd_kernel import fixed_range_max_tokens

    hc, hidden, with_tk = job
    device = torch.device('cuda', 0)
    num_tokens = fixed_range_max_tokens(get_num_cores(device)) + 1  # the claiming kernel, as at T = 4001
    inp = _inputs(num_tokens, hc, hidden, device)
    errors = []
    for name, lib in _libraries(with_tk and hc == 4).items():
        for mask in (None, torch.zeros(num_tokens, dtype=torch.bool, device=device)):
            for op, call in _calls(lib, inp, mask).items():
                try:
                    call()
                except Exception as exc:  # reported by the timing pass, which calls it again
                    errors.append(f'{name} {op} hc={hc} H={hidden}: {type(exc).__name__}')
    torch.cuda.synchronize(device)
    return '; '.join(errors) or None


def compile_all(hcs, hiddens, *, with_tk: bool, jobs: int) -> None:
    compile_in_workers(_compile_shape, [(hc, h, with_tk) for hc in hcs for h in hiddens], jobs)


def _cell(value, fmt='{:.0f}') -> str:
    return '-' if value is None else fmt.format(value)


def report(args, device, ceiling_gbs: float, out: Callable[[str], None]) -> None:
    """The sweep's table over args.sweep_hc x args.sweep_hidden x args.sweep_tokens."""
    libs = _libraries(args.tilekernels)
    compile_all(args.sweep_hc, args.sweep_hidden, with_tk='tk' in libs, jobs=args.jobs)
    out(f'### Gate width sweep (copy ceiling {ceiling_gbs:.0f} GB/s; do_bench CUPTI medians, L2 flushed)')
    out('')
    out(
        '| hc | H | T | fwd GB/s | fwd % copy | fwd mask / none | fwd / TK | '
        'bwd GB/s | bwd % copy | bwd mask / none | bwd / TK |'
    )
    out('| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |')
    for hc in args.sweep_hc:
        for hidden in args.sweep_hidden:
            for num_tokens in args.sweep_tokens:
                inp = _inputs(num_tokens, hc, hidden, device)
                text_only = torch.zeros(num_tokens, dtype=torch.bool, device=device)
                tk = libs.get('tk') if hc == 4 else None
                num_partials = _calls(libs['ours'], inp, None)['bwd']().grad_w_partial.shape[0]
                cells = []
                for op in ('fwd', 'bwd'):
                    fns = [_calls(libs['ours'], inp, None)[op], _calls(libs['ours'], inp, text_only)[op]]
                    fns.append(_calls(tk, inp, None)[op] if tk is not None else None)
                    rounds = args.rounds if tk is not None else 1
                    timing = {'warmup': WARMUP_MS, 'rep': REP_MS}
                    plain, masked, theirs = (us for us, _ in perf_report.alternating_medians(fns, rounds, **timing))
                    gbs = _bytes(op, num_tokens, hc, hidden, num_partials) / plain / 1e3 if plain else None
                    cells += [
                        _cell(gbs),
                        _cell(gbs and 100 * gbs / ceiling_gbs, '{:.1f}'),
                        _cell(masked / plain if masked and plain else None, '{:.3f}'),
                        _cell(theirs / plain if theirs and plain else None, '{:.2f}'),
                    ]
                out(f'| {hc} | {hidden} | {num_tokens} | ' + ' | '.join(cells) + ' |')
                del inp, text_only
                torch.cuda.empty_cache()
    out('')
    out('(x / TK: TileKernels time over ours, above 1 ours is faster; mask / none: all-False mask over None)')
    out('')


def add_arguments(parser: argparse.ArgumentParser, *, prefix: str = '') -> None:
    """The sweep's grid options (`prefix`: 'sweep-' inside perf_report, whose --hc / --hidden are its own)."""
    parser.add_argument(f'--{prefix}hc', dest='sweep_hc', nargs='+', type=int, default=list(SWEEP_HC))
    parser.add_argument(f'--{prefix}hidden', dest='sweep_hidden', nargs='+', type=int, default=list(SWEEP_HIDDEN))
    parser.add_argument(f'--{prefix}tokens', dest='sweep_tokens', nargs='+', type=int, default=list(SWEEP_TOKENS))
    parser.add_argument('--jobs', type=int, default=14, help='sweep: compile worker processes')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument('--rounds', type=int, default=3, help='alternating rounds where TileKernels runs')
    parser.add_argument('--no-tilekernels', dest='tilekernels', action='store_false')
    parser.add_argument('--output', help='also write the table (markdown) to this file')
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print('width_sweep needs a CUDA GPU', file=sys.stderr)
        return 2
    device = torch.device('cuda', torch.cuda.current_device())
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    ceiling_gbs, _ = perf_report.copy_ceiling(device)
    report(args, device, ceiling_gbs, out)
    if args.output:
        with open(args.output, 'w', encoding='utf-8') as f:
            f.write('\n'.join(lines) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
