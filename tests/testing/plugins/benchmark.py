"""Benchmarks and their baselines: `benchmark_timer`, `benchmark_record`, refresh and verify.

- Tests marked `benchmark` are skipped unless --run-benchmark.
- `benchmark_timer(fn)` is the median device time of `fn()` in microseconds (tests/testing/timing.py);
  `benchmark_record(kernel=..., operation=..., params=..., time_us=..., ...)` keeps one record.
- --refresh-baseline rewrites the baseline files (tests/testing/baseline.py) of the tests that ran:
  their records on this cluster are replaced, every other record is kept. Nothing is written
  when any test failed or the run was interrupted.
- Otherwise (verify), each record is compared with its baseline; regressions, missing baselines,
  lost records and corrupt files fail the run, and the terminal summary lists every verdict.

Under xdist each worker hands its records to the controller (`workeroutput`); the controller
checks them against the reports of every benchmark test that passed, then judges once.
The device side is injectable: implement `pytest_benchmark_backend(config)` in a conftest.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from cann_ops_pipeline.conventions import DEFAULT_MIN_DELTA_US, DEFAULT_REGRESSION_THRESHOLD
from tests.testing import baseline
from tests.testing.files import CorruptFileError, atomic_write_text
from tests.testing.timing import DeviceBackend, NoAcceleratorError

_WORKEROUTPUT_KEY = 'benchmark_records'


class BenchmarkHookspecs:
    @pytest.hookspec(firstresult=True)
    def pytest_benchmark_backend(self, config: pytest.Config):
        """The object that times and describes benchmarks, with the methods of timing.DeviceBackend:
        `time_us(fn) -> (microseconds, timing backend name)`, `cluster() -> str`,
        `environment() -> dict[str, str | None]`, `public_operators() -> frozenset[str]`.
        Called once per process; the first non-None result wins."""


_SESSION = pytest.StashKey['BenchmarkSession']()
_BACKEND = pytest.StashKey[object]()
_TIMED_WITH = pytest.StashKey[str]()  # on the item: the timing backend of its last benchmark_timer call


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(BenchmarkHookspecs)


@dataclasses.dataclass
class _Outcome:
    mode: str  # 'refresh' or 'verify'
    lines: list[tuple[str, dict]] = dataclasses.field(default_factory=list)  # (text, terminal markup)
    failures: list[str] = dataclasses.field(default_factory=list)


@pytest.hookimpl(trylast=True)
def pytest_benchmark_backend(config: pytest.Config):
    return DeviceBackend()


def _non_negative_float(text: str) -> float:
    """An option value >= 0; argparse prefixes the message with the option's name."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f'expected a finite number >= 0, got {text!r}')
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup('cann_ops_tilelang')
    group.addoption('--run-benchmark', action='store_true', help='run the tests marked benchmark (skipped otherwise)')
    group.addoption(
        '--refresh-baseline',
        action='store_true',
        help="rewrite this cluster's baseline records of the benchmark tests that ran (keeps all others); "
        'without it, benchmark results are verified against the baselines',
    )
    group.addoption(
        '--benchmark-regression-threshold',
        type=_non_negative_float,
        default=DEFAULT_REGRESSION_THRESHOLD,
        metavar='R',
        help=f'relative slow-down that, together with --benchmark-min-delta-us, is a regression '
        f'(default {DEFAULT_REGRESSION_THRESHOLD})',
    )
    group.addoption(
        '--benchmark-min-delta-us',
        type=_non_negative_float,
        default=DEFAULT_MIN_DELTA_US,
        metavar='US',
        help=f'absolute slow-down in microseconds that, together with the threshold, is a regression '
        f'(default {DEFAULT_MIN_DELTA_US})',
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line('markers', 'benchmark: performance measurement; skipped unless --run-benchmark')
    if config.getoption('refresh_baseline') and not config.getoption('run_benchmark'):
        raise pytest.UsageError('--refresh-baseline needs --run-benchmark (benchmark tests are skipped without it)')
    config.stash[_SESSION] = BenchmarkSession(config)
    config.pluginmanager.register(config.stash[_SESSION], 'benchmark-session')


def get_backend(config: pytest.Config):
    """This process's benchmark backend (from the pytest_benchmark_backend hook, made once)."""
    if _BACKEND not in config.stash:
        config.stash[_BACKEND] = config.hook.pytest_benchmark_backend(config=config)
    return config.stash[_BACKEND]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption('run_benchmark'):
        return
    skip = pytest.mark.skip(reason='benchmark test: pass --run-benchmark to run it')
    for item in items:
        if item.get_closest_marker('benchmark') is not None:
            item.add_marker(skip)


@pytest.fixture
def benchmark_timer(request: pytest.FixtureRequest) -> Callable[[Callable[[], object]], float]:
    """`benchmark_timer(fn) -> float`: the median device time of `fn()` in microseconds.

    msprof on Ascend, CUPTI (else CUDA events) on CUDA, never the CPU clock: without an
    accelerator the test is skipped with the reason. The warm-up and repetitions are those of
    tests/testing/timing.py (WARMUP_MS, REP_MS, ROUNDS).
    """
    backend = get_backend(request.config)
    item = request.node

    def timer(fn: Callable[[], object]) -> float:
        if not callable(fn):
            raise TypeError(f'benchmark_timer expects a function to call, got {type(fn).__name__}')
        try:
            time_us, timed_with = backend.time_us(fn)
        except NoAcceleratorError as exc:
            pytest.skip(str(exc))
        time_us = baseline.check_time_us(time_us, 'the measured time')
        item.stash[_TIMED_WITH] = timed_with
        return time_us

    return timer


@pytest.fixture
def benchmark_record(request: pytest.FixtureRequest) -> Callable[..., None]:
    """`benchmark_record(*, kernel, operation, params, time_us, bandwidth_gbs=None, extras=None)`.

    Keeps one result of this test for the baseline refresh or verify at the end of the run.
    `kernel` must be a public operator (`cann_ops_tilelang.__all__`); `time_us` must come from
    `benchmark_timer` in this test. The cluster, timing backend, environment and node ID are added.
    """
    item = request.node
    if item.get_closest_marker('benchmark') is None:
        raise RuntimeError(f'benchmark_record is for tests marked @pytest.mark.benchmark; {item.nodeid} is not')
    session = request.config.stash[_SESSION]
    backend = get_backend(request.config)

    def record(
        *,
        kernel: str,
        operation: str,
        params: Mapping,
        time_us: float,
        bandwidth_gbs: float | None = None,
        extras: Mapping | None = None,
    ) -> None:
        public = backend.public_operators()
        if not isinstance(kernel, str) or kernel not in public:
            raise ValueError(
                f'benchmark_record: kernel={kernel!r} is not a public operator of cann_ops_tilelang '
                f'(its __all__: {", ".join(sorted(public)) or "empty"}); record under the public name'
            )
        if _TIMED_WITH not in item.stash:
            raise RuntimeError('benchmark_record: measure time_us with the benchmark_timer fixture in this test first')
        session.add(
            baseline.make_record(
                kernel=kernel,
                operation=operation,
                params=params,
                time_us=time_us,
                bandwidth_gbs=bandwidth_gbs,
                extras=extras,
                cluster=backend.cluster(),
                timing_backend=item.stash[_TIMED_WITH],
                environment=session.environment(),
                node_id=item.nodeid,
            )
        )

    return record


class BenchmarkSession:
    """This run's benchmark results; outside xdist workers, judges them once at the end."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.records: list[dict] = []  # made in this process, or received from the workers
        self.ran: set[str] = set()  # benchmark tests whose call phase ran (from every worker's reports)
        self.failed: set[str] = set()  # benchmark tests that failed or errored in any phase
        self.skipped = 0
        self.lost_workers: list[str] = []
        self.outcome: _Outcome | None = None
        self._environment: dict | None = None
        self.checked_collection = False
        self.exitstatus: int | None = None

    def environment(self) -> dict:
        if self._environment is None:
            self._environment = dict(get_backend(self.config).environment())
        return self._environment

    def add(self, record: dict) -> None:
        key = baseline.record_key(record)
        for other in self.records:
            if baseline.record_key(other) == key:
                raise ValueError(
                    f'benchmark_record: {baseline.format_key(key)} was already recorded by {other["node_id"]}'
                )
        self.records.append(record)

    def baseline_file(self, nodeid: str) -> Path:
        return baseline.baseline_path(self.config.rootpath / nodeid.split('::', 1)[0])

    def test_file(self, path: Path) -> str:
        """The node ID of the test module whose baseline file `path` is (inverse of baseline_file)."""
        return Path(os.path.relpath(path.parent.parent / f'{path.stem}.py', self.config.rootpath)).as_posix()

    def load(self, path: Path) -> list[dict]:
        return baseline.load_baseline(path, self.test_file(path))

    def relative(self, path: Path) -> str:
        return os.path.relpath(path, self.config.rootpath)

    def check_baseline_files(self, nodeids) -> str | None:
        """Why a baseline file of these tests cannot be read, or None."""
        for path in sorted({self.baseline_file(nodeid) for nodeid in nodeids}):
            try:
                self.load(path)
            except CorruptFileError as exc:
                return f'corrupt baseline file {exc}'
        return None

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Fail fast on a corrupt baseline file, before any benchmark runs (xdist: the controller checks)."""
        if not self.config.getoption('run_benchmark') or hasattr(self.config, 'workerinput'):
            return
        problem = self.check_baseline_files(
            item.nodeid for item in session.items if item.get_closest_marker('benchmark')
        )
        if problem:
            raise pytest.UsageError(problem)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        """xdist controller: the same check once a worker has collected (a UsageError would be lost there)."""
        if not self.config.getoption('run_benchmark') or self.checked_collection:
            return
        self.checked_collection = True
        problem = self.check_baseline_files(ids)
        if problem:
            pytest.exit(problem, returncode=pytest.ExitCode.USAGE_ERROR)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Markers are keywords, and reports carry them to the xdist controller. (So are the names of
        # parent folders: the baselines' `benchmark/` folders must not hold tests.)
        if 'benchmark' not in report.keywords:
            return
        if report.when == 'call' and not report.skipped:
            self.ran.add(report.nodeid)
        if report.failed:
            self.failed.add(report.nodeid)
        elif report.skipped:
            self.skipped += 1

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """xdist controller: a worker finished; take the records it handed over."""
        output = getattr(node, 'workeroutput', None) or {}
        if _WORKEROUTPUT_KEY in output:
            self.records.extend(json.loads(output[_WORKEROUTPUT_KEY]))
        else:
            self.lost_workers.append(f'{node.gateway.id} ({error or "no output"})')

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.exitstatus = exitstatus
        if hasattr(self.config, 'workerinput'):  # an xdist worker: the controller judges
            self.config.workeroutput[_WORKEROUTPUT_KEY] = json.dumps(self.records)
            return
        if not (self.ran or self.records):  # no benchmark ran: nothing to judge
            return
        self.outcome = self.judge(exitstatus)
        if self.outcome.failures and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def judge(self, exitstatus: int) -> _Outcome:
        refresh = self.config.getoption('refresh_baseline')
        outcome = _Outcome('refresh' if refresh else 'verify')
        recorded = {r['node_id'] for r in self.records}
        if self.ran and self.lost_workers:
            outcome.failures.append(f'lost the benchmark records of xdist worker(s) {", ".join(self.lost_workers)}')
        silent = sorted(self.ran - self.failed - recorded)
        if silent:
            outcome.failures.append(
                f'{len(silent)} benchmark test(s) passed but none of their records arrived: {", ".join(silent)}'
            )
        for key, nodes in baseline.duplicate_keys(self.records).items():
            outcome.failures.append(f'{baseline.format_key(key)} recorded more than once, by {", ".join(nodes)}')
        files = sorted({self.baseline_file(nodeid) for nodeid in self.ran | recorded})
        try:
            old = {path: self.load(path) for path in files}
        except CorruptFileError as exc:
            outcome.failures.append(f'corrupt baseline file {exc}')
            return outcome
        new = {path: [r for r in self.records if self.baseline_file(r['node_id']) == path] for path in files}
        if refresh:
            final = self.refresh(outcome, old, new, exitstatus)
        else:
            final = old
            self.verify(outcome, old, new)
        public = get_backend(self.config).public_operators()
        for path, records in final.items():
            for r in baseline.stale_records(records, public):
                outcome.lines.append(
                    (
                        f'STALE        {baseline.format_key(baseline.record_key(r))} in {self.relative(path)}: '
                        f'{r["kernel"]!r} is not a public operator of cann_ops_tilelang',
                        {'yellow': True},
                    )
                )
        return outcome

    def refresh(self, outcome: _Outcome, old: dict, new: dict, exitstatus: int) -> dict:
        reasons = ['the problems below'] if outcome.failures else []
        if self.failed:
            reasons.append(f'{len(self.failed)} benchmark test(s) failed')
        if exitstatus != pytest.ExitCode.OK:
            reasons.append(f'the run ended with {pytest.ExitCode(exitstatus).name}')
        if reasons:
            outcome.failures.append(f'baseline files left unchanged: {"; ".join(reasons)}')
            return old
        final = {}
        for path, records in old.items():
            merged = baseline.merge_refresh(records, new[path], self.ran)
            final[path] = merged
            text = baseline.dumps_baseline(merged)
            if merged and (not path.exists() or path.read_text(encoding='utf-8') != text):
                atomic_write_text(path, text)
            clusters = ', '.join(sorted({r['cluster'] for r in new[path]})) or '-'
            outcome.lines.append(
                (
                    f'{self.relative(path)}: {len(new[path])} record(s) written for {clusters}, '
                    f'{len(records) - (len(merged) - len(new[path]))} replaced, '
                    f'{len(merged) - len(new[path])} kept',
                    {},
                )
            )
        return final

    def verify(self, outcome: _Outcome, old: dict, new: dict) -> None:
        threshold = self.config.getoption('benchmark_regression_threshold')
        min_delta = self.config.getoption('benchmark_min_delta_us')
        counts = dict.fromkeys(('ok', 'regression', 'improvement', 'missing'), 0)
        for path in old:
            for v in baseline.verify(new[path], old[path], threshold, min_delta):
                counts[v.status] += 1
                outcome.lines.append(self.verdict_line(v, path))
        outcome.lines.append(
            (
                f'{sum(counts.values())} result(s): {counts["ok"]} within thresholds, {counts["regression"]} '
                f'regression(s), {counts["improvement"]} improvement(s), {counts["missing"]} without a baseline '
                f'(regression: slower by > {threshold:.0%} and > {min_delta:g} us)',
                {'bold': True},
            )
        )
        if counts['regression']:
            outcome.failures.append(f'{counts["regression"]} regression(s)')
        if counts['missing']:
            outcome.failures.append(
                f'{counts["missing"]} result(s) without a baseline (refresh with --refresh-baseline)'
            )

    def verdict_line(self, v: baseline.Verdict, path: Path) -> tuple[str, dict]:
        r = v.record
        head = f'{v.status.upper() if v.status in ("regression", "missing") else v.status:<12} '
        head += f'{r["kernel"]} {r["operation"]} [{r["params_id"]}] {r["time_us"]:.3f} us'
        if v.baseline is None:
            return f'{head} (no baseline on {r["cluster"]} in {self.relative(path)})', {'red': True}
        b = v.baseline
        text = f'{head} (baseline {b["time_us"]:.3f} us, {v.ratio - 1:+.1%}, {v.delta_us:+.3f} us)'
        if b['timing_backend'] != r['timing_backend']:
            text += f' [timed with {r["timing_backend"]}, baseline with {b["timing_backend"]}]'
        markup = {'regression': {'red': True}, 'improvement': {'green': True}}.get(v.status, {})
        return text, markup

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.outcome is None:
            finished = self.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
            if finished and self.config.getoption('run_benchmark') and not hasattr(self.config, 'workerinput'):
                terminalreporter.write_sep('=', f'benchmark: no benchmark test ran ({self.skipped} skipped)')
            return
        outcome = self.outcome
        terminalreporter.write_sep('=', f'benchmark baselines: {outcome.mode}')
        for text, markup in outcome.lines:
            terminalreporter.write_line(text, **markup)
        if outcome.failures:
            terminalreporter.write_line(f'benchmark {outcome.mode} FAILED:', red=True, bold=True)
            for failure in outcome.failures:
                terminalreporter.write_line(f'  {failure}', red=True)
        else:
            terminalreporter.write_line(f'benchmark {outcome.mode} passed', green=True, bold=True)
