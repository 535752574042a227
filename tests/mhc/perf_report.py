"""The mhc operators against TileKernels 2.1.0 on one GPU, in one process: whether the results agree, the device
times (do_bench medians under its L2 flush, rounds alternating between ours and the peer's call) and the copy that
moves the same bytes.

    PYTHONPATH=<tile_kernels 2.1.0> python -m tests.mhc.perf_report [--rounds 5] [--ops a,b] [--mult 4]

Rows: the peer's shapes, mhc_mult 4 by default: the streaming operators (expand, pre_apply_mix, post and their
backwards) at (T, H) = (4001, 4096), (8001, 7168), (4001, 2560); Sinkhorn at T = 4001 / 8001 with 10 and 20
repeats; the mixes at T = 4001 / 8001; fn_normw_merge at K = mhc_mult * 4096; the partials' reduction at T = 4001 /
8001 with 16 splits; mhc_multilayer_recompute over 4 layers at the streaming shapes; mhc_pre_big_fuse_fwd (the whole
pre path, what mhc_pre_big_fuse_fwd.FUSE_ON_CUDA chooses) at the streaming shapes with 16 splits and 20 Sinkhorn
rounds. Both sides write the same preallocated buffers (the peer's calling convention).
"""

from __future__ import annotations

import argparse

import torch

from cann_ops_tilelang import mhc
from tests.testing.device_timing import agreement, print_comparison

from .mhc_reduce_partials_and_rmsnorm_fwd_ref import prenorm_gemm_partials

STREAM_SHAPES = ((4001, 4096), (8001, 7168), (4001, 2560))
SINKHORN_CASES = ((4001, 10), (4001, 20), (8001, 10), (8001, 20))
MIX_TOKENS = (4001, 8001)
SPLITS = 16
EPS = 1e-6
STREAM_OPS = (
    'mhc_expand_fwd',
    'mhc_expand_bwd',
    'mhc_pre_apply_mix_fwd',
    'mhc_pre_apply_mix_bwd',
    'mhc_post_fwd',
    'mhc_post_bwd',
)
OTHER_OPS = (
    'mhc_sinkhorn_fwd',
    'mhc_sinkhorn_bwd',
    'mhc_head_compute_mix_fwd',
    'mhc_pre_split_mixes_fwd',
    'mhc_fn_normw_merge_fwd',
    'mhc_reduce_partials_and_rmsnorm_fwd',
)
RECOMPUTE_OP = 'mhc_multilayer_recompute'
BIG_FUSE_OP = 'mhc_pre_big_fuse_fwd'
BIG_FUSE_REPEAT = 20  # the peer's benchmark's Sinkhorn rounds
RECOMPUTE_LAYERS = 4
# Host time per call (--host): (T, H, layers) of mhc_multilayer_recompute, where its launches are short; 8 layers
# are two of our launches, one of the peer's.
RECOMPUTE_HOST_CASES = ((128, 4096, 4), (128, 4096, 8))
PEER_NAMES = {'mhc_expand_fwd': 'expand_to_mhc_fwd', 'mhc_expand_bwd': 'expand_to_mhc_bwd'}


def _bf16(*shape, device):
    return torch.randn(*shape, device=device).to(torch.bfloat16)


def _stream_calls(tk, op: str, T: int, M: int, H: int, device):
    torch.manual_seed(0)
    ours_fn, peer_fn = getattr(mhc, op), getattr(tk, PEER_NAMES.get(op, op))
    x, streams = _bf16(T, H, device=device), _bf16(T, M, H, device=device)
    mix = torch.rand(T, M, device=device)
    if op == 'mhc_expand_fwd':
        inputs, written = (x,), [torch.empty(T, M, H, dtype=torch.bfloat16, device=device)]
    elif op == 'mhc_expand_bwd':
        inputs, written = (streams,), [torch.empty(T, H, dtype=torch.bfloat16, device=device)]
    elif op == 'mhc_pre_apply_mix_fwd':
        inputs, written = (streams, mix), [torch.empty(T, H, dtype=torch.bfloat16, device=device)]
    elif op == 'mhc_pre_apply_mix_bwd':
        inputs, written = (x, streams, mix), [torch.zeros(T, M, H, dtype=torch.bfloat16, device=device)]
    else:
        residual = streams.view(1, T, M, H)
        post, comb = torch.rand(1, T, M, 1, device=device), torch.rand(1, T, M, M, device=device)
        if op == 'mhc_post_fwd':
            inputs, written = (x.view(1, T, H), residual, post, comb), [torch.empty_like(residual)]
        else:
            inputs, written = (x.view(1, T, H), residual, post, comb, torch.randn_like(residual)), []
    mine, theirs = [w.clone() for w in written], [w.clone() for w in written]

    def ours():
        return ours_fn(*inputs, *mine)

    def peer():
        return peer_fn(*inputs, *theirs)

    result_ours, result_peer = ours(), peer()
    if op == 'mhc_pre_apply_mix_bwd':  # x_grad accumulates: compared after one call from zeros
        compared = (mine[0], result_ours), (theirs[0], result_peer)
    elif written:
        compared = tuple(mine), tuple(theirs)
    else:  # mhc_post_bwd returns its four gradients
        compared = tuple(result_ours), tuple(result_peer)
    moved = sum(t.nbytes for t in (*inputs, *written))
    if not written:
        moved += sum(t.nbytes for t in result_ours)
    return ours, peer, moved, agreement(*compared, rtol=1e-2, atol=1e-2)


