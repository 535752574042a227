"""per_token_cast against TileKernels 2.1.0 on one GPU, in one process: whether data and scale bytes are equal,
and the time of each (CUDA events around one call, medians of rounds under a 256 MiB L2 flush; two alternating
passes, the better of each kept) with our bandwidth.

    PYTHONPATH=<tile_kernels 2.1.0> python -m tests.quant.perf_report [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from cann_ops_tilelang.quant import per_token_cast

_FORMATS = {'fp32': (False, False), 'ue8m0': (True, True)}
CASES = [
    (torch.bfloat16, shape, variant)
    for shape in ((4001, 7168), (8001, 7168), (8001, 4096), (1, 7168))
    for variant in ((128, 'fp32'), (32, 'ue8m0'))
] + [(torch.float32, (4001, 7168), (128, 'fp32'))]


def _timed(fn, flush: torch.Tensor, rounds: int) -> float:
    """Median us of `fn` between two CUDA events, each round after an L2 flush."""
    times = []
    for _ in range(rounds):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=30)
    rounds = parser.parse_args().rounds
    from tile_kernels.quant import per_token_cast as peer_cast  # the peer, where it is installed

    device = torch.device('cuda')
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    print('| T | H | dtype | block | sf | equal data / sf | ours us | TK us | ours / TK | ours GB/s |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |')
    for dtype, (num_tokens, hidden), (block, sf) in CASES:
        round_sf, packed = _FORMATS[sf]
        torch.manual_seed(0)
        scale = torch.exp2(torch.randint(-8, 8, (num_tokens, 1)).float())
        x = (torch.randn(num_tokens, hidden) * scale).to(dtype).to(device)
        kwargs = {'round_sf': round_sf, 'use_packed_ue8m0': packed}
        data, scales = per_token_cast(x, 'e4m3', block, **kwargs)

        def ours(data=data, scales=scales, x=x, block=block, kwargs=kwargs):
            per_token_cast(x, 'e4m3', block, **kwargs, out=(data, scales))

        def peer(x=x, block=block, kwargs=kwargs):
            return peer_cast(x, 'e4m3', block, **kwargs)

        peer_data, peer_scales = peer()
        same_data = torch.equal(data.view(torch.uint8), peer_data.view(torch.uint8))
        same_sf = scales.shape == peer_scales.shape and torch.equal(
            scales.view(torch.uint8), peer_scales.view(torch.uint8)
        )
        mine = min(_timed(ours, flush, rounds), _timed(ours, flush, rounds))
        theirs = min(_timed(peer, flush, rounds), _timed(peer, flush, rounds))
        nbytes = x.nbytes + data.nbytes + scales.nbytes
        print(
            f'| {num_tokens} | {hidden} | {str(dtype)[6:]} | {block} | {sf} | {same_data} / {same_sf} | {mine:.1f} | '
            f'{theirs:.1f} | {mine / theirs:.2f} | {nbytes / mine / 1e3:.0f} |'
        )


if __name__ == '__main__':
    main()
