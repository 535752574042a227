"""What each pipeline phase runs, as data: nox sessions and invoke tasks execute these steps.

A phase is a list of `Step`s (argv + extra environment). The noxfile runs them with
`session.run`, the invoke tasks with `Context.run`; neither spells a command itself, so the two
front ends cannot drift apart. What each session does, in words, is `DESCRIPTIONS` below: the
docstring of the nox session and of the invoke task alike. Phases hand state to each other only
through files: the device memory profiles (`tests/*/npu_mem_profiles/`) and the baselines
(`tests/*/benchmark/`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cann_ops_pipeline.bytecode_cache import bytecode_env
from cann_ops_pipeline.conventions import (
    ASCEND_EMULATOR_OPTION,
    DEFAULT_MIN_DELTA_US,
    DEFAULT_REGRESSION_THRESHOLD,
    EMULATED_CPU_TIER_LEVEL,
    LEVEL_ENV,
    NO_TESTS_COLLECTED,
    check_test_level,
)
from cann_ops_pipeline.device_count import count_devices

ROOT = Path(__file__).resolve().parents[2]

# Marker expressions of the phases.
CPU_TIER = 'not npu and not benchmark'
CORRECTNESS = 'not benchmark'
DEVICE_CORRECTNESS = 'npu and not benchmark'
BENCHMARKS = 'benchmark'
SLOWEST_SHOWN = 10  # verify runs list their slowest tests (pytest --durations)

# What each session does: the one wording of the nox session's and the invoke task's docstring (`nox -l` and
# `invoke --list` show it). `verify` is one nox session per level (verify-0, ...) and one invoke task with
# --level; its text takes the level. One line each, since both listings show a docstring's first line.
DESCRIPTIONS = {
    'lint': 'ruff lint and format check.',
    'tests-cpu': 'Everything runnable without an accelerator; the device tests at level 0 on the Ascend C emulator.',
    'verify': 'Correctness at test level {level}: the CPU tier plus the device tests (emulated without a device).',
    'run-tests': 'Two-phase xdist run: ordinary-memory tests wide, large_npu_mem tests narrow (needs a device).',
    'refresh-mem': 'Measure the peak device memory of device tests and rewrite their profiles (needs a device).',
    'refresh-baseline': "Refresh this device's benchmark baselines, then verify them at once (needs a device).",
    'verify-baseline': 'Compare benchmark results with the committed baselines (needs a device).',
    'build-wheel': 'Build sdist and wheel; install the wheel (torch pinned) in a fresh venv and import it there.',
}


def describe(session: str, level: int | str = 'N') -> str:
    """The description of `session` ('verify' with its `level`)."""
    return DESCRIPTIONS[session].format(level=level)


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of a phase: argv[0] is looked up on PATH ('python' is the phase's interpreter)."""

    argv: tuple[str, ...]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    description: str = ''
    success_codes: tuple[int, ...] = (0,)  # exit codes that do not fail the phase
    # Standard library only: runs in any Python, so a front end may run it before it installs anything.
    needs_nothing_installed: bool = False

    def resolved_argv(self, python: str = sys.executable) -> list[str]:
        """argv with 'python' replaced by a concrete interpreter (for front ends without a venv)."""
        return [python if arg == 'python' else arg for arg in self.argv]


def _pytest(
    *args: str, env: dict[str, str] | None = None, description: str = '', success_codes: tuple[int, ...] = (0,)
) -> Step:
    return Step(('python', '-m', 'pytest', *args), {**bytecode_env(), **(env or {})}, description, success_codes)


def _pipeline_env() -> dict[str, str]:
    """Environment for steps that run `python -m cann_ops_pipeline...` (not installed in venvs)."""
    packages = str(ROOT / 'packages')
    existing = os.environ.get('PYTHONPATH')
    return {'PYTHONPATH': packages if not existing else f'{packages}{os.pathsep}{existing}'}


def lint() -> list[Step]:
    return [
        Step(('ruff', 'check', '.'), description='ruff lint'),
        Step(('ruff', 'format', '--check', '.'), description='ruff format check'),
    ]


def tests_cpu(args: Sequence[str] = ()) -> list[Step]:
    """Contract and tooling tests and kernel lowering at the default level, then the device tests."""
    # Lowering and emulation are CPU-bound and independent per test: one xdist worker per core.
    return [
        _pytest('-m', CPU_TIER, '-n', 'auto', *args, description='CPU tier'),
        _pytest(
            '-m', DEVICE_CORRECTNESS, ASCEND_EMULATOR_OPTION, '-n', 'auto', *_junit_renamed(args, 'emulated'),
            env={LEVEL_ENV: str(EMULATED_CPU_TIER_LEVEL)},
            description=f'device tests, level {EMULATED_CPU_TIER_LEVEL}, Ascend C emulated on CPU',
            success_codes=(0, NO_TESTS_COLLECTED),  # a selection without device tests (e.g. tests/pipeline)
        ),
    ]  # fmt: skip


