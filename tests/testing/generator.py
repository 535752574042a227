"""Test levels and the parameter sets each level runs.

Level 0 is the small core set (seconds), level 1 the default set, level 2 the full grid with
boundary and maximum shapes, the benchmark shapes among them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence

LEVEL_ENV = 'OPS_TILELANG_TEST_LEVEL'
DEFAULT_LEVEL = 1
LEVELS = (0, 1, 2)


def get_test_level() -> int:
    """The level from OPS_TILELANG_TEST_LEVEL (0, 1 or 2; 1 when unset)."""
    raw = os.environ.get(LEVEL_ENV)
    if raw is None or raw.strip() == '':
        return DEFAULT_LEVEL
    try:
        level = int(raw.strip())
    except ValueError:
        level = None
    if level not in LEVELS:
        raise ValueError(f'{LEVEL_ENV}={raw!r} is not a test level: use 0 (core), 1 (default) or 2 (full)')
    return level


def _check_level(level: int) -> int:
    if isinstance(level, bool) or level not in LEVELS:
        raise ValueError(f'test level must be 0, 1 or 2, got {level!r}')
    return level


def _by_level(level: int, core: Sequence, default: Sequence = (), full: Sequence = ()) -> list:
    """Values of level 0, plus those of level 1, plus those of level 2, in order, no duplicates."""
    _check_level(level)
    chosen = list(core) + (list(default) if level >= 1 else []) + (list(full) if level >= 2 else [])
    return list(dict.fromkeys(chosen))


def gen_num_tokens(level: int) -> list[int]:
    """Token counts: empty, minimum, a core size, tails that divide no block, the benchmark sizes."""
    return _by_level(level, core=(0, 1, 130), default=(7, 257, 1000), full=(4001, 8001, 32768))


def gen_hidden(level: int) -> list[int]:
    """Hidden sizes (multiples of 64 up to 16384): minimum, core, benchmark, tails of common tiles."""
    return _by_level(level, core=(64, 4096), default=(192, 1088, 7168), full=(128, 2560, 5120, 16384))


def gen_hc(level: int) -> list[int]:
    """Hyper-connection branch counts 1..8."""
    return _by_level(level, core=(4,), default=(1, 3), full=(2, 5, 8))


BENCHMARK_NUM_TOKENS = (4001, 8001, 32768)
BENCHMARK_HIDDEN = (4096, 7168)
BENCHMARK_HC = 4


def gen_benchmark_shapes() -> list[dict]:
    """The Engram benchmark grid of shared/docs/engram.md: T x hidden, hc = 4."""
    return generate_samples(num_tokens=BENCHMARK_NUM_TOKENS, hidden=BENCHMARK_HIDDEN, hc=[BENCHMARK_HC])


def generate_samples(
    level: int | None = None,
    *,
    where: Callable[[dict], bool] | None = None,
    **axes: Sequence | Callable[[int], Iterable],
) -> list[dict]:
    """Cartesian product of the axes as a list of dicts, in axis order.

    An axis is a sequence of values or a generator taking the level (e.g. `gen_hidden`); generator
    axes need `level`. `where` keeps only the samples it accepts.
    """
    values: dict[str, list] = {}
    for name, axis in axes.items():
        if callable(axis):
            if level is None:
                raise ValueError(f'axis {name!r} is a level generator: pass level=')
            values[name] = list(axis(_check_level(level)))
        else:
            values[name] = list(axis)
    samples = [dict(zip(values, combo, strict=True)) for combo in itertools.product(*values.values())]
    return [s for s in samples if where is None or where(s)]


def merge_samples(*groups: Iterable[Mapping]) -> list[dict]:
    """Concatenate sample lists, dropping exact duplicates (first occurrence wins)."""
    seen, merged = set(), []
    for group in groups:
        for sample in group:
            key = tuple(sample.items())
            if key not in seen:
                seen.add(key)
                merged.append(dict(sample))
    return merged
