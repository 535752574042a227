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
            if result.exited not in step.success_codes:
                raise Exit(code=result.exited or 1)


def _args(pytest_args: str) -> list[str]:
    return shlex.split(pytest_args)


def _described(session: str, **fields):
    """Gives the task the session's description (cann_ops_pipeline.phases.DESCRIPTIONS) as its docstring."""

    def decorate(function):
        function.__doc__ = phases.describe(session, **fields)
        return function

    return decorate


def _pytest_task(phase, example: str = ''):
    """A task `<phase name>(c, pytest_args='')` that runs the phase with the extra pytest arguments."""

    def run(c, pytest_args=''):
        _run(c, phase(_args(pytest_args)))

    run.__name__ = run.__qualname__ = phase.__name__
    run = _described(phase.__name__.replace('_', '-'))(run)
    return task(help={'pytest_args': f'extra pytest arguments{example}'})(run)


tests_cpu = _pytest_task(phases.tests_cpu)


@task
@_described('lint')
def lint(c):
    _run(c, phases.lint())


@task(help={'level': 'test level 0, 1 or 2', 'pytest_args': 'extra pytest arguments'})
@_described('verify', level='N (--level)')
def verify(c, level=str(DEFAULT_TEST_LEVEL), pytest_args=''):  # a str: invoke's int cast would raise
    try:
        level = parse_test_level(level)
    except ValueError as error:
        raise Exit(f'verify: --level {error}', code=USAGE_ERROR) from None
    _run(c, phases.verify(level, _args(pytest_args)))


@task(help={'args': 'arguments for the two-phase runner (see python -m cann_ops_pipeline.two_phase -h)'})
@_described('run-tests')
def run_tests(c, args=''):
    _run(c, phases.run_tests(_args(args)))


refresh_mem = _pytest_task(phases.refresh_mem)
refresh_baseline = _pytest_task(phases.refresh_baseline, ', e.g. "-K \'hidden=4096\'"')
verify_baseline = _pytest_task(phases.verify_baseline)


@task(help={'outdir': 'where sdist and wheel go (default dist; a relative folder is taken from the repository root)'})
@_described('build-wheel')
def build_wheel(c, outdir='dist'):
    _run(c, phases.build_wheel(outdir))
