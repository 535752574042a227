"""Names and defaults that the pipeline (nox, invoke, the two-phase runner) and the pytest plugins share.

Each is defined once, here; `cann_ops_pipeline.phases`, `cann_ops_pipeline.two_phase` and the plugins
in `tests/testing/plugins/` import them. Pure standard library, so the noxfile can import it before
any virtual environment exists.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Test levels: the parameter sets a run collects (tests/testing/generator.py).
LEVEL_ENV = 'OPS_TILELANG_TEST_LEVEL'
TEST_LEVELS = (0, 1, 2)
DEFAULT_TEST_LEVEL = 1

# The project's pytest markers, each declared here only: name and description. The plugin that acts on a
# marker registers it from here (tests/testing/plugins/: devices, benchmark, npu_mem), so `pytest --markers`
# and --strict-markers know each one in these words; pyproject.toml declares none.
NPU_MARKER = 'npu'
CUDA_ONLY_MARKER = 'cuda_only'
BENCHMARK_MARKER = 'benchmark'
LARGE_MARKER = 'large_npu_mem'  # the memory-aware run: the npu_mem plugin marks, the two-phase runner splits on it
MARKERS = {
    NPU_MARKER: 'needs an accelerator (Ascend NPU or CUDA GPU); without one skipped with the reason, or run on '
    'the Ascend C emulator with --ascend-emulator',
    CUDA_ONLY_MARKER: 'device test of a CUDA-only kernel variant; skipped on Ascend and on the emulator',
    BENCHMARK_MARKER: 'performance measurement against the committed baselines; skipped unless --run-benchmark',
    LARGE_MARKER: 'peak device memory above --npu-mem-threshold, or not profiled yet; runs in the two-phase '
    "run's phase 2",
}

NPU_MEM_THRESHOLD_OPTION = '--npu-mem-threshold'
DEFAULT_NPU_MEM_THRESHOLD_MB = 15000.0

# Baseline verification (the benchmark plugin's defaults, passed explicitly by the verify phases).
DEFAULT_REGRESSION_THRESHOLD = 0.10
DEFAULT_MIN_DELTA_US = 1.0

# Device sessions (refresh-mem, refresh-baseline, verify-baseline, run-tests) fail without a device
# unless this is 1: then they run, and their device tests skip.
ALLOW_NO_DEVICE_ENV = 'OPS_TILELANG_ALLOW_NO_DEVICE'

# One exit code for usage errors everywhere: pytest's (pytest.ExitCode.USAGE_ERROR).
USAGE_ERROR = 4
NO_TESTS_COLLECTED = 5  # pytest.ExitCode.NO_TESTS_COLLECTED

# Device tests on the Ascend C emulator where there is no device (tests/testing/plugins/devices.py):
# the pytest option, and the level the CPU tier runs them at (its time budget; verify-N uses N).
ASCEND_EMULATOR_OPTION = '--ascend-emulator'
EMULATED_CPU_TIER_LEVEL = 0


def marker_line(name: str) -> str:
    """The `markers` ini line that registers marker `name` (config.addinivalue_line('markers', ...))."""
    return f'{name}: {MARKERS[name]}'


def check_test_level(level: int) -> int:
    """`level` if it is one of TEST_LEVELS (an int, not a bool), else ValueError."""
    if isinstance(level, bool) or level not in TEST_LEVELS:
        raise ValueError(f'test level must be one of {TEST_LEVELS}, got {level!r}')
    return level


def parse_test_level(text: str | int) -> int:
    """A level given as text ('0', ' 2 ') or int; ValueError naming the accepted values."""
    try:
        level = int(text.strip()) if isinstance(text, str) else text
    except ValueError:
        level = None
    if isinstance(level, bool) or level not in TEST_LEVELS:
        raise ValueError(f'{text!r} is not a test level: use 0 (core), 1 (default) or 2 (full)')
    return level


def test_level_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The level from OPS_TILELANG_TEST_LEVEL (DEFAULT_TEST_LEVEL when unset or blank)."""
    raw = (os.environ if environ is None else environ).get(LEVEL_ENV)
    if raw is None or raw.strip() == '':
        return DEFAULT_TEST_LEVEL
    try:
        return parse_test_level(raw)
    except ValueError:
        raise ValueError(f'{LEVEL_ENV}={raw!r} is not a test level: use 0 (core), 1 (default) or 2 (full)') from None


def markexpr_problem(markexpr: str, option: str = '-m') -> str | None:
    """What is wrong with a `-m` expression (or a `-k` one: `option`, the same grammar), in pytest's words, or
    None (also None without pytest).

    pytest's parser judges; its exception differs by version (SyntaxError with offset/msg from 9.0,
    ParseError with column/message before), so both are read.
    """
    try:
        from _pytest.mark.expression import Expression
    except ImportError:  # no pytest in this interpreter: pytest will not run here either
        return None
    try:
        Expression.compile(markexpr)
    except Exception as exc:
        column = getattr(exc, 'offset', None) or getattr(exc, 'column', '?')
        message = getattr(exc, 'msg', None) or getattr(exc, 'message', None) or str(exc)
        return f"Wrong expression passed to '{option}': {markexpr}: at column {column}: {message}"
    return None
