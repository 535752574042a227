"""apply_rotary against TileKernels 2.1.0 on one GPU, in one process: whether one call of each rotates alike, the
device times (do_bench medians under its L2 flush, rounds alternating between ours and the peer's call) and the
copy that moves the same bytes (query and key read and written, a cache row and a position per token).

    PYTHONPATH=<tile_kernels 2.1.0> python -m tests.transform.perf_report [--rounds 5]

Rows: Llama-style heads (32 query, 8 key heads of 128, full rotary) and DeepSeek MLA's (128 query heads of 192
whose last 64 rotate, one key head of 64), NeoX and GPT-J pairing; the peer takes rotary dims 64 and 128 only.
"""

from __future__ import annotations

import argparse

import torch

from cann_ops_tilelang.transform import apply_rotary
from tests.testing.device_timing import agreement, print_comparison
from tests.transform.apply_rotary_ref import make_cos_sin_cache

MODELS = {'llama': ((32, 8), 128, 128), 'mla': ((128, 1), 192, 64)}  # (query, key heads), head dim, rotary dim
TOKENS = (4001, 8192, 32768)
CACHE_ROWS = 8192


def _inputs(model: str, num_tokens: int, device):
    (q_heads, k_heads), head_dim, rot_dim = MODELS[model]
    torch.manual_seed(0)
    q = torch.randn(num_tokens, q_heads, head_dim, device=device).to(torch.bfloat16)[..., head_dim - rot_dim :]
    k = torch.randn(num_tokens, k_heads, rot_dim, device=device).to(torch.bfloat16)
    cache = make_cos_sin_cache(CACHE_ROWS, rot_dim).to(device)
    positions = torch.randint(0, CACHE_ROWS, (num_tokens,), device=device)
    return q, k, cache, positions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--tokens', nargs='+', type=int, default=list(TOKENS))
    args = parser.parse_args()
    from tile_kernels.transform import apply_rotary as peer_apply_rotary  # the peer, where it is installed

    device = torch.device('cuda')

    def calls(case):
        model, num_tokens, interleaved = case
        q, k, cache, positions = _inputs(model, num_tokens, device)
        q2, k2 = q.clone(), k.clone()  # the peer's copies: both rotate in place
        apply_rotary(q, cache, k, positions, interleaved)
        peer_apply_rotary(q2, cache, k2, positions, interleaved)
        agree = agreement((q, k), (q2, k2), rtol=1e-2, atol=1e-2)  # bf16 results of fp32 math
        moved = 2 * (q.numel() + k.numel()) * q.element_size() + num_tokens * (cache.shape[1] * 4 + 8)
        return (
            lambda: apply_rotary(q, cache, k, positions, interleaved),
            lambda: peer_apply_rotary(q2, cache, k2, positions, interleaved),
            moved,
            agree,
        )

    print_comparison(
        [(m, t, i) for m in MODELS for t in args.tokens for i in (False, True)],
        calls,
        columns='heads | T | pairing',
        cells=lambda case: f'{case[0]} | {case[1]} | {"GPT-J" if case[2] else "NeoX"}',
        rounds=args.rounds,
        device=device,
    )


if __name__ == '__main__':
    main()