def _recompute_calls(tk, T: int, M: int, H: int, device, L: int = RECOMPUTE_LAYERS):
    """mhc_multilayer_recompute over L layers (every layer with its post mapping): the peer builds its pinned
    pointer table inside the call, so its time includes that copy."""
    torch.manual_seed(0)
    initial = _bf16(T, M, H, device=device)
    pre = [torch.rand(T, M, device=device) for _ in range(L)]
    outputs = [_bf16(T, H, device=device) for _ in range(L)]
    post = [torch.rand(T, M, device=device) * 2 for _ in range(L)]
    comb = [torch.rand(T, M, M, device=device) * (2 / M) for _ in range(L)]

    def buffers():
        return [_bf16(T, H, device=device) for _ in range(L)], [_bf16(T, M, H, device=device) for _ in range(L)]

    mine, theirs = buffers(), buffers()

    def ours():
        return mhc.mhc_multilayer_recompute(initial, pre, outputs, post, comb, *mine)

    def peer():
        return tk.mhc_multilayer_recompute(initial, pre, outputs, post, comb, *theirs)

    ours(), peer()
    moved = sum(t.nbytes for t in (initial, *pre, *outputs, *post, *comb, *mine[0], *mine[1]))
    compared = (*mine[0], *mine[1]), (*theirs[0], *theirs[1])
    return ours, peer, moved, agreement(*compared, rtol=1e-2, atol=1e-2)


def big_fuse_inputs(T: int, M: int, H: int, device) -> tuple[torch.Tensor, ...]:
    """(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual) of mhc_pre_big_fuse_fwd: the SPLITS partials
    of a prenorm GEMM of the residual whose mixes come out O(1), as in a model."""
    torch.manual_seed(0)
    M3 = M * (M + 2)
    residual = _bf16(T, M, H, device=device)
    fn = torch.randn(M3, M * H, device=device) / (M * H) ** 0.5
    out_mul, sqrsum = prenorm_gemm_partials(residual.flatten(1), fn, SPLITS)
    scale, base = torch.rand(3, device=device) + 0.5, torch.randn(M3, device=device) * 0.5
    return out_mul.squeeze(2).contiguous(), sqrsum.squeeze(2).contiguous(), scale, base, residual


def big_fuse_buffers(T: int, M: int, H: int, device) -> list[torch.Tensor]:
    """[post_mix, comb_mix, layer_input]."""
    bf16 = torch.empty(T, H, dtype=torch.bfloat16, device=device)
    return [torch.empty(T, M, device=device), torch.empty(T, M * M, device=device), bf16]


BIG_FUSE_SCALARS = (EPS, 1e-2, EPS, 2.0, BIG_FUSE_REPEAT, SPLITS)  # rms, pre and Sinkhorn eps, post mult, repeat


def _big_fuse_calls(tk, T: int, M: int, H: int, device):
    """mhc_pre_big_fuse_fwd from the partials to post_mix, comb_mix and layer_input."""
    inputs = big_fuse_inputs(T, M, H, device)
    mine, theirs = big_fuse_buffers(T, M, H, device), big_fuse_buffers(T, M, H, device)

    def ours():
        return mhc.mhc_pre_big_fuse_fwd(*inputs, *mine, *BIG_FUSE_SCALARS)

    def peer():
        return tk.mhc_pre_big_fuse_fwd(*inputs, *theirs, *BIG_FUSE_SCALARS)

    ours(), peer()
    moved = sum(t.nbytes for t in (*inputs, *mine))
    return ours, peer, moved, agreement(tuple(mine), tuple(theirs), rtol=1e-2, atol=1e-2)


