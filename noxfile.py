"""Pipeline sessions. Each is a few lines: what it runs lives in cann_ops_pipeline.phases.

    nox                       # lint + tests-cpu (the default sessions)
    nox -s verify-0           # correctness at level 0 (CPU tier + device tests if a device exists)
    nox -s refresh-baseline   # refresh this device's baselines, then verify them
    nox -s build-wheel        # sdist + wheel, installed and imported in a fresh venv

On a pre-provisioned machine (Ascend host with CANN and torch_npu, or a GPU host) run any
session in the machine's own Python: `nox --no-venv --no-install -s <name>`.
Extra arguments after `--` go to pytest (or to the two-phase runner for run-tests).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / 'packages'))

from cann_ops_pipeline import conventions, phases  # noqa: E402

nox.options.sessions = ['lint', 'tests-cpu']
nox.options.reuse_existing_virtualenvs = True

# The default is CPU-only here (the local torch build); set CANN_OPS_TORCH to e.g. a CUDA build's pin.
TORCH = os.environ.get('CANN_OPS_TORCH', 'torch==2.13.0')
DEV_EXTRA = nox.project.load_toml(ROOT / 'pyproject.toml')['project']['optional-dependencies']['dev']


def install_project(session: nox.Session) -> None:
    if session.venv_backend == 'none':  # --no-venv: the interpreter's own packages, nothing is installed
        return
    session.log(f'installing {TORCH} (first run: a large download; pip shows its progress)')
    session.install(TORCH, silent=False)  # first, so resolving the project cannot pull another torch build
    session.log('installing the project with its dev extra (-e .[dev])')
    session.install('-e', '.[dev]')


def run(session: nox.Session, steps: list[phases.Step]) -> None:
    in_venv = session.virtualenv.venv_backend != 'none'
    for step in steps:
        session.log(step.description)
        argv = step.resolved_argv('python' if in_venv else sys.executable)
        session.run(*argv, env=step.env, success_codes=list(step.success_codes))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install(*[req for req in DEV_EXTRA if req.startswith('ruff')])
    run(session, phases.lint())


def _project_session(name: str, steps, doc: str):
    """A session that installs the project and runs `steps(session.posargs)` (a phase of phases.py)."""

    def session_function(session: nox.Session) -> None:
        install_project(session)
        run(session, steps(session.posargs))

    session_function.__doc__ = doc
    return nox.session(name=name)(session_function)


tests_cpu = _project_session(
    'tests-cpu', phases.tests_cpu, 'Everything runnable without an accelerator (contracts, tooling, kernel lowering).'
)
verify_0, verify_1, verify_2 = (
    _project_session(
        f'verify-{level}',
        functools.partial(phases.verify, level),
        f'Correctness at test level {level}: CPU tier plus device tests where a device exists.',
    )
    for level in conventions.TEST_LEVELS
)
run_tests = _project_session(
    'run-tests', phases.run_tests, 'Two-phase xdist run: ordinary-memory tests wide, large_npu_mem tests narrow.'
)
refresh_mem = _project_session(
    'refresh-mem', phases.refresh_mem, 'Measure peak device memory of device tests and rewrite their profiles.'
)
refresh_baseline = _project_session(
    'refresh-baseline', phases.refresh_baseline, "Refresh this device's benchmark baselines, then verify them at once."
)
verify_baseline = _project_session(
    'verify-baseline', phases.verify_baseline, 'Compare benchmark results with the committed baselines.'
)


@nox.session(name='build-wheel')
def build_wheel(session: nox.Session) -> None:
    """Build sdist and wheel; install the wheel (with the torch pin) in a fresh venv and import it."""
    session.install(*[req for req in DEV_EXTRA if req.startswith('build')])  # the project itself is not needed
    run(session, phases.build_wheel(ROOT / 'dist', pins=[TORCH]))
