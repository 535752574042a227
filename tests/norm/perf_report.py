"""The norm operators against TileKernels 2.1.0 on one GPU, in one process: whether the results agree, the device
times (do_bench medians under its L2 flush, rounds alternating between ours and the peer's call) and the copy that
moves the same bytes.

    PYTHONPATH=<tile_kernels 2.1.0> python -m tests.norm.perf_report [--rounds 5] [--hidden 4096 7168 ...]

Rows: bf16 x with a weight, with and without a residual, at T = 4001, 8001, 32768 and the hidden sizes given
(default the peer's 4096, 7168 and ours beyond its CUDA limit, 12288 and 16384, where the peer has no row).
norm_forward_and_per_token_cast: e4m3 with 32-channel fp32 scales (the only block the peer takes); norm_backward:
with the weight gradient.
"""

from __future__ import annotations

import argparse

import torch

from cann_ops_tilelang.norm import norm_backward, norm_forward, norm_forward_and_per_token_cast
from tests.testing.device_timing import agreement, print_comparison

EPS = 1e-6
TOKENS = (4001, 8001, 32768)
HIDDEN = (4096, 7168, 12288, 16384)
OPS = ('norm_forward', 'norm_forward_and_per_token_cast', 'norm_backward')


def _bytes(*tensors) -> int:
    """Bytes of the distinct tensors (without a residual, norm_forward's third result is x itself)."""
    unique = {t.data_ptr(): t for t in tensors if isinstance(t, torch.Tensor)}
    return sum(t.nbytes for t in unique.values())


def _calls(tk, op: str, num_tokens: int, hidden: int, residual: bool, device):
    torch.manual_seed(0)
    x = torch.randn(num_tokens, hidden, device=device).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(hidden, device=device)).to(torch.bfloat16)
    res = torch.randn_like(x) if residual else None
    if op == 'norm_forward':
        result = norm_forward(x, weight, EPS, res, with_rstd=True)
        ours = lambda: norm_forward(x, weight, EPS, res, with_rstd=True)
        peer = (lambda: tk.norm_forward(x, weight, EPS, res, with_rstd=True)) if hidden <= 8192 else None
        moved = _bytes(x, weight, res, *result)
    elif op == 'norm_forward_and_per_token_cast':
        result = norm_forward_and_per_token_cast(x, weight, EPS, 'e4m3', 32, res)
        ours = lambda: norm_forward_and_per_token_cast(x, weight, EPS, 'e4m3', 32, res)
        peer = (lambda: tk.norm_forward_and_per_token_cast(x, weight, EPS, 'e4m3', 32, res)) if hidden <= 8192 else None
        moved = _bytes(x, weight, res, *(t for r in result for t in (r if isinstance(r, tuple) else (r,))))
    else:
        grad = torch.randn_like(x)
        rstd = torch.rand(num_tokens, device=device) + 0.5
        wgrad = torch.zeros(hidden, device=device)
        wgrad_peer = torch.zeros(hidden, device=device)
        result = norm_backward(grad, x, weight, rstd, res, 1.0, wgrad)
        ours = lambda: norm_backward(grad, x, weight, rstd, res, 1.0, wgrad)
        peer = (lambda: tk.norm_backward(grad, x, weight, rstd, res, 1.0, wgrad_peer)) if hidden <= 8192 else None
        moved = _bytes(grad, x, weight, rstd, res, result[0], wgrad)
    agree = agreement(tuple(_flat(result)), tuple(_flat(peer())), rtol=2e-2, atol=2e-2) if peer else None
    return ours, peer, moved, agree


def _flat(result):
    for r in result:
        if isinstance(r, tuple):
            yield from _flat(r)
        elif isinstance(r, torch.Tensor):
            yield r.float() if r.dtype == torch.float8_e4m3fn else r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--hidden', nargs='+', type=int, default=list(HIDDEN))
    parser.add_argument('--tokens', nargs='+', type=int, default=list(TOKENS))
    parser.add_argument('--ops', default=','.join(OPS), help='comma-separated operator names')
    parser.add_argument('--no-residual-rows', dest='residual', action='store_false', help='rows without residual only')
    args = parser.parse_args()
    import tile_kernels.quant as tk  # the peer, where it is installed (its norm kernels are in its quant domain)

    device = torch.device('cuda')
    residuals = (False, True) if args.residual else (False,)
    cases = [(op, t, h, r) for op in args.ops.split(',') for h in args.hidden for t in args.tokens for r in residuals]
    print_comparison(
        cases,
        lambda case: _calls(tk, *case, device),
        columns='operator | T | H | residual',
        cells=lambda case: ' | '.join(str(v) for v in case),
        rounds=args.rounds,
        device=device,
    )


if __name__ == '__main__':
    main()