def _other_calls(tk, op: str, T: int, M: int, detail: int, device):
    """detail: Sinkhorn's repeat; the others ignore it."""
    torch.manual_seed(0)
    ours_fn, peer_fn = getattr(mhc, op), getattr(tk, op)
    W = M3 = M * (M + 2)  # the mix width: M pre, M post, M * M comb
    if op == 'mhc_sinkhorn_fwd':
        inputs, written = (torch.randn(T, M, M, device=device),), [torch.empty(T, M, M, device=device)]
        scalars = (detail, EPS)
    elif op == 'mhc_sinkhorn_bwd':
        grad, x = torch.randn(T, M, M, device=device), torch.randn(T, M, M, device=device)
        inputs, written, scalars = (grad, x), [torch.empty(T, M, M, device=device)], (detail, EPS)
    elif op == 'mhc_head_compute_mix_fwd':
        inputs = (torch.randn(T, M, device=device), torch.rand(1, device=device), torch.randn(M, device=device))
        written, scalars = [torch.empty(T, M, device=device)], (EPS,)
    elif op == 'mhc_pre_split_mixes_fwd':
        inputs = (torch.randn(T, W, device=device), torch.rand(3, device=device), torch.randn(W, device=device))
        written = [torch.empty(T, M, device=device), torch.empty(T, M, device=device)]
        written.append(torch.empty(T, M * M, device=device))
        scalars = (2.0, EPS)
    elif op == 'mhc_fn_normw_merge_fwd':
        K = M * 4096
        inputs, written = (
            (torch.randn(M3, K, device=device), torch.rand(K, device=device)),
            [torch.empty(M3, K, device=device)],
        )
        scalars = ()
    else:
        partials = torch.randn(SPLITS, T, 1, M3, device=device)
        squares = torch.rand(SPLITS, T, 1, device=device) * 100
        inputs = (partials, squares)
        written = [torch.empty(T, 1, M3, device=device), torch.empty(T, 1, device=device)]
        written.append(torch.empty(T, M3, device=device))
        scalars = (M * 4096, EPS, SPLITS)
    mine, theirs = [w.clone() for w in written], [w.clone() for w in written]

    def ours():
        return ours_fn(*inputs, *mine, *scalars)

    def peer():
        return peer_fn(*inputs, *theirs, *scalars)

    ours(), peer()
    moved = sum(t.nbytes for t in (*inputs, *written))
    return ours, peer, moved, agreement(tuple(mine), tuple(theirs), rtol=1e-4, atol=1e-5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument(
        '--ops',
        default=','.join((*STREAM_OPS, *OTHER_OPS, RECOMPUTE_OP, BIG_FUSE_OP)),
        help='comma-separated operator names',
    )
    parser.add_argument('--mult', type=int, default=4, help='mhc_mult (the peer: 4)')
    parser.add_argument('--host', action='store_true', help="mhc_multilayer_recompute's host time only")
    args = parser.parse_args()
    import tile_kernels.mhc as tk  # the peer, where it is installed

    device, M, ops = torch.device('cuda'), args.mult, args.ops.split(',')
    if args.host:
        report_host(tk, M, device, args.rounds)
        return
    cases = [(op, T, H) for op in STREAM_OPS if op in ops for T, H in STREAM_SHAPES]
    cases += [(op, T, r) for op in OTHER_OPS[:2] if op in ops for T, r in SINKHORN_CASES]
    cases += [(op, T, 0) for op in OTHER_OPS[2:] if op in ops for T in MIX_TOKENS]
    cases += [(RECOMPUTE_OP, T, H) for T, H in STREAM_SHAPES if RECOMPUTE_OP in ops]
    cases += [(BIG_FUSE_OP, T, H) for T, H in STREAM_SHAPES if BIG_FUSE_OP in ops]

    def calls(case):
        op, T, detail = case
        if op == RECOMPUTE_OP:
            return _recompute_calls(tk, T, M, detail, device)
        if op == BIG_FUSE_OP:
            return _big_fuse_calls(tk, T, M, detail, device)
        if op in STREAM_OPS:
            return _stream_calls(tk, op, T, M, detail, device)
        return _other_calls(tk, op, T, M, detail, device)

    print_comparison(
        cases,
        calls,
        columns='operator | T | H or repeat',
        cells=lambda case: ' | '.join(str(v) for v in case),
        rounds=args.rounds,
        device=device,
    )


def report_host(tk, M: int, device, rounds: int) -> None:
    """Wall time per eager call of mhc_multilayer_recompute, back to back, ours and the peer's in alternating
    rounds (tests.testing.host_timing.paired_host_times)."""
    from tests.testing import host_timing

    print('| host time per call | T | H | layers | agree | ours us | TK us | ours / TK |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- |')
    for T, H, L in RECOMPUTE_HOST_CASES:
        ours, peer, _, agree = _recompute_calls(tk, T, M, H, device, L)
        ours_us, peer_us, ratio = host_timing.paired_host_times(ours, peer, torch.cuda.synchronize, rounds=rounds)
        row = f'| {RECOMPUTE_OP} | {T} | {H} | {L} | {agree} | {ours_us:.1f} | {peer_us:.1f} | {ratio:.2f} |'
        print(row, flush=True)


if __name__ == '__main__':
    main()
