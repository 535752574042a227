"""The MoE routing operators against TileKernels 2.1.0 on one GPU, in one process: whether the results agree, the
time of each (do_bench medians under its L2 flush, CUPTI, rounds alternating between ours and the peer's call),
the copy that moves the same bytes, and `torch.compile` of the float64-free reference math where one is cheap to
state (moe_topk: torch.topk; moe_normalize_weight: a sum and a division).

    PYTHONPATH=<tile_kernels 2.1.0> python -m tests.moe.perf_report [--rounds 5] [--ops a,b] [--sweep]
        [--no-compile] [--no-host | --host-only] [--jobs N]

--sweep: every operator over the experts 64 .. 512 (and T = 1 .. 131072) at top-k 8 instead of the fixed table.
--no-compile: no torch.compile column (its compiles take most of a row's time). --no-host: no second table (the
wall time per eager call at 128 tokens, where the host path and not the kernel sets it). Every kernel of ours and of the
peer is compiled first, in --jobs processes (TileLang's disk cache hands them to the timing process).
Our calls go through the public operators (with out= buffers where they have them), the peer's as it is called.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

import cann_ops_tilelang as ops
from tests.testing.device_timing import (
    agreement,
    alternating_medians,
    compile_in_workers,
    print_comparison,
    same_traffic_floors,
)

SCALING = 2.5  # routed_scaling_factor of DeepSeek-V3


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    variant: str  # what the call adds to the plain one
    num_tokens: int
    num_experts: int
    num_topk: int


def _logits(case: Case, device) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(case.num_tokens, case.num_experts, device=device)


def _bytes(*tensors) -> int:
    return sum(t.nbytes for t in tensors if t is not None)


def _gate_kwargs(case: Case, device) -> dict:
    T, E = case.num_tokens, case.num_experts
    kwargs = {}
    if 'bias' in case.variant:
        kwargs['bias'] = torch.randn(E, device=device) * 0.1
    if 'mask' in case.variant:
        kwargs['mask'] = torch.rand(T, device=device) < 0.9
    if 'physical' in case.variant:  # two replicas of every logical expert (shared included)
        logical = E + 1
        kwargs['to_physical_map'] = torch.arange(2 * logical, device=device, dtype=torch.int32).view(logical, 2)
        kwargs['logical_count'] = torch.full((logical,), 2, device=device, dtype=torch.int32)
    return kwargs


def _calls(case: Case, tk, device, with_compiled: bool = True, with_out: bool = True):
    """(ours: () -> result, peer: () -> result, moved bytes, compiled reference or None) of a case; ours writes
    into out= buffers unless `with_out` is False (then it allocates its results, as the peer does)."""
    T, E, K = case.num_tokens, case.num_experts, case.num_topk

    def into(*buffers):  # the out= keyword of our call, or none
        return {'out': buffers[0] if len(buffers) == 1 else buffers} if with_out else {}

    logits = _logits(case, device)
    compile_ = torch.compile if with_compiled else (lambda fn: None)
    if case.op == 'moe_topk':
        out = torch.empty(T, K, dtype=torch.int64, device=device)
        compiled = compile_(lambda: torch.topk(logits, K, dim=1).indices)
        return (
            lambda: ops.moe_topk(logits, K, **into(out)),
            lambda: tk.topk_gate(logits, K),
            _bytes(logits, out),
            compiled,
        )
    if case.op == 'moe_normalize_weight':
        w = torch.rand(T, K, device=device)
        den, nw = torch.empty(T, device=device), torch.empty(T, K, device=device)
        compiled = compile_(lambda: (w.sum(1), w / w.sum(1, keepdim=True)))
        return (
            lambda: ops.moe_normalize_weight(w, **into(den, nw)),
            lambda: tk.normalize_weight(w),
            _bytes(w, den, nw),
            compiled,
        )
    shared = 1 if 'shared' in case.variant else 0
    kwargs = _gate_kwargs(case, device)
    args = (logits, K, bool(shared), shared, SCALING, 0, 'sqrtsoftplus')
    if case.op == 'moe_topk_gate':
        idx = torch.empty(T, K + shared, dtype=torch.int64, device=device)
        w = torch.empty(T, K + shared, device=device)
        scores = torch.empty_like(logits) if 'scores' in case.variant else None
        extra = {'scores': scores} if scores is not None else {}
        return (
            lambda: ops.moe_topk_gate(*args, **kwargs, **into(idx, w), **extra),
            lambda: tk.moe_topk_gate(*args, **kwargs, **extra),
            _bytes(logits, idx, w, scores, *kwargs.values()),
            None,
        )
    if case.op == 'moe_topk_gate_backward':
        scores = torch.empty_like(logits)
        idx, w = tk.moe_topk_gate(logits, K, False, 0, SCALING, 0, 'sqrtsoftplus', scores=scores)
        grad = torch.randn_like(w)
        aux = {}
        if 'aux' in case.variant:
            aux = {'mask': torch.ones(T, dtype=torch.bool, device=device)}
            aux['grad_scores_sum'] = torch.randn(1, E, device=device)
        out = torch.empty_like(logits)
        bargs = (scores, idx, w, grad, SCALING, 'sqrtsoftplus')
        return (
            lambda: ops.moe_topk_gate_backward(*bargs, **aux, **into(out)),
            lambda: tk.moe_topk_gate_backward(*bargs, **aux),
            _bytes(scores, idx, w, grad, out, *aux.values()),
            None,
        )
    raise ValueError(f'unknown operator {case.op!r}')


def _agree(ours, theirs) -> str:
    """'equal' (bitwise), 'close' (fp32 values within 1e-5 relative, indices equal) or 'DIFF'."""
    ours = ours if isinstance(ours, tuple) else (ours,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    if len(ours) != len(theirs) or any(a.shape != b.shape for a, b in zip(ours, theirs, strict=True)):
        return 'DIFF (shapes)'
    if all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)):
        return 'equal'
    close = all(
        torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        for a, b in zip(ours, theirs, strict=True)
    )
    return 'close' if close else 'DIFF'


TABLE = [
    *(Case('moe_topk', '', T, E, K) for T, E, K in [(4001, 256, 8), (8001, 384, 8), (32768, 256, 8), (4001, 64, 6)]),
    *(Case('moe_normalize_weight', '', T, 0, K) for T, K in [(4001, 8), (32768, 8), (8001, 9)]),
    *(
        Case('moe_topk_gate', v, T, E, 8)
        for v in ('', 'bias,shared', 'bias,shared,mask,scores', 'bias,shared,physical')
        for T, E in [(4001, 256), (32768, 256)]
    ),
    Case('moe_topk_gate', 'bias', 8001, 384, 6),
    *(Case('moe_topk_gate_backward', v, T, E, 8) for v in ('', 'aux') for T, E in [(4001, 256), (32768, 256)]),
    Case('moe_topk_gate_backward', '', 8001, 384, 6),
]
# Host time per eager call: few tokens, so the launch path and not the kernel sets the figure; ours allocates its
# results as the peer does (no out=).
HOST_TABLE = [
    Case('moe_topk', '', 128, 256, 8),
    Case('moe_normalize_weight', '', 128, 0, 8),
    *(Case('moe_topk_gate', v, 128, 256, 8) for v in ('', 'bias,shared,mask,scores', 'bias,shared,physical')),
    *(Case('moe_topk_gate_backward', v, 128, 256, 8) for v in ('', 'aux')),
]
SWEEP_EXPERTS = (64, 128, 256, 384, 512)
SWEEP_TOKENS = (1, 128, 4001, 32768, 131072)


def _warm(case: Case) -> str | None:
    """Compile ours and the peer's kernels of `case` (a worker of compile_in_workers): one call of each."""
    import tile_kernels.moe as tk

    try:
        ours, peer, _, _ = _calls(case, tk, torch.device('cuda'), with_compiled=False)
        ours(), peer()
    except Exception as exc:  # the timing pass reports it
        return f'{case}: {type(exc).__name__}'
    return None


