"""xdist workers end with os._exit once pytest is done with them (tests/testing/plugins/worker_exit.py)."""

from __future__ import annotations

import pytest

pytest_plugins = ['pytester']

QUIET = ('-p', 'no:cacheprovider', '-p', 'no:unraisableexception', '-p', 'no:hypothesispytest')
# Each worker that imports the test file registers an atexit handler, which leaves a file behind if it runs.
TESTS = """
import atexit
import os
from pathlib import Path

import pytest

atexit.register(lambda: Path(os.environ['AT_EXIT_DIR'], f'{os.getpid()}.ran').touch())


@pytest.mark.parametrize('i', range(6))
def test_value(i):
    assert i != 3
"""


@pytest.fixture
def project(pytester, monkeypatch, tmp_path):
    pytester.makeconftest("pytest_plugins = ['tests.testing.plugins.worker_exit']")
    pytester.makepyfile(test_values=TESTS)
    at_exit = tmp_path / 'at_exit'
    at_exit.mkdir()
    monkeypatch.setenv('AT_EXIT_DIR', str(at_exit))
    return at_exit


def test_workers_end_without_their_interpreter_teardown(pytester, project):
    # The controller in this process, the workers in their own.
    result = pytester.runpytest_inprocess(*QUIET, '-n', '2')
    result.assert_outcomes(passed=5, failed=1)  # every result reached the controller
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert list(project.iterdir()) == []


def test_turned_off_workers_exit_as_usual(pytester, project):
    result = pytester.runpytest_inprocess(*QUIET, '-n', '2', '-p', 'no:tests.testing.plugins.worker_exit')
    result.assert_outcomes(passed=5, failed=1)
    assert len(list(project.iterdir())) == 2


def test_a_run_without_xdist_exits_as_usual(pytester, project):
    result = pytester.runpytest_subprocess(*QUIET)
    result.assert_outcomes(passed=5, failed=1)
    assert len(list(project.iterdir())) == 1
