"""Run timeline: where a run's wall time goes, printed at its end in a few lines.

An xdist run takes longer than the sum of its test durations divided by its workers: every worker starts
an interpreter and imports torch / TileLang (the project plugins), collects, waits for the controller to
hand out tests, pays first-use costs (device initialization, kernel caches) inside its first tests, and
idles once its share is done while others finish theirs. Each process that runs tests (every xdist
worker, or the single process) records, in wall-clock time (`time.time()`, comparable across processes):

- its process start, from /proc/self/stat's starttime (clock ticks since boot) and /proc/uptime (or, with
  only /proc/stat, its integer `btime`); without /proc the plugin's import time;
- when it was configured (this plugin's `pytest_configure`, before the other plugins'), when its
  collection was done, when its first test started and its last one finished, and (a worker) when its
  session finished (after the other plugins' `pytest_sessionfinish`), just before it reports;
- its busy time (the setup + call + teardown durations of its reports), its number of tests, and its first
  test with that test's duration (where per-worker first-use costs show);
- the kernels it compiled or loaded from TileLang's disk cache during the session
  (`cann_ops_tilelang.kernel_target.compile_records`, where that module was imported): their number, their
  compile and lock-wait seconds, and the slowest compile, printed as one more line when any process compiled,
  and the kernels with the most compile time summed over the processes (compiles per kernel name), one line more.

A worker hands its record to the controller (`workeroutput`); the controller (or the single process) prints
`summary_lines` of them in `pytest_terminal_summary`, all times in seconds from the controller's session
start (the single process: its own). Printed by default, since it is short, is the measured answer the
two-phase runner's phases need on every run, and an option would have to be passed to pytest runs whose
conftest may not load the plugin; nothing is printed when no test ran (`--collect-only`, nothing selected).
`-p no:tests.testing.plugins.run_timeline` turns it off.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence

import pytest

_IMPORTED = time.time()
_WORKEROUTPUT_KEY = 'ops_tilelang_timeline'
MOST_COMPILED_SHOWN = 5  # kernels in the compile-time line
_recorder_key = pytest.StashKey['Recorder']()
_controller_key = pytest.StashKey['Controller']()
_KERNEL_TARGET = 'cann_ops_tilelang.kernel_target'

Record = Mapping[str, float | int | str | None]


def start_from_proc(stat: str, clk_tck: float, now: float, uptime: str | None, proc_stat: str | None) -> float | None:
    """A process's start in wall-clock seconds from the text of /proc/<pid>/stat, given /proc/uptime read at
    `now` (precise to a tick) or else /proc/stat (its `btime` is whole seconds); None when neither parses."""
    try:
        fields = stat[stat.rindex(')') + 2 :].split()  # the name in parentheses may hold spaces
        since_boot = int(fields[19]) / clk_tck  # field 22, starttime; the fields here start at field 3
    except (ValueError, IndexError):
        return None
    if uptime:
        try:
            return now - (float(uptime.split()[0]) - since_boot)
        except (ValueError, IndexError):
            pass
    for line in (proc_stat or '').splitlines():
        if line.startswith('btime '):
            try:
                return int(line.split()[1]) + since_boot
            except (ValueError, IndexError):
                return None
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding='ascii') as f:
            return f.read()
    except OSError:
        return None


def process_start(fallback: float) -> float:
    """This process's start (wall clock), or `fallback` where /proc is absent or disagrees with it."""
    stat = _read('/proc/self/stat')
    if stat is None or not hasattr(os, 'sysconf'):
        return fallback
    now = time.time()
    start = start_from_proc(stat, os.sysconf('SC_CLK_TCK'), now, _read('/proc/uptime'), _read('/proc/stat'))
    # A clock namespace or a virtualized /proc/uptime can put the start after the plugin's import.
    return start if start is not None and start <= fallback + 1.0 else fallback


def process_compiles() -> list:
    """This process's kernel compiles so far (`compile_records` of cann_ops_tilelang.kernel_target); none where
    that module was never imported, since then nothing compiled through it."""
    # Looked up, not imported: a project without the package has none, and one that has it but never compiled
    # would pay for the import (torch) in its report.
    compile_records = getattr(sys.modules.get(_KERNEL_TARGET), 'compile_records', None)
    return [] if compile_records is None else compile_records()


