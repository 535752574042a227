"""The end-of-run summary of TileLang compile warnings (tests/testing/plugins/compile_warnings.py)."""

from __future__ import annotations

import pytest

from tests.testing.plugins.compile_warnings import warning_lines

pytest_plugins = ['pytester']

QUIET = ('-p', 'no:cacheprovider', '-p', 'no:unraisableexception', '-p', 'no:hypothesispytest')
TILELANG = '2026-12-01 08:00:00  [TileLang:tilelang.transform:WARNING] (layout.py:12): fragment layout not inferred'
TVM = '[08:00:01] /src/tvm/lower.cc:42: Warning: loop not vectorized'
TESTS = f"""
import sys

import pytest


@pytest.mark.parametrize('i', range(4))
def test_compiles(i):
    print({TILELANG!r})
    print('[TileLang:tilelang.jit:INFO] compiled')
    if i == 0:
        print({TVM!r}, file=sys.stderr)


def test_quiet():
    print('no warning here')
"""


def test_warning_lines():
    assert warning_lines(f'{TILELANG}\nplain\n{TVM}\nkernel.cu(3): warning #177-D: unused\nx.cc: warning: y') == [
        '[TileLang:tilelang.transform:WARNING] (layout.py:12): fragment layout not inferred',
        '/src/tvm/lower.cc:42: Warning: loop not vectorized',
        'kernel.cu(3): warning #177-D: unused',
        'x.cc: warning: y',
    ]
    assert warning_lines('[TileLang:tilelang.jit:INFO] compiled\nwarnings are off') == []


@pytest.mark.parametrize('xdist', [(), ('-n', '2')], ids=['in-process', 'xdist'])
def test_summary_lists_each_warning_once_with_its_count(pytester, xdist, capsys):
    pytester.makeconftest("pytest_plugins = ['tests.testing.plugins.compile_warnings']")
    pytester.makepyfile(test_kernels=TESTS)
    result = pytester.runpytest_subprocess(*QUIET, *xdist)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            '*TileLang compile warnings: 2 distinct, 5 in all*',
            '   4x [[]TileLang:tilelang.transform:WARNING[]] (layout.py:12): fragment layout not inferred  '
            '(first in test_kernels.py::test_compiles[[]*[]])',
            '   1x /src/tvm/lower.cc:42: Warning: loop not vectorized  '
            '(first in test_kernels.py::test_compiles[[]0[]])',
        ]
    )
    capsys.readouterr()  # pytester echoed the inner run: keep its warning lines out of this run's summary


def test_no_summary_without_warnings(pytester, capsys):
    pytester.makeconftest("pytest_plugins = ['tests.testing.plugins.compile_warnings']")
    pytester.makepyfile(test_kernels="def test_quiet():\n    print('fine')\n")
    result = pytester.runpytest_subprocess(*QUIET)
    assert 'compile warnings' not in result.stdout.str()
    capsys.readouterr()
