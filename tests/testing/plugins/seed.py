"""--seed: every test gets a stable seed derived from the base seed and its node ID.

The same node ID gets the same random inputs whichever worker runs it and in whatever order,
so a failure reproduces with `pytest <node id> --seed N`.
"""

from __future__ import annotations

import random
import zlib

import pytest
import torch

DEFAULT_SEED = 0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup('cann_ops_tilelang').addoption(
        '--seed',
        type=int,
        default=DEFAULT_SEED,
        metavar='N',
        help=f'base random seed; each test is seeded from it and its node ID (default {DEFAULT_SEED})',
    )


def seed_for(base_seed: int, nodeid: str) -> int:
    """A 32-bit seed that depends only on the base seed and the node ID."""
    return zlib.crc32(f'{base_seed}:{nodeid}'.encode())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # seeds every device's generator too, lazily
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    seed_everything(seed_for(item.config.getoption('seed'), item.nodeid))
