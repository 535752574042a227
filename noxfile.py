"""Pipeline sessions. Each is a few lines: what it runs, and its description, live in cann_ops_pipeline.phases.

    nox                       # lint + tests-cpu (the default sessions)
    nox -s verify-0           # correctness at level 0 (CPU tier + device tests if a device exists)
    nox -s refresh-baseline   # refresh this device's baselines, then verify them
    nox -s build-wheel        # sdist + wheel, installed and imported in a fresh venv

Every session that runs the project (tests-cpu, verify-N, run-tests, refresh-mem, refresh-baseline,
verify-baseline) runs in one shared virtualenv, `.nox/project`: torch and the project with its dev extra are
installed once for all of them, and again only when the torch pin, pyproject.toml or the Python changes
(`rm -r .nox/project` rebuilds it). Their own `.nox/<session>` virtualenvs stay empty. The sessions that need
a device look for one before anything is installed. lint and build-wheel have small environments of their own.

On a pre-provisioned machine (Ascend host with CANN and torch_npu, or a GPU host) run any
session in the machine's own Python: `nox --no-venv --no-install -s <name>`.
Extra arguments after `--` go to pytest (or to the two-phase runner for run-tests).
"""

from __future__ import annotations

import contextlib
import functools
import json
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
PYPROJECT = nox.project.load_toml(ROOT / 'pyproject.toml')
DEV_EXTRA = PYPROJECT['project']['optional-dependencies']['dev']

PROJECT_ENV = 'project'  # .nox/project: no session has this name, so nox never makes or clears it itself
INSTALLED = 'cann-ops-installed.json'  # in the shared env: what was installed, to decide whether to reuse it
# After Ctrl-C, how long a step may take to end on its own before nox terminates it. nox's default (0.3 s)
# killed pytest's xdist controller while its workers were still ending: they then failed to report to it and
# printed PluggyTeardownRaisedWarning / `OSError: cannot send` after nox had exited. With time to end, pytest
# prints its own short interrupted summary, as it does without nox.
INTERRUPT_GRACE_S = 30.0


def run(session: nox.Session, steps: list[phases.Step], python: str, env_dir: Path | None = None) -> None:
    """Run the steps with `python` as their 'python'; `env_dir`: the virtualenv whose tools come first on PATH."""
    extra = {} if env_dir is None else {'VIRTUAL_ENV': str(env_dir), 'PATH': _path_with(env_dir / 'bin')}
    for step in steps:
        session.log(step.description)
        argv = step.resolved_argv(python)
        codes = list(step.success_codes)
        session.run(
            *argv, env={**step.env, **extra}, success_codes=codes, external=True, interrupt_timeout=INTERRUPT_GRACE_S
        )


def _path_with(bin_dir: Path) -> str:
    return os.pathsep.join([str(bin_dir), os.environ.get('PATH', '')])


def _session_python(session: nox.Session) -> str:
    """The interpreter of the session: its virtualenv's, or under --no-venv the one running nox."""
    return 'python' if session.venv_backend != 'none' else sys.executable