SWIGLU_SHAPES = [(4001, 2048), (8001, 2048), (32768, 1536), (4001, 4096)]  # (rows, I): x is (rows, 2 I) bf16
SWIGLU_OPS = (
    'moe_swiglu_forward',
    'moe_swiglu_forward_and_per_token_cast',
    'moe_swiglu_backward',
    'moe_swiglu_backward_and_per_token_cast',
)


def _swiglu_calls(tk_quant, op: str, rows: int, inter: int, device):
    """(ours, peer, moved bytes, agreement) of a SwiGLU row: plain rows (no expert layout), top-k weights and
    DeepSeek-V3's routed scaling; the forward's fused cast to e4m3 with 32-channel UE8M0 scales; the backwards
    from bf16 x, or from e4m3 x with 128-channel fp32 scales and the same cast of x's gradient, both recomputing
    the activation."""
    torch.manual_seed(0)
    x = torch.randn(rows, 2 * inter, device=device).to(torch.bfloat16)
    w = torch.rand(rows, device=device)
    if op.startswith('moe_swiglu_backward'):
        grad = torch.randn(rows, inter, device=device).to(torch.bfloat16)
        kwargs = {'topk_weights': w, 'routed_scaling_factor': SCALING, 'do_recompute': True}
        if op == 'moe_swiglu_backward':
            args, peer_fn, ours_fn = (x, grad, 'bf16'), tk_quant.swiglu_backward, ops.moe.moe_swiglu_backward
            inputs = (x,)
        else:
            scales = (x.float().view(rows, -1, 128).abs().amax(-1) / 448).clamp_min(1e-4)
            data = (x.float().view(rows, -1, 128) / scales[..., None]).to(torch.float8_e4m3fn).view(rows, -1)
            args = ((data, scales), grad, 'e4m3', 128)
            peer_fn = tk_quant.swiglu_backward_and_per_token_cast
            ours_fn = ops.moe.moe_swiglu_backward_and_per_token_cast
            inputs = (data, scales)
        result = ours_fn(*args, **kwargs)
        peer_result = tuple(_flat_tensors(peer_fn(*args, **kwargs)))
        agree = agreement(tuple(_flat_tensors(result)), peer_result, rtol=2e-2, atol=2e-2)
        moved = _bytes(*inputs, grad, w, *_flat_tensors(result))
        return lambda: ours_fn(*args, **kwargs), lambda: peer_fn(*args, **kwargs), moved, agree
    if op == 'moe_swiglu_forward':
        args, kwargs, peer_fn = (x, 'bf16'), {}, tk_quant.swiglu_forward
        ours_fn = ops.moe.moe_swiglu_forward
    else:
        args, kwargs = (x, 'e4m3', 32), {'round_sf': True, 'use_packed_ue8m0': True}
        ours_fn, peer_fn = ops.moe.moe_swiglu_forward_and_per_token_cast, tk_quant.swiglu_forward_and_per_token_cast
    kwargs.update(topk_weights=w, routed_scaling_factor=SCALING)
    result = ours_fn(*args, **kwargs)
    buffers = tuple(torch.empty_like(t) for t in result) if isinstance(result, tuple) else torch.empty_like(result)
    agree = agreement(result, peer_fn(*args, **kwargs))
    moved = _bytes(x, w, *(result if isinstance(result, tuple) else (result,)))
    return lambda: ours_fn(*args, **kwargs, out=buffers), lambda: peer_fn(*args, **kwargs), moved, agree


