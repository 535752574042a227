"""Run timeline (tests/testing/plugins/run_timeline.py): per-worker records turned into a few printed lines."""

from __future__ import annotations

import re
import types

import pytest

from tests.testing.plugins.run_timeline import (
    MOST_COMPILED_SHOWN,
    compile_totals,
    spread,
    start_from_proc,
    summary_lines,
)

pytest_plugins = ['pytester']

QUIET = ('-p', 'no:cacheprovider', '-p', 'no:unraisableexception', '-p', 'no:hypothesispytest')
CONFTEST = "pytest_plugins = ['tests.testing.plugins.run_timeline']"
TESTS = """
import time

import pytest


@pytest.mark.parametrize('i', range(4))
def test_sleep(i):
    time.sleep(0.3 if i == 0 else 0.05)
"""
# The block as printed: a header and five indented lines, times as one-decimal seconds.
NUMBER = r'-?\d+\.\d'
SPREAD = rf'{NUMBER}(?: / {NUMBER} / {NUMBER})?'


# --- the pure helpers ---------------------------------------------------------------------------------

# /proc/<pid>/stat: pid, (name, which may hold spaces and parentheses), then field 3 (state) on; starttime is
# field 22, here 250 ticks.
STAT = '4242 (py (x) y) S ' + ' '.join(['0'] * 18) + ' 250 ' + ' '.join(['0'] * 30)


def test_the_process_start_comes_from_starttime_and_uptime():
    # Up 1000.00 s at now = 5000: booted at 4000, started 2.5 s after boot (250 ticks of 100 Hz).
    assert start_from_proc(STAT, 100, 5000.0, '1000.00 1800.00\n', 'btime 3999\n') == pytest.approx(4002.5)


def test_without_uptime_the_boot_time_of_proc_stat_counts():
    proc_stat = 'cpu  1 2 3\nbtime 3999\nprocesses 7\n'
    assert start_from_proc(STAT, 100, 5000.0, None, proc_stat) == pytest.approx(4001.5)
    assert start_from_proc(STAT, 100, 5000.0, 'garbage', proc_stat) == pytest.approx(4001.5)


@pytest.mark.parametrize(
    ('stat', 'uptime', 'proc_stat'),
    [('garbage', '1.0', 'btime 1'), ('1 (x) S 0', '1.0', 'btime 1'), (STAT, None, None), (STAT, None, 'btime x')],
)
def test_an_unreadable_proc_gives_no_start(stat, uptime, proc_stat):
    assert start_from_proc(stat, 100, 5000.0, uptime, proc_stat) is None


def test_spread():
    assert spread([]) == '-'
    assert spread([1.24]) == '1.2'
    assert spread([3.0, 1.0, 2.04, 10.0]) == '1.0 / 2.5 / 10.0'


def record(start, configured, collected, first=None, last=None, busy=0.0, tests=0, first_seconds=0.0, nodeid=None):
    finished = None if last is None else last + 0.5
    return {
        'finished': finished,
        'process_start': start,
        'configured': configured,
        'collected': collected,
        'first_start': first,
        'first_nodeid': nodeid,
        'first_seconds': first_seconds,
        'last_end': last,
        'busy': busy,
        'tests': tests,
    }


def test_summary_lines_of_three_workers():
    # The controller's session starts at 100 (its process at 98); the run ends at 120.
    workers = {
        'gw0': record(100.1, 102.1, 103.0, 103.5, 115.0, busy=10.0, tests=5, first_seconds=6.0, nodeid='t.py::a'),
        'gw1': record(100.2, 103.2, 104.0, 104.5, 118.0, busy=12.0, tests=7, first_seconds=1.0, nodeid='t.py::b'),
        'gw2': record(100.3, 104.3, 104.5),  # got no test
    }
    controller = {'process_start': 98.0, 'session_start': 100.0, 'all_collected': 104.6}
    assert summary_lines(workers, controller, 120.0) == [
        "run timeline (3 workers: min / median / max; s from the controller's session start, "
        'its process started at -2.0; wall 20.0 s):',
        '  worker up (process start -> pytest configured): 2.0 / 3.0 / 4.0 s, processes started at 0.1 to 0.3',
        '  collection done: 3.0 / 4.0 / 4.5; the controller had every collection at 4.6',
        '  first test started: 3.5 / 4.0 / 4.5; last test finished: 15.0 / 16.5 / 18.0; '
        'session finished: 15.5 / 17.0 / 18.5; run ended at 20.0',
        '  busy (setup + call + teardown): 0.0 / 10.0 / 12.0 s, 37% of 3 x wall; '
        "idle after its last test until the run's last: 0.0 / 1.5 / 3.0 s",
        '  first test per worker: 1.0 / 3.5 / 6.0 s, slowest t.py::a 6.0 s on gw0; mean test 1.83 s',
    ]


