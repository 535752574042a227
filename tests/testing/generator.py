"""Test levels and the parameter sets each level runs.

Level 0 is the small core set (seconds), level 1 the default set, level 2 the full grid with
boundary and maximum shapes, the benchmark shapes among them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence

# The variable, the levels and their check are the pipeline's: cann_ops_pipeline.conventions.
from cann_ops_pipeline.conventions import check_test_level, test_level_from_env


def get_test_level() -> int:
    """The level from OPS_TILELANG_TEST_LEVEL (0, 1 or 2; 1 when unset); anything else is a ValueError."""
    return test_level_from_env()


def by_level(level: int, core: Sequence, default: Sequence = (), full: Sequence = ()) -> list:
    """Values of level 0, plus those of level 1, plus those of level 2, in order, no duplicates (values may
    be unhashable, e.g. the parameter dicts of a test's fixed shapes)."""
    check_test_level(level)
    chosen = list(core) + (list(default) if level >= 1 else []) + (list(full) if level >= 2 else [])
    return [value for i, value in enumerate(chosen) if value not in chosen[:i]]


def skip_off_ascend_below(level: int, needed: int, device) -> None:
    """Skip a test of the Ascend kernel's configuration classes on other backends below level `needed`.

    Such a test exists for the Ascend tilings (run on the NPU or the emulator at every level); on CUDA it only
    adds shapes, each one more kernel to compile, which a cold level-0 run pays for.
    """
    if device.type == 'cuda' and level < needed:
        import pytest

        pytest.skip(f'the Ascend configuration classes run on CUDA from test level {needed} (level {level} here)')


def skip_device_stand_in_at_level_0(what: str) -> None:
    """Skip a test of what stands in for a device on hosts without one (the kernels' lowering, the Ascend C
    emulator's own tests) where level 0 runs on a host with an accelerator: its device tests compile and run the
    kernels there. Hosts without one run these at every level (CI at level 1)."""
    from tests.testing.plugins.devices import real_accelerator

    if get_test_level() == 0 and real_accelerator():
        import pytest

        pytest.skip(f'level 0 on an accelerator host: its device tests stand for the {what} (from level 1 here)')


def gen_num_tokens(level: int) -> list[int]:
    """Token counts: empty, minimum, a core size, tails that divide no block, the benchmark sizes."""
    return by_level(level, core=(0, 1, 130), default=(7, 257, 1000), full=(4001, 8001, 32768))


def gen_hidden(level: int) -> list[int]:
    """Hidden sizes (multiples of 64 up to 16384): minimum, core, the production (benchmark) sizes, tails."""
    return by_level(level, core=(64, 4096), default=(192, 1088, 2560, 5120, 7168), full=(128, 16384))


def gen_hc(level: int) -> list[int]:
    """Hyper-connection branch counts 1..8."""
    return by_level(level, core=(4,), default=(1, 3), full=(2, 5, 8))


BENCHMARK_NUM_TOKENS = (4001, 8001, 32768)
BENCHMARK_HIDDEN = (4096, 7168, 2560, 5120)  # production sizes (DeepSeek-V3/V4 class models, Engram-27B)
BENCHMARK_HC = 4


def gen_benchmark_shapes() -> list[dict]:
    """The Engram benchmark grid of docs/engram.md: T x hidden, hc = 4."""
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
            values[name] = list(axis(check_test_level(level)))
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