def compile_totals(compiles: Sequence) -> dict[str, float | int | str | dict | None]:
    """The record's compile keys from compile records (name, lock_wait_s, compile_s): their number, their
    compile and lock-wait seconds summed, the slowest compile's kernel name and seconds, and per kernel name its
    compiles and seconds."""
    slowest = max(compiles, key=lambda compile_: compile_.compile_s, default=None)
    by_kernel: dict[str, list] = {}
    for compile_ in compiles:
        entry = by_kernel.setdefault(compile_.name, [0, 0.0])
        entry[0] += 1
        entry[1] += compile_.compile_s
    return {
        'kernels': len(compiles),
        'compile_s': sum(compile_.compile_s for compile_ in compiles),
        'lock_wait_s': sum(compile_.lock_wait_s for compile_ in compiles),
        'slowest_kernel': None if slowest is None else slowest.name,
        'slowest_compile_s': 0.0 if slowest is None else slowest.compile_s,
        'compile_s_by_kernel': by_kernel,
    }


class Recorder:
    """A process that runs tests (a worker, or the single process): its timeline as one flat record."""

    def __init__(self) -> None:
        # Compiles before this session are not its own (a pytester run in the process of another session).
        self.compiles_before = len(process_compiles())
        self.record: dict[str, float | int | str | None] = {
            'process_start': process_start(_IMPORTED),
            'configured': time.time(),
            'collected': None,
            'first_start': None,
            'first_nodeid': None,
            'first_seconds': 0.0,
            'last_end': None,
            'busy': 0.0,
            'tests': 0,
            'finished': None,
        }

    def pytest_collection_finish(self) -> None:
        self.record['collected'] = time.time()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.record['first_start'] is None:
            self.record['first_start'], self.record['first_nodeid'] = time.time(), nodeid

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.record['busy'] += report.duration
        if report.nodeid == self.record['first_nodeid']:
            self.record['first_seconds'] += report.duration

    def pytest_runtest_logfinish(self) -> None:
        self.record['last_end'] = time.time()
        self.record['tests'] += 1