def _flat_tensors(result):
    for r in result if isinstance(result, tuple) else (result,):
        if isinstance(r, tuple):
            yield from _flat_tensors(r)
        elif isinstance(r, torch.Tensor):
            yield r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--sweep', action='store_true')
    parser.add_argument('--ops', default='', help='comma-separated operator names (default: all)')
    parser.add_argument('--no-compile', dest='compile', action='store_false', help='skip the torch.compile column')
    parser.add_argument('--jobs', type=int, default=12, help='compile worker processes')
    parser.add_argument('--swiglu', action='store_true', help='the SwiGLU rows only (its own table)')
    parser.add_argument('--no-host', dest='host', action='store_false', help='skip the host-time table')
    parser.add_argument('--host-only', action='store_true', help='the host-time table only')
    args = parser.parse_args()
    import tile_kernels.moe as tk  # the peer, where it is installed

    if args.swiglu:
        import tile_kernels.quant as tk_quant  # the peer's SwiGLU kernels are in its quant domain

        device = torch.device('cuda')
        print_comparison(
            [
                (op, rows, inter)
                for op in SWIGLU_OPS
                if not args.ops or op in args.ops.split(',')
                for rows, inter in SWIGLU_SHAPES
            ],
            lambda case: _swiglu_calls(tk_quant, *case, device),
            columns='operator | rows | I',
            cells=lambda case: ' | '.join(str(v) for v in case),
            rounds=args.rounds,
            device=device,
        )
        return

    device = torch.device('cuda')
    ops_all = ('moe_topk', 'moe_normalize_weight', 'moe_topk_gate', 'moe_topk_gate_backward')
    cases = (
        [Case(op, 'bias' if op == 'moe_topk_gate' else '', T, E, 8) for op in ops_all for E in SWEEP_EXPERTS
         for T in SWEEP_TOKENS]
        if args.sweep
        else TABLE
    )  # fmt: skip
    if args.ops:
        cases = [c for c in cases if c.op in args.ops.split(',')]
    if args.host_only:
        report_host([c for c in HOST_TABLE if not args.ops or c.op in args.ops.split(',')], tk, device, args.rounds)
        return
    compile_in_workers(_warm, cases, args.jobs)
    print('| operator | variant | T | E | k | agree | ours us | TK us | compiled us | copy us | ours / TK | % copy |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |')
    for case in cases:
        head = f'| {case.op} | {case.variant or "plain"} | {case.num_tokens} | {case.num_experts} | {case.num_topk} |'
        try:
            ours, peer, moved, compiled = _calls(case, tk, device, args.compile)
            agree = _agree(ours(), peer())
        except Exception as exc:
            print(f'{head} failed: {type(exc).__name__}: {str(exc)[:160]} |', flush=True)
            continue
        (ours_us, why), (tk_us, _), (compiled_us, _) = alternating_medians([ours, peer, compiled], args.rounds)
        if ours_us is None:
            print(f'{head} failed: {why} |', flush=True)
            continue
        copy_us, _ = same_traffic_floors(moved, device)
        compiled_text = f'{compiled_us:.1f}' if compiled_us else '-'
        print(
            f'{head} {agree} | {ours_us:.1f} | {tk_us:.1f} | {compiled_text} | {copy_us:.1f} | '
            f'{ours_us / tk_us:.2f} | {100 * copy_us / ours_us:.0f} |',
            flush=True,
        )
    if args.host:
        report_host([c for c in HOST_TABLE if not args.ops or c.op in args.ops.split(',')], tk, device, args.rounds)


def report_host(cases: list[Case], tk, device, rounds: int) -> None:
    """Wall time per eager call, back to back, ours and the peer's in alternating rounds
    (tests.testing.host_timing.paired_host_times)."""
    from tests.testing import host_timing

    if cases:  # the first measurement of a process reads high on both sides (H200, 2026-12-04): one thrown away
        for fn in _calls(cases[0], tk, device, with_compiled=False, with_out=False)[:2]:
            host_timing.host_time_us(fn, torch.cuda.synchronize, rounds=1)
    print()
    print('| host time per call | variant | T | E | k | ours us | TK us | ours / TK |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- |')
    for case in cases:
        ours, peer, _, _ = _calls(case, tk, device, with_compiled=False, with_out=False)
        ours_us, peer_us, ratio = host_timing.paired_host_times(ours, peer, torch.cuda.synchronize, rounds=rounds)
        print(
            f'| {case.op} | {case.variant or "plain"} | {case.num_tokens} | {case.num_experts} | {case.num_topk} | '
            f'{ours_us:.1f} | {peer_us:.1f} | {ratio:.2f} |',
            flush=True,
        )


if __name__ == '__main__':
    main()
