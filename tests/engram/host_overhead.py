"""Wall time per eager call of every public operator, back to back, against TileKernels 2.1.0 (issue #14).

    python -m tests.engram.host_overhead                 # CUDA GPU: ours and TileKernels', one process
    python -m tests.engram.host_overhead --ops gate_bwd --calls 500 --rounds 9
    python -m tests.engram.host_overhead --stub          # no device: CPU tensors pose as CUDA ones, the
                                                         # kernel launches are stubbed (the host path alone)
    python -m tests.engram.host_overhead --stub --profile gate_bwd   # cProfile of one operator's calls
    python -m tests.engram.host_overhead --stub --min --calls 100 --rounds 40  # on a busy host

Small, launch-bound calls (T = 16, hc = 4, H = 7168; the Sinkhorn operators at 1001 x 256): what a caller
waits for in eager mode is the host time of a call. Each figure is the median over `--rounds` rounds of
`--calls` calls back to back, the device synchronised once at the end of a round, after a warm-up (which
also compiles the kernels); per operator the rounds of the two libraries alternate. Inputs are shared by
both libraries; operators that update a buffer in place (grad_w_reduce, the Sinkhorn momentum and step)
keep updating it, which changes no launch. A failing operator (or library) prints its error in its cell;
the rest of the table is still measured. The last row times `weight_hidden.float() * weight_embed.float()`
in torch (three launches) as a yardstick of the host.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import pstats
import statistics
import sys
import time
from collections.abc import Callable

import torch

T, HC, H = 16, 4, 7168
EPS, CLAMP = 1e-6, 1e-6
HASH_LAYERS, HASH_NGRAM, HASH_TABLES = 2, 3, 8  # L, N, E of the README's hash benchmark
SINKHORN_ROWS, SINKHORN_HEAD_DIM = 1001, 256
NUM_PARTIALS = 132  # grad_w_reduce's P: an H200's SMs (what the backward produces there)
CALLS, ROUNDS = 200, 7  # calls per round, rounds (the median is reported)
OPS = (
    'fused_weight',
    'gate_fwd',
    'gate_bwd',
    'grad_w_reduce',
    'hash',
    'sinkhorn_momentum_update',
    'sinkhorn_step',
    'sinkhorn_step_reduce',
    'sinkhorn_finalize',
)
# The module behind each public operator (for --stub, which replaces its kernel's compile).
_MODULES = {name: f'engram_{name}' for name in OPS}


def make_inputs(device: torch.device) -> dict:
    bf16 = torch.bfloat16
    inp = {
        'x': torch.randn(T, HC, H, dtype=bf16, device=device),
        'kv': torch.randn(T, HC + 1, H, dtype=bf16, device=device),
        'wh': (1.0 + 0.5 * torch.randn(HC, H, device=device)).to(bf16),
        'we': (1.0 + 0.5 * torch.randn(HC, H, device=device)).to(bf16),
        'grad_out': torch.randn(T, HC, H, dtype=bf16, device=device),
        'partial': torch.randn(NUM_PARTIALS, HC, H, device=device),
        'gwh': torch.zeros(HC, H, device=device),
        'gwe': torch.zeros(HC, H, device=device),
        'ids': torch.randint(0, 1 << 17, (T, HASH_NGRAM), dtype=torch.int32, device=device),
        'multipliers': torch.randint(1, 1 << 40, (HASH_LAYERS, HASH_NGRAM), dtype=torch.int64, device=device),
        'vocab_sizes': torch.randint(
            1000, 1 << 20, (HASH_LAYERS, HASH_NGRAM - 1, HASH_TABLES), dtype=torch.int32, device=device
        ),
        'offsets': torch.zeros(HASH_LAYERS, (HASH_NGRAM - 1) * HASH_TABLES, dtype=torch.int32, device=device),
        'grad': torch.randn(SINKHORN_ROWS * SINKHORN_HEAD_DIM, device=device).to(bf16),
        'momentum': torch.randn(SINKHORN_ROWS * SINKHORN_HEAD_DIM, device=device),
        'matrix': torch.rand(SINKHORN_ROWS, SINKHORN_HEAD_DIM, device=device) + 0.5,
        'row_scale': torch.ones(SINKHORN_ROWS, device=device),
        'col_scale': torch.ones(SINKHORN_HEAD_DIM, device=device),
        'col_sumsq': torch.empty(SINKHORN_HEAD_DIM, device=device),
    }
    inp['w'] = inp['wh'].float() * inp['we'].float()
    # The saved tensors of a forward: positive norms, gates in (0, 1), dots away from the clamp.
    inp['saved'] = tuple(torch.rand(T, HC, device=device) + 0.5 for _ in range(4))
    inp['col_sumsq_partial'] = torch.rand(2 * NUM_PARTIALS, SINKHORN_HEAD_DIM, device=device)
    return inp


def calls(lib, inp: dict, *, tile_kernels: bool) -> dict[str, Callable[[], object]]:
    """One eager call per operator. TileKernels names fused_weight / grad_w_reduce without the prefix."""
    fused_weight = lib.fused_weight if tile_kernels else lib.engram_fused_weight
    grad_w_reduce = lib.grad_w_reduce if tile_kernels else lib.engram_grad_w_reduce
    x, kv, w, saved = inp['x'], inp['kv'], inp['w'], inp['saved']
    return {
        'fused_weight': lambda: fused_weight(inp['wh'], inp['we']),
        'gate_fwd': lambda: lib.engram_gate_fwd(x, kv, w, EPS, CLAMP),
        'gate_bwd': lambda: lib.engram_gate_bwd(inp['grad_out'], x, kv, w, *saved, CLAMP),
        'grad_w_reduce': lambda: grad_w_reduce(inp['partial'], inp['wh'], inp['we'], inp['gwh'], inp['gwe']),
        'hash': lambda: lib.engram_hash(inp['ids'], inp['multipliers'], inp['vocab_sizes'], inp['offsets']),
        'sinkhorn_momentum_update': lambda: lib.engram_sinkhorn_momentum_update(inp['grad'], inp['momentum'], 0.9),
        'sinkhorn_step': lambda: lib.engram_sinkhorn_step(inp['matrix'], inp['row_scale'], inp['col_scale'], EPS),
        'sinkhorn_step_reduce': lambda: lib.engram_sinkhorn_step_reduce(inp['col_sumsq_partial'], inp['col_sumsq']),
        'sinkhorn_finalize': lambda: lib.engram_sinkhorn_finalize(
            inp['matrix'], inp['row_scale'], inp['col_scale'], EPS, 1.0
        ),
    }


def _round_us(fn: Callable[[], object], sync: Callable[[], None], calls: int) -> float:
    """The wall time per call (us) of `calls` back-to-back calls, the device synchronised at the end."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def _warm_up(fn: Callable[[], object], sync: Callable[[], None], calls: int) -> None:
    for _ in range(max(10, calls // 10)):  # compiles, fills the caches and the allocator
        fn()
    sync()


def time_per_call(
    fn: Callable[[], object], sync: Callable[[], None], *, calls: int, rounds: int, statistic=statistics.median
) -> float:
    """`statistic` (the median) over rounds of the wall time per call (us) of `calls` back-to-back calls."""
    _warm_up(fn, sync, calls)
    return statistic([_round_us(fn, sync, calls) for _ in range(rounds)])


def measure(libraries: dict[str, dict], names, sync, *, calls: int, rounds: int, statistic=statistics.median):
    """library -> operator -> time per call (us) or the error of the call, `libraries` mapping a name to its
    calls(). Per operator the libraries' rounds alternate (ours, theirs, ours, ...), so that a drift of the
    host (clocks, other load) between rounds reaches both alike."""
    results: dict[str, dict[str, float | str]] = {library: {} for library in libraries}
    for name in names:
        per_round: dict[str, list[float]] = {}
        for library, fns in libraries.items():
            try:
                _warm_up(fns[name], sync, calls)
                per_round[library] = []
            except Exception as exc:  # reported in the table; the other operators are still measured
                results[library][name] = f'{type(exc).__name__}: {str(exc).splitlines()[0][:60] if str(exc) else ""}'
        for _ in range(rounds):
            for library in per_round:
                per_round[library].append(_round_us(libraries[library][name], sync, calls))
        for library, values in per_round.items():
            results[library][name] = statistic(values)
    return results


@contextlib.contextmanager
def stubbed_launches():
    """CPU tensors posing as CUDA tensors of an H200 (132 SMs), every kernel's compile replaced by a no-op
    callable: what remains of a call is its host path (validation, configuration, allocation, launch
    plumbing). The kernels' TileLang sources are not even built. Differences from a real CUDA call: the
    allocations are the CPU allocator's (and a zero fill is no kernel launch), the CUDA stream / device
    queries of the launch and of the backward's counter lookup are missing, and every call takes the full
    path: the fast path (docs/engram.md, "Host path") needs CUDA tensors and a compiled entry that checks
    its arguments."""
    from cann_ops_tilelang import config, kernel_target

    class _NoKernel:
        def __call__(self, *args):
            return None

        def get_kernel_source(self) -> str:
            return ''

    saved: list[tuple[object, str, object]] = []

    def patch(obj, attr, value):
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)

    real_backend_of = config.backend_of
    patch(config, 'backend_of', lambda device: 'cuda' if device.type == 'cpu' else real_backend_of(device))
    patch(config, '_index', lambda device, backend: 0 if device is None or device.index is None else device.index)
    patch(config, '_cuda_sm_count', lambda index: NUM_PARTIALS)
    patch(kernel_target, 'device_guard', lambda device: contextlib.nullcontext())
    import cann_ops_tilelang
    from cann_ops_tilelang.engram import _gate_bwd_counters

    for module in _MODULES.values():
        kernels = importlib.import_module(f'cann_ops_tilelang.engram.{module}_kernel')
        patch(kernels, 'compile_kernel', lambda prim_func, backend: _NoKernel())
        patch(kernels, f'make_{module}_kernel', lambda cfg: None)
        getattr(kernels, f'get_{module}_kernel').cache_clear()
        # launchers made before the patch would launch real kernels
        declared = getattr(cann_ops_tilelang, module).operator
        patch(declared, '_launchers', {})
        patch(declared, 'fast', {})
    # The backward's counter lookup asks CUDA for the current stream (a CPU build has no such call): one
    # stream, never capturing; its counters (CPU tensors) are dropped afterwards.
    patch(_gate_bwd_counters, 'launch_stream', lambda index: 0)
    patch(_gate_bwd_counters, 'COUNTERS', {})
    patch(_gate_bwd_counters, 'UNUSED_COUNTERS', {})
    try:
        yield torch.device('cpu')
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)
        for module in _MODULES.values():
            kernels = importlib.import_module(f'cann_ops_tilelang.engram.{module}_kernel')
            getattr(kernels, f'get_{module}_kernel').cache_clear()