def test_summary_lines_of_a_single_process():
    workers = {'main': record(8.0, 10.0, 11.0, 11.0, 14.0, busy=3.0, tests=3, first_seconds=2.0, nodeid='t.py::a')}
    assert summary_lines(workers, {'process_start': 8.0, 'session_start': 10.0}, 15.0, single=True) == [
        'run timeline (1 process, no xdist; s from the session start, its process started at -2.0; wall 5.0 s):',
        '  worker up (process start -> pytest configured): 2.0 s',
        '  collection done: 1.0',
        '  first test started: 1.0; last test finished: 4.0; run ended at 5.0',
        '  busy (setup + call + teardown): 3.0 s, 60% of wall',
        '  first test: t.py::a 2.0 s; mean test 1.00 s',
    ]


def compiles(kernels, compile_s, lock_wait_s=0.0, slowest=(None, 0.0), by_kernel=None):
    """The compile keys of a record (compile_totals' form)."""
    return {
        'kernels': kernels,
        'compile_s': compile_s,
        'lock_wait_s': lock_wait_s,
        'slowest_kernel': slowest[0],
        'slowest_compile_s': slowest[1],
        'compile_s_by_kernel': by_kernel or {},
    }


def test_compile_totals():
    def compiled(name, lock_wait_s, compile_s):
        return types.SimpleNamespace(name=name, lock_wait_s=lock_wait_s, compile_s=compile_s)

    found = compile_totals(
        [compiled('a', 0.5, 2.0), compiled('b', 3.0, 0.25), compiled('c', 0.0, 7.5), compiled('a', 0.0, 1.0)]
    )
    assert found == compiles(4, 10.75, 3.5, ('c', 7.5), {'a': [2, 3.0], 'b': [1, 0.25], 'c': [1, 7.5]})
    assert compile_totals([]) == compiles(0, 0, 0, (None, 0.0))


def test_summary_lines_of_workers_that_compiled_kernels():
    workers = {
        'gw0': record(100.1, 102.1, 103.0, 103.5, 115.0, busy=10.0, tests=5, first_seconds=6.0, nodeid='t.py::a')
        | compiles(3, 30.25, 1.0, ('gate_fwd_kernel', 20.0), {'gate_fwd_kernel': [2, 28.0], 'hash': [1, 2.25]}),
        'gw1': record(100.2, 103.2, 104.0, 104.5, 118.0, busy=12.0, tests=7, first_seconds=1.0, nodeid='t.py::b')
        | compiles(2, 41.0, 12.5, ('gate_bwd_kernel', 38.2), {'gate_bwd_kernel': [1, 38.2], 'hash': [1, 2.8]}),
        'gw2': record(100.3, 104.3, 104.5) | compiles(0, 0.0),  # got no test
    }
    controller = {'process_start': 98.0, 'session_start': 100.0, 'all_collected': 104.6}
    lines = summary_lines(workers, controller, 120.0)
    assert len(lines) == 8
    assert lines[-2] == (
        '  kernels: 5 compiled or loaded, 71.2 s compiling (per worker: 0.0 / 30.2 / 41.0), 13.5 s waiting on '
        "other processes' compiles; slowest gate_bwd_kernel 38.2 s on gw1"
    )
    # Summed over the workers, most first.
    assert lines[-1] == (
        '  most compile time (s, compiles or loads): gate_bwd_kernel 38.2 s (1), gate_fwd_kernel 28.0 s (2), '
        'hash 5.0 s (2)'
    )
    # The lines before them are those of records without compiles.
    old_format = {name: {k: v for k, v in rec.items() if k not in compiles(0, 0)} for name, rec in workers.items()}
    assert summary_lines(old_format, controller, 120.0) == lines[:-2]


