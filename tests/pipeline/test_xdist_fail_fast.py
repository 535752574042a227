"""-x stops every xdist worker, not only the one that failed (tests/testing/plugins/xdist_fail_fast.py)."""

from __future__ import annotations

import re

import pytest

pytest_plugins = ['pytester']

QUIET = ('-p', 'no:cacheprovider', '-p', 'no:unraisableexception', '-p', 'no:hypothesispytest')
TESTS = """
import time

import pytest


@pytest.mark.parametrize('i', range(30))
def test_slow(i):
    time.sleep(0.2)
    assert i != 1
"""


def test_x_stops_every_worker(pytester):
    pytester.makeconftest("pytest_plugins = ['tests.testing.plugins.xdist_fail_fast']")
    pytester.makepyfile(test_slow=TESTS)
    # The controller in this process, the workers in their own (a controller process would add a start-up).
    result = pytester.runpytest_inprocess(*QUIET, '-n', '2', '--dist', 'worksteal', '-x')
    assert result.ret == pytest.ExitCode.INTERRUPTED  # xdist's own code for a run stopped by -x
    result.stdout.fnmatch_lines(['*1 failed, * passed in *'])
    passed = int(re.search(r'(\d+) passed', result.stdout.str()).group(1))
    # Without the plugin the other worker runs the 15 tests it holds (worksteal); here it stops after a test or two.
    assert passed <= 6, result.stdout.str()


def test_without_maxfail_every_test_runs(pytester):
    pytester.makeconftest("pytest_plugins = ['tests.testing.plugins.xdist_fail_fast']")
    pytester.makepyfile(test_slow=TESTS.replace('0.2', '0'))
    result = pytester.runpytest_inprocess(*QUIET, '-n', '2')
    result.assert_outcomes(passed=29, failed=1)
