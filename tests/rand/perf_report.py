"""randn on one GPU against torch.randn (TileKernels 2.1.0's randn is torch.randn there) in one process: device
times (do_bench medians under its L2 flush, rounds alternating between the calls) and the copy that moves as many
bytes as the draw writes.

    python -m tests.rand.perf_report [--rounds 5]
"""

from __future__ import annotations

import argparse
import math

import torch

from cann_ops_tilelang.rand import randn
from tests.testing.device_timing import print_comparison

SHAPES = [(4001, 4096), (8001, 7168), (32768, 4096), (1 << 28,), (1000,)]
DTYPES = (torch.float32, torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--quick', action='store_true', help='two shapes only')
    args = parser.parse_args()
    device = torch.device('cuda')

    def calls(case):
        shape, dtype = case
        randn(shape, dtype=dtype, device=device)  # compile outside the timing
        moved = math.prod(shape) * dtype.itemsize
        ours = lambda: randn(shape, dtype=dtype, device=device)
        return ours, lambda: torch.randn(shape, dtype=dtype, device=device), moved, None

    print_comparison(
        [(shape, dtype) for shape in (SHAPES[::2] if args.quick else SHAPES) for dtype in DTYPES],
        calls,
        columns='shape | dtype',
        cells=lambda case: f'{case[0]} | {str(case[1])[6:]}',
        rounds=args.rounds,
        device=device,
    )


if __name__ == '__main__':
    main()