def test_summary_lines_of_a_single_process_that_compiled_a_kernel():
    workers = {
        'main': record(8.0, 10.0, 11.0, 11.0, 14.0, busy=3.0, tests=3, first_seconds=2.0, nodeid='t.py::a')
        | compiles(1, 1.96, 0.0, ('kernel', 1.96))
    }
    lines = summary_lines(workers, {'process_start': 8.0, 'session_start': 10.0}, 15.0, single=True)
    assert lines[-1] == (
        "  kernels: 1 compiled or loaded, 2.0 s compiling, 0.0 s waiting on other processes' compiles; "
        'slowest kernel 2.0 s'
    )


def test_no_kernel_line_without_a_compile():
    # Records of the current format that compiled nothing, and of the old format (no compile keys) among them.
    workers = {
        'gw0': record(100.1, 102.1, 103.0, 103.5, 115.0, busy=10.0, tests=5, first_seconds=6.0, nodeid='t.py::a')
        | compiles(0, 0.0),
        'gw1': record(100.2, 103.2, 104.0, 104.5, 118.0, busy=12.0, tests=7, first_seconds=1.0, nodeid='t.py::b'),
    }
    lines = summary_lines(workers, {'process_start': 98.0, 'session_start': 100.0}, 120.0)
    assert len(lines) == 6
    assert not any('kernels' in line for line in lines)


# --- real runs ------------------------------------------------------------------------------------------


def block(result: pytest.RunResult) -> list[str]:
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith('run timeline ('))
    return lines[start : start + 6]


def test_a_single_process_prints_its_timeline(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sleep=TESTS)
    result = pytester.runpytest_inprocess(*QUIET)
    result.assert_outcomes(passed=4)
    header, up, collected, tests, busy, first = block(result)
    assert re.fullmatch(rf'run timeline \(1 process, no xdist; .* started at {NUMBER}; wall {NUMBER} s\):', header)
    assert re.fullmatch(rf'  worker up \(process start -> pytest configured\): {NUMBER} s', up)
    assert re.fullmatch(rf'  collection done: {NUMBER}', collected)
    assert re.fullmatch(rf'  first test started: {NUMBER}; last test finished: {NUMBER}; run ended at {NUMBER}', tests)
    busy_seconds = float(re.fullmatch(rf'  busy \(setup \+ call \+ teardown\): ({NUMBER}) s, \d+% of wall', busy)[1])
    assert busy_seconds >= 0.4  # 0.3 + 3 x 0.05 s of sleeps, rounded to one decimal
    first_seconds = re.fullmatch(
        rf'  first test: test_sleep.py::test_sleep\[0\] ({NUMBER}) s; mean test \d\.\d\d s', first
    )
    assert float(first_seconds[1]) >= 0.3


def test_each_xdist_worker_reports_to_the_controller(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sleep=TESTS)
    # The controller in this process, the workers in their own.
    result = pytester.runpytest_inprocess(*QUIET, '-n', '2', '--dist', 'worksteal')
    result.assert_outcomes(passed=4)
    header, up, collected, tests, busy, first = block(result)
    assert header.startswith("run timeline (2 workers: min / median / max; s from the controller's session start")
    assert re.fullmatch(rf'  worker up .*: {SPREAD} s, processes started at {NUMBER}( to {NUMBER})?', up)
    assert re.fullmatch(rf'  collection done: {SPREAD}; the controller had every collection at {NUMBER}', collected)
    assert re.fullmatch(
        rf'  first test started: {SPREAD}; last test finished: {SPREAD}; session finished: {SPREAD}; '
        rf'run ended at {NUMBER}',
        tests,
    )
    figures = [float(n) for n in re.findall(NUMBER, tests)]  # 3 x (min, median, max), then the end
    assert 0 < figures[0] <= figures[5] <= figures[8] <= figures[9]
    assert re.fullmatch(rf'  busy .*: {SPREAD} s, \d+% of 2 x wall; idle after .*: {SPREAD} s', busy)
    # worksteal: the first worker to come up starts with test_sleep[0], the 0.3 s one.
    slowest = re.fullmatch(
        rf'  first test per worker: {SPREAD} s, slowest .*test_sleep\[0\] ({NUMBER}) s on gw[01]; .*', first
    )
    assert float(slowest[1]) >= 0.3