class Controller:
    """The controller (or the single process): its session start and the workers' records."""

    def __init__(self) -> None:
        self.process_start = process_start(_IMPORTED)
        self.session_start = time.time()
        self.all_collected: float | None = None
        self.workers: dict[str, Record] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Before the other plugins' configure work: it counts as collection, not as the worker's start."""
    config.stash[_recorder_key] = recorder = Recorder()
    config.pluginmanager.register(recorder, 'run_timeline_recorder')


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if getattr(session.config, 'workerinput', None) is None:  # before xdist starts its workers (trylast)
        session.config.stash[_controller_key] = Controller()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    recorder = session.config.stash[_recorder_key]
    record = recorder.record  # the single process's too: its terminal summary comes after this hook
    record.update(compile_totals(process_compiles()[recorder.compiles_before :]))
    workeroutput = getattr(session.config, 'workeroutput', None)
    if workeroutput is not None:  # a worker: xdist sends this once every sessionfinish has run
        record['finished'] = time.time()  # after the other plugins' sessionfinish
        workeroutput[_WORKEROUTPUT_KEY] = dict(record)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    controller = node.config.stash.get(_controller_key, None)
    if controller is not None:
        controller.all_collected = time.time()  # the last call: the scheduler has every collection


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    controller = node.config.stash.get(_controller_key, None)
    record = getattr(node, 'workeroutput', {}).get(_WORKEROUTPUT_KEY)  # none from a crashed worker
    if controller is not None and record is not None:
        controller.workers[node.gateway.id] = record


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    controller = config.stash.get(_controller_key, None)
    if controller is None:  # a worker, or a session that never started
        return
    if controller.workers:
        workers, single = controller.workers, False
    elif config.pluginmanager.has_plugin('dsession'):
        return  # xdist, but no worker reported (all crashed, or they lack the plugin)
    else:
        workers, single = {'main': config.stash[_recorder_key].record}, True
    if not any(record['tests'] for record in workers.values()):
        return
    controller_times = {'process_start': controller.process_start, 'session_start': controller.session_start}
    if controller.all_collected is not None:
        controller_times['all_collected'] = controller.all_collected
    terminalreporter.write_line('')
    for line in summary_lines(workers, controller_times, time.time(), single=single):
        terminalreporter.write_line(line)


def spread(values: Sequence[float]) -> str:
    """'A / B / C': min / median / max seconds, one decimal; one value alone; '-' for none."""
    if not values:
        return '-'
    if len(values) == 1:
        return f'{values[0]:.1f}'
    return f'{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}'


def summary_lines(
    workers: Mapping[str, Record], controller: Mapping[str, float], end: float, single: bool = False
) -> list[str]:
    """The printed block from the per-worker records (see Recorder; at least one test ran) and the controller's
    times (process_start, session_start, all_collected if known): seconds from the controller's session start,
    a figure over the workers as min / median / max."""
    t0 = controller['session_start']
    records = list(workers.values())
    ran = {name: record for name, record in workers.items() if record['tests']}

    def times(key: str) -> list[float]:
        return [record[key] - t0 for record in records if record.get(key) is not None]

    wall = end - t0
    who = '1 process, no xdist' if single else f'{len(records)} workers: min / median / max'
    whose = 'the' if single else "the controller's"
    lines = [
        f'run timeline ({who}; s from {whose} session start, its process started at '
        f'{controller["process_start"] - t0:.1f}; wall {wall:.1f} s):'
    ]
    starts = [f'{t:.1f}' for t in sorted(times('process_start'))]
    started = f', processes started at {starts[0]}' + (f' to {starts[-1]}' if starts[0] != starts[-1] else '')
    up = [record['configured'] - record['process_start'] for record in records]
    lines.append(f'  worker up (process start -> pytest configured): {spread(up)} s' + (started if not single else ''))
    collected = f'  collection done: {spread(times("collected"))}'
    if 'all_collected' in controller:
        collected += f'; the controller had every collection at {controller["all_collected"] - t0:.1f}'
    lines.append(collected)
    last_ends = times('last_end')
    run_end = max(last_ends)
    finished = [] if single else times('finished')  # a worker's, after its sessionfinish hooks
    lines.append(
        f'  first test started: {spread(times("first_start"))}; last test finished: {spread(last_ends)}; '
        + (f'session finished: {spread(finished)}; ' if finished else '')
        + f'run ended at {wall:.1f}'
    )
    busy = [record['busy'] for record in records]
    share = f'{sum(busy) / (len(records) * wall):.0%} of {"wall" if single else f"{len(records)} x wall"}'
    idle = [run_end - t for t in last_ends]
    tail = '' if single else f"; idle after its last test until the run's last: {spread(idle)} s"
    lines.append(f'  busy (setup + call + teardown): {spread(busy)} s, {share}{tail}')
    name, first = max(ran.items(), key=lambda item: item[1]['first_seconds'])
    tests = sum(record['tests'] for record in records)
    mean = f'mean test {sum(busy) / tests:.2f} s'
    if single:
        lines.append(f'  first test: {first["first_nodeid"]} {first["first_seconds"]:.1f} s; {mean}')
    else:
        firsts = spread([record['first_seconds'] for record in ran.values()])
        lines.append(
            f'  first test per worker: {firsts} s, slowest {first["first_nodeid"]} {first["first_seconds"]:.1f} s '
            f'on {name}; {mean}'
        )
    # Records from before the compile keys have no 'kernels': they print no compile line.
    compiled = {name: record for name, record in workers.items() if record.get('kernels')}
    if compiled:
        kernels = sum(record['kernels'] for record in compiled.values())
        compile_s = [record['compile_s'] for record in records if 'kernels' in record]
        per_worker = '' if single else f' (per worker: {spread(compile_s)})'
        waited = sum(record['lock_wait_s'] for record in compiled.values())
        name, slowest = max(compiled.items(), key=lambda item: item[1]['slowest_compile_s'])
        lines.append(
            f'  kernels: {kernels} compiled or loaded, {sum(compile_s):.1f} s compiling{per_worker}, '
            f"{waited:.1f} s waiting on other processes' compiles; slowest {slowest['slowest_kernel']} "
            f'{slowest["slowest_compile_s"]:.1f} s' + ('' if single else f' on {name}')
        )
        by_kernel: dict[str, list] = {}
        for record in compiled.values():
            for kernel, (count, seconds) in record.get('compile_s_by_kernel', {}).items():
                entry = by_kernel.setdefault(kernel, [0, 0.0])
                entry[0] += count
                entry[1] += seconds
        if by_kernel:  # where a cold run's compile time goes: the kernels whose configurations to share or cut
            most = sorted(by_kernel.items(), key=lambda item: -item[1][1])[:MOST_COMPILED_SHOWN]
            shown = ', '.join(f'{kernel} {seconds:.1f} s ({count})' for kernel, (count, seconds) in most)
            lines.append(f'  most compile time (s, compiles or loads): {shown}')
    return lines
