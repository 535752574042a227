"""A pytest plugin that holds a run's tests until a gate opens: the two-phase runner starts phase 2 while
phase 1 runs, so that phase 2's interpreter start, imports and collection overlap phase 1, and opens the
gate when phase 1 has ended. Its tests (those needing a device's memory) never overlap phase 1's.

    python -m pytest -p cann_ops_pipeline.phase_gate ...   # with CANN_OPS_PHASE_GATE=<a path that does not exist yet>

The tests start once the path exists (the runner creates it); without the variable the plugin does
nothing, and a phase that selected no test does not wait. A phase whose runner has gone (killed before it
could end the phase: the process's parent changes) stops instead of waiting for ever. The wait is in
`pytest_runtestloop`, after collection: under xdist the controller and every worker wait alike. Nothing
here touches a device.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

GATE_ENV = 'CANN_OPS_PHASE_GATE'
POLL_SECONDS = 0.05


class RunnerGone(Exception):
    """The process that would open the gate has ended."""


def wait_for_gate(path: Path, *, poll: float = POLL_SECONDS, sleep=time.sleep, parent=os.getppid) -> None:
    """Return once `path` exists; RunnerGone when the waiting process's parent changes first."""
    runner = parent()
    while not path.exists():
        if parent() != runner:
            raise RunnerGone(f'the two-phase runner (pid {runner}) ended before it opened {path}')
        sleep(poll)


def open_gate(path: Path) -> None:
    """Let the tests held by `path` start (an empty file; created at once, so never seen half-written)."""
    path.touch()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    gate = os.environ.get(GATE_ENV)
    # A phase that selected no test has nothing to hold: it ends now, while the phase before it runs, and
    # the runner finds it done. (An xdist controller collects nothing itself; its workers hold the tests.)
    if gate and (session.items or session.config.pluginmanager.has_plugin('dsession')):
        try:
            wait_for_gate(Path(gate))
        except RunnerGone as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)