# The single process's test compiles through kernel_target itself, with TileLang's compile and the lock
# replaced; its process is this one, whose earlier compiles the block leaves out.
COMPILING_TESTS = """
import contextlib
import time

import tilelang

from cann_ops_tilelang import kernel_target


class Func:
    attrs = {'global_symbol': 'gate_bwd_kernel'}

    def script(self):
        return 'the kernel'


@contextlib.contextmanager
def held_elsewhere(prim_func, target):
    time.sleep(0.2)
    yield


def test_compile(monkeypatch):
    monkeypatch.setattr(tilelang, 'compile', lambda prim_func, target: time.sleep(0.3))
    monkeypatch.setattr(kernel_target, 'compile_lock', held_elsewhere)
    kernel_target.compile_kernel(Func(), 'ascend')


def test_nothing():
    pass
"""
KERNELS = (
    rf"  kernels: 1 compiled or loaded, ({NUMBER}) s compiling, ({NUMBER}) s waiting on other processes' "
    rf'compiles; slowest gate_bwd_kernel ({NUMBER}) s'
)


def test_a_single_process_reports_its_compiles(pytester, monkeypatch):
    # Imported here first: an in-process run drops the modules it imported, and TVM cannot be imported twice.
    import tilelang  # noqa: F401

    import cann_ops_tilelang.kernel_target  # noqa: F401

    monkeypatch.delenv('OPS_TILELANG_ASCEND_EMULATOR', raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_compile=COMPILING_TESTS)
    for _ in range(2):  # the second run's block leaves the first run's compile out
        result = pytester.runpytest_inprocess(*QUIET)
        result.assert_outcomes(passed=2)
        (kernels,) = (line for line in result.stdout.lines if line.startswith('  kernels:'))
        compile_s, waited, slowest = (float(n) for n in re.fullmatch(KERNELS, kernels).groups())
        assert compile_s == slowest >= 0.3
        assert 0.2 <= waited < 0.3


# A worker's compiles reach the controller: its test stands in for kernel_target with its compile records.
# Workers are processes of their own, so the stand-in leaves this process's modules alone.
WORKER_COMPILES = """
import sys
import types


def compile_records():
    compiled = types.SimpleNamespace(name='gate_fwd_kernel', lock_wait_s=1.5, compile_s=4.0)
    return [compiled, types.SimpleNamespace(name='other', lock_wait_s=0.0, compile_s=0.5)]


def test_compile():
    sys.modules['cann_ops_tilelang.kernel_target'] = types.SimpleNamespace(compile_records=compile_records)
"""


def test_a_workers_compiles_reach_the_controller(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_compile=WORKER_COMPILES)
    result = pytester.runpytest_inprocess(*QUIET, '-n', '2')
    result.assert_outcomes(passed=1)
    (kernels,) = (line for line in result.stdout.lines if line.startswith('  kernels:'))
    assert re.fullmatch(
        r'  kernels: 2 compiled or loaded, 4\.5 s compiling \(per worker: 0\.0 / 2\.2 / 4\.5\), 1\.5 s waiting on '
        r"other processes' compiles; slowest gate_fwd_kernel 4\.0 s on gw[01]",
        kernels,
    )


def test_opt_out_and_nothing_without_tests(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sleep=TESTS.replace('0.3 if i == 0 else 0.05', '0'))
    off = pytester.runpytest_inprocess(*QUIET, '-p', 'no:tests.testing.plugins.run_timeline')
    off.assert_outcomes(passed=4)
    collect_only = pytester.runpytest_inprocess(*QUIET, '--collect-only')
    for result in (off, collect_only):
        assert 'run timeline' not in result.stdout.str()


def test_the_compile_time_line_shows_the_kernels_with_the_most():
    by_kernel = {f'k{i}': [1, float(i)] for i in range(MOST_COMPILED_SHOWN + 2)}
    workers = {
        'main': record(8.0, 10.0, 11.0, 11.0, 14.0, busy=3.0, tests=3, first_seconds=2.0, nodeid='t.py::a')
        | compiles(len(by_kernel), 21.0, 0.0, ('k6', 6.0), by_kernel)
    }
    last = summary_lines(workers, {'process_start': 8.0, 'session_start': 10.0}, 15.0, single=True)[-1]
    shown = [f'k{i} {i:.1f} s (1)' for i in reversed(range(2, MOST_COMPILED_SHOWN + 2))]
    assert last == '  most compile time (s, compiles or loads): ' + ', '.join(shown)