def _junit_renamed(args: Sequence[str], suffix: str) -> list[str]:
    """`args` with a --junitxml report renamed `<stem>-<suffix><ext>`, so that a second run of the same
    arguments does not overwrite the first one's report."""

    def renamed(path: str) -> str:
        path = Path(path)
        return str(path.with_name(f'{path.stem}-{suffix}{path.suffix}'))

    result = []
    for i, arg in enumerate(args):
        if arg.startswith('--junitxml='):
            arg = f'--junitxml={renamed(arg.split("=", 1)[1])}'
        elif i > 0 and args[i - 1] == '--junitxml':
            arg = renamed(arg)
        result.append(arg)
    return result


def _host_device_count() -> int:
    """Devices of this host (vendor tools, never torch); an invalid override counts as a device, so that
    the two-phase runner, which the device path takes, reports it."""
    try:
        return count_devices().count
    except ValueError:
        return 1


def require_device(session: str) -> Step:
    """The first step of a session whose point is a device: fails without one (see require_device.py)."""
    return Step(
        ('python', '-m', 'cann_ops_pipeline.require_device', session),
        _pipeline_env(),
        'check for an accelerator',
        needs_nothing_installed=True,
    )


def _two_phase(args: Sequence[str], env: dict[str, str] | None = None, description: str = 'two-phase xdist run'):
    env = {**_pipeline_env(), **bytecode_env(), **(env or {})}
    return Step(('python', '-m', 'cann_ops_pipeline.two_phase', *args), env, description)


def verify(level: int, args: Sequence[str] = (), device_count: int | None = None) -> list[Step]:
    """With a device (`device_count`, counted here when None) through the memory-aware two-phase runner;
    without one in one pytest run with a worker per core (the CPU tier is CPU-bound lowering).
    """
    env = {LEVEL_ENV: str(check_test_level(level))}
    description = f'correctness, level {level}'
    timing = [f'--durations={SLOWEST_SHOWN}']  # the long poles of the run, for whoever tunes its wall time
    if (_host_device_count() if device_count is None else device_count) > 0:
        return [_two_phase(['-m', CORRECTNESS, *timing, *args], env, f'{description}, two-phase run')]
    emulated = f'{description}, device tests Ascend C emulated on CPU'
    argv = ('-m', CORRECTNESS, ASCEND_EMULATOR_OPTION, '-n', 'auto', *timing, *args)
    return [_pytest(*argv, env=env, description=emulated)]


def run_tests(args: Sequence[str] = ()) -> list[Step]:
    """See cann_ops_pipeline.two_phase."""
    return [require_device('run-tests'), _two_phase(args)]


def refresh_mem(args: Sequence[str] = ()) -> list[Step]:
    return [
        require_device('refresh-mem'),
        _pytest('-m', DEVICE_CORRECTNESS, '--refresh-mem', *args, description='refresh memory profiles'),
    ]


def _verify_baseline(args: Sequence[str]) -> Step:
    return _pytest(
            '-m', BENCHMARKS, '--run-benchmark',
            f'--benchmark-regression-threshold={DEFAULT_REGRESSION_THRESHOLD}',
            f'--benchmark-min-delta-us={DEFAULT_MIN_DELTA_US}',
            *args, description='verify baselines',
        )  # fmt: skip


def verify_baseline(args: Sequence[str] = ()) -> list[Step]:
    return [require_device('verify-baseline'), _verify_baseline(args)]


def refresh_baseline(args: Sequence[str] = ()) -> list[Step]:
    """The verification after the refresh checks that every record was hit."""
    refresh = _pytest('-m', BENCHMARKS, '--run-benchmark', '--refresh-baseline', *args, description='refresh')
    return [require_device('refresh-baseline'), refresh, _verify_baseline(args)]


def build_wheel(outdir: str | os.PathLike = 'dist', pins: Sequence[str] = ()) -> list[Step]:
    """`outdir`: where sdist and wheel go; a relative one is taken from the repository root, where the steps
    run (the wheel check installs from a folder of its own, so it gets the folder as an absolute path).

    `pins`: requirements installed with the wheel (e.g. the torch pin); none: the running interpreter's
    torch and tilelang versions (see cann_ops_pipeline.wheel_check).
    """
    outdir = ROOT / outdir  # an absolute outdir stays as it is
    return [
        Step(('python', '-m', 'build', '--outdir', str(outdir), '.'), description='build sdist and wheel'),
        Step(
            ('python', '-m', 'cann_ops_pipeline.wheel_check', str(outdir), *(f'--pin={pin}' for pin in pins)),
            _pipeline_env(),
            'install the wheel in a fresh venv and import it',
        ),
    ]
