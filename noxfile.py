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
    session.log(f'installing {TORCH} (first run: a large download; pip shows its progress)')
    session.install(TORCH, silent=False)  # first, so resolving the project cannot pull another torch build
    session.log('installing the project with its dev extra (-e .[dev])')
    session.install('-e', '.[dev]')


def run(session: nox.Session, steps: list[phases.Step]) -> None:
    in_venv = session.virtualenv.venv_backend != 'none'
    for step in steps:
        session.log(step.description)
        session.run(*step.resolved_argv('python' if in_venv else sys.executable), env=step.env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install(*[req for req in DEV_EXTRA if req.startswith('ruff')])
    run(session, phases.lint())


@nox.session(name='tests-cpu')
def tests_cpu(session: nox.Session) -> None:
    """Everything runnable without an accelerator (contracts, tooling, kernel lowering)."""
    install_project(session)
    run(session, phases.tests_cpu(session.posargs))


def _verify_session(level: int):
    def verify(session: nox.Session) -> None:
        install_project(session)
        run(session, phases.verify(level, session.posargs))

    verify.__doc__ = f'Correctness at test level {level}: CPU tier plus device tests where a device exists.'
    return nox.session(name=f'verify-{level}')(verify)


verify_0, verify_1, verify_2 = (_verify_session(level) for level in conventions.TEST_LEVELS)


@nox.session(name='run-tests')
def run_tests(session: nox.Session) -> None:
    """Two-phase xdist run: ordinary-memory tests wide, large_npu_mem tests narrow."""
    install_project(session)
    run(session, phases.run_tests(session.posargs))


@nox.session(name='refresh-mem')
def refresh_mem(session: nox.Session) -> None:
    """Measure peak device memory of device tests and rewrite their profiles."""
    install_project(session)
    run(session, phases.refresh_mem(session.posargs))


@nox.session(name='refresh-baseline')
def refresh_baseline(session: nox.Session) -> None:
    """Refresh this device's benchmark baselines, then verify them at once."""
    install_project(session)
    run(session, phases.refresh_baseline(session.posargs))


@nox.session(name='verify-baseline')
def verify_baseline(session: nox.Session) -> None:
    """Compare benchmark results with the committed baselines."""
    install_project(session)
    run(session, phases.verify_baseline(session.posargs))


@nox.session(name='build-wheel')
def build_wheel(session: nox.Session) -> None:
    """Build sdist and wheel; install the wheel (with the torch pin) in a fresh venv and import it."""
    session.install(*[req for req in DEV_EXTRA if req.startswith('build')])  # the project itself is not needed
    run(session, phases.build_wheel(ROOT / 'dist', pins=[TORCH]))