def import_tile_kernels():
    """(tile_kernels.engram, None), or (None, why not)."""
    try:
        return importlib.import_module('tile_kernels.engram'), None
    except Exception as exc:
        return None, f'{type(exc).__name__}: {exc}'


def _cell(value) -> str:
    return f'{value:9.1f} us' if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--ops', nargs='+', choices=OPS, default=list(OPS))
    parser.add_argument('--calls', type=int, default=CALLS, help=f'calls per round (default {CALLS})')
    parser.add_argument('--rounds', type=int, default=ROUNDS, help=f'rounds; the median is reported (default {ROUNDS})')
    parser.add_argument(
        '--min', action='store_true', help='report the fastest round, not the median (a host shared with other work)'
    )
    parser.add_argument('--stub', action='store_true', help='no device: the host path alone, launches stubbed')
    parser.add_argument('--profile', choices=OPS, help='cProfile this operator (ours), top 25 by own time')
    parser.add_argument('--no-tilekernels', dest='tilekernels', action='store_false')
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        parser.error('--calls and --rounds must be >= 1')

    import cann_ops_tilelang

    with contextlib.ExitStack() as stack:
        if args.stub:
            device = stack.enter_context(stubbed_launches())
            tk, why = None, 'not with --stub (its kernels need a GPU)'
        else:
            if not torch.cuda.is_available():
                print('host_overhead: needs a CUDA GPU (or --stub for the host path alone)', file=sys.stderr)
                return 1
            device = torch.device('cuda', torch.cuda.current_device())
            tk, why = import_tile_kernels() if args.tilekernels else (None, 'disabled (--no-tilekernels)')
        sync = torch.cuda.synchronize if device.type == 'cuda' else (lambda: None)
        inp = make_inputs(device)
        libraries = {'ours': calls(cann_ops_tilelang, inp, tile_kernels=False)}
        if tk is not None:
            libraries['tk'] = calls(tk, inp, tile_kernels=True)
        results = measure(libraries, args.ops, sync, **_sizes(args))
        ours, theirs = results['ours'], results.get('tk')
        yardstick = time_per_call(lambda: inp['wh'].float() * inp['we'].float(), sync, **_sizes(args))

        where = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU, launches stubbed'
        print(
            f'wall time per eager call, back to back: T = {T}, hc = {HC}, H = {H} ({where}; torch {torch.__version__})'
        )
        statistic = 'fastest' if args.min else 'median'
        tk_state = 'imported' if tk is not None else why
        print(f'{statistic} of {args.rounds} rounds of {args.calls} calls; TileKernels: {tk_state}')
        print('| op | cann_ops_tilelang | TileKernels | ratio ours / TK |\n| --- | --- | --- | --- |')
        for name in args.ops:
            mine, other = ours[name], (theirs or {}).get(name, '-')
            ratio = f'{mine / other:.2f}' if isinstance(mine, float) and isinstance(other, float) else '-'
            print(f'| {name} | {_cell(mine)} | {_cell(other)} | {ratio} |')
        print(f'| torch wh.float() * we.float() | {_cell(yardstick)} | | |')

        if args.profile:
            fn = calls(cann_ops_tilelang, inp, tile_kernels=False)[args.profile]
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.calls * args.rounds):
                fn()
            sync()
            profiler.disable()
            pstats.Stats(profiler).sort_stats('tottime').print_stats(25)
    return 0


def _sizes(args) -> dict:
    return {'calls': args.calls, 'rounds': args.rounds, 'statistic': min if args.min else statistics.median}


if __name__ == '__main__':
    sys.exit(main())