def _python_version(env_dir: Path) -> str:
    """The exact Python of a virtualenv, from its pyvenv.cfg ('' when unknown)."""
    try:
        lines = (env_dir / 'pyvenv.cfg').read_text(encoding='utf-8').splitlines()
    except OSError:
        return ''
    fields = dict(line.split('=', 1) for line in lines if '=' in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return fields.get('version_info') or fields.get('version') or ''


@contextlib.contextmanager
def _locked(path: Path):
    """One nox process at a time builds the shared environment (another one waits, then reuses it)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (the project's devices are Linux hosts)
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, 'w') as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def project_env(session: nox.Session) -> Path | None:
    """The shared virtualenv with torch and the project (`-e .[dev]`), made or brought up to date first;
    None under --no-venv (the machine's own Python; nothing is installed)."""
    if session.venv_backend == 'none':
        return None
    env_dir = session.env_dir.absolute().parent / PROJECT_ENV  # beside the sessions', so `--envdir` moves it too
    python = env_dir / 'bin' / 'python'
    wanted = {
        'python': _python_version(session.env_dir),
        'torch': TORCH,
        'project': PYPROJECT['project'],  # dependencies and extras; the code itself is an editable install
    }
    record = env_dir / INSTALLED
    with _locked(env_dir.parent / f'{PROJECT_ENV}.lock'):
        try:
            installed = json.loads(record.read_text(encoding='utf-8'))
        except (OSError, ValueError):
            installed = None
        if installed == wanted and python.exists():
            session.log(f'reusing {env_dir} ({TORCH}, same Python and pyproject.toml)')
            return env_dir
        # run_install, as nox's own installs: skipped under --no-install when the session's env is reused.
        if installed is None or installed.get('python') != wanted['python'] or not python.exists():
            session.log(f'creating {env_dir}, the environment of every session that runs the project')
            session.run_install(
                sys.executable, '-m', 'virtualenv', '--clear', '--quiet', '-p', str(Path(session.bin) / 'python'),
                str(env_dir), external=True,
            )  # fmt: skip
        else:
            session.log(f'updating {env_dir}: the torch pin or pyproject.toml changed')
        session.log(f'installing {TORCH} (first run: a large download; pip shows its progress)')
        pip = [str(python), '-m', 'pip', 'install', '--progress-bar', 'off']
        # torch first, so resolving the project cannot pull another torch build
        if session.run_install(*pip, TORCH, external=True) is None:  # --no-install
            if not python.exists():
                session.error(f'{env_dir} does not exist yet: run the session once without --no-install')
            return env_dir
        session.log('installing the project with its dev extra (-e .[dev])')
        session.run_install(*pip, '-e', '.[dev]', external=True, silent=True)
        record.write_text(json.dumps(wanted, indent=1, sort_keys=True), encoding='utf-8')
    return env_dir


def _described(session: str, level: int | None = None):
    """Gives the session function its description (cann_ops_pipeline.phases.DESCRIPTIONS) as its docstring."""

    def decorate(function):
        function.__doc__ = phases.describe(session) if level is None else phases.describe(session, level)
        return function

    return decorate


@nox.session
@_described('lint')
def lint(session: nox.Session) -> None:
    session.install(*[req for req in DEV_EXTRA if req.startswith('ruff')])
    run(session, phases.lint(), _session_python(session))


def _project_session(name: str, steps, described: str, level: int | None = None):
    """A session that runs `steps(session.posargs)` (a phase of phases.py) in the shared project environment."""

    @_described(described, level)
    def session_function(session: nox.Session) -> None:
        todo = list(steps(session.posargs))
        # Steps that need nothing installed (the device check) run first, in nox's own Python: a device
        # session on a machine without one stops in seconds, before any environment is built.
        while todo and todo[0].needs_nothing_installed:
            run(session, [todo.pop(0)], sys.executable)
        env_dir = project_env(session)
        run(session, todo, sys.executable if env_dir is None else str(env_dir / 'bin' / 'python'), env_dir)

    return nox.session(name=name)(session_function)


tests_cpu = _project_session('tests-cpu', phases.tests_cpu, 'tests-cpu')
verify_0, verify_1, verify_2 = (
    _project_session(f'verify-{level}', functools.partial(phases.verify, level), 'verify', level)
    for level in conventions.TEST_LEVELS
)
run_tests = _project_session('run-tests', phases.run_tests, 'run-tests')
refresh_mem = _project_session('refresh-mem', phases.refresh_mem, 'refresh-mem')
refresh_baseline = _project_session('refresh-baseline', phases.refresh_baseline, 'refresh-baseline')
verify_baseline = _project_session('verify-baseline', phases.verify_baseline, 'verify-baseline')


@nox.session(name='build-wheel')
@_described('build-wheel')
def build_wheel(session: nox.Session) -> None:
    session.install(*[req for req in DEV_EXTRA if req.startswith('build')])  # the project itself is not needed
    run(session, phases.build_wheel(ROOT / 'dist', pins=[TORCH]), _session_python(session))
