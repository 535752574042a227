"""`-x` / `--maxfail` across xdist workers: once the whole run has that many failures, every worker stops.

xdist's controller stops handing out tests at --maxfail, but under `--dist worksteal` (the two-phase
default) or `load` each worker already holds a share of the tests, and a worker that did not fail runs
its share to the end. Here the controller makes one file per run and hands its path to every worker
(`workerinput`); a worker appends a line to it for each failure it reports and, after each test, stops
(`session.shouldstop`) once the file holds --maxfail lines. Without xdist or --maxfail nothing happens.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_WORKERINPUT_KEY = 'ops_tilelang_fail_fast'
_PATH = pytest.StashKey[Path]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Controller: one failure file for all workers of the run."""
    config = node.config
    if not config.getoption('maxfail'):
        return
    if _PATH not in config.stash:
        fd, name = tempfile.mkstemp(prefix='pytest-fail-fast-', suffix='.txt')
        os.close(fd)
        config.stash[_PATH] = Path(name)
    node.workerinput[_WORKERINPUT_KEY] = str(config.stash[_PATH])


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_PATH, None)
    if path is not None:
        path.unlink(missing_ok=True)


def _failure_file(config: pytest.Config) -> Path | None:
    workerinput = getattr(config, 'workerinput', None)
    return Path(workerinput[_WORKERINPUT_KEY]) if workerinput and _WORKERINPUT_KEY in workerinput else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Worker: count a failure as pytest does (failed, not an expected failure), for all workers to see."""
    report = yield
    path = _failure_file(item.config)
    if path is not None and report.failed and not hasattr(report, 'wasxfail'):
        with open(path, 'a', encoding='utf-8') as f:  # one short append: atomic between processes
            f.write(f'{item.nodeid}\n')
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Worker: after each test, stop when the run as a whole has reached --maxfail."""
    result = yield
    path = _failure_file(item.config)
    if path is not None and not item.session.shouldstop:
        maxfail = item.config.getoption('maxfail')
        failures = len(path.read_text(encoding='utf-8').splitlines())
        if failures >= maxfail:
            item.session.shouldstop = f'stopping after {failures} failure(s) across the xdist workers (--maxfail)'
    return result
