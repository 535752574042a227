"""The pipeline phases as invoke tasks, run in the current environment (no virtualenvs).

Same steps as the nox sessions of the same names (cann_ops_pipeline.phases); extra pytest
arguments go in `--pytest-args`, e.g. `invoke verify --level 0 --pytest-args "-x tests/engram"`.
"""

from __future__ import annotations

import shlex
import sys

from invoke import Context, Exit, task

from cann_ops_pipeline import phases
from cann_ops_pipeline.conventions import DEFAULT_TEST_LEVEL, USAGE_ERROR, parse_test_level


def _run(c: Context, steps: list[phases.Step]) -> None:
    """Run the steps in order; the first failing one ends the task with its exit code (its output said why)."""
    with c.cd(str(phases.ROOT)):
        for step in steps:
            print(f'--- {step.description}', flush=True)
            result = c.run(shlex.join(step.resolved_argv(sys.executable)), env=step.env, pty=False, warn=True)
            if result.failed:
                raise Exit(code=result.exited or 1)


def _args(pytest_args: str) -> list[str]:
    return shlex.split(pytest_args)


@task
def lint(c):
    """ruff lint and format check."""
    _run(c, phases.lint())


@task(help={'pytest_args': 'extra pytest arguments'})
def tests_cpu(c, pytest_args=''):
    """Everything runnable without an accelerator."""
    _run(c, phases.tests_cpu(_args(pytest_args)))


@task(help={'level': 'test level 0, 1 or 2', 'pytest_args': 'extra pytest arguments'})
def verify(c, level=str(DEFAULT_TEST_LEVEL), pytest_args=''):  # a str: invoke's int cast would raise
    """Correctness at a test level: CPU tier plus device tests where a device exists."""
    try:
        level = parse_test_level(level)
    except ValueError as error:
        raise Exit(f'verify: --level {error}', code=USAGE_ERROR) from None
    _run(c, phases.verify(level, _args(pytest_args)))


@task(help={'args': 'arguments for the two-phase runner (see python -m cann_ops_pipeline.two_phase -h)'})
def run_tests(c, args=''):
    """Two-phase xdist run."""
    _run(c, phases.run_tests(_args(args)))


@task(help={'pytest_args': 'extra pytest arguments'})
def refresh_mem(c, pytest_args=''):
    """Measure peak device memory of device tests and rewrite their profiles."""
    _run(c, phases.refresh_mem(_args(pytest_args)))


@task(help={'pytest_args': 'extra pytest arguments, e.g. "-K \'hidden=4096\'"'})
def refresh_baseline(c, pytest_args=''):
    """Refresh this device's benchmark baselines, then verify them."""
    _run(c, phases.refresh_baseline(_args(pytest_args)))


@task(help={'pytest_args': 'extra pytest arguments'})
def verify_baseline(c, pytest_args=''):
    """Compare benchmark results with the committed baselines."""
    _run(c, phases.verify_baseline(_args(pytest_args)))


@task(help={'outdir': 'where sdist and wheel go'})
def build_wheel(c, outdir='dist'):
    """Build sdist and wheel; install the wheel in a fresh venv and import it."""
    _run(c, phases.build_wheel(outdir))
