"""Benchmarks and their baselines: `benchmark_timer`, `benchmark_record`, refresh and verify.

- Tests marked `benchmark` are skipped unless --run-benchmark.
- `benchmark_timer(fn)` is the median device time of `fn()` in microseconds (tests/testing/timing.py);
  `benchmark_record(kernel=..., operation=..., params=..., time_us=..., ...)` keeps one record.
- --refresh-baseline rewrites the baseline files (tests/testing/baseline.py) of the tests that ran:
  their records on this cluster are replaced, every other record is kept. Nothing is written
  when any test failed or the run was interrupted.
- Otherwise (verify), each record is compared with its baseline; regressions, missing baselines,
  lost records and corrupt files fail the run, and the terminal summary lists every verdict.

State lives on `config.stash` (a `BenchmarkState`), the hooks are module functions. Under xdist each
worker hands its records, and which benchmark tests it ran, failed and skipped, to the controller
(`workeroutput`); the controller checks that every benchmark test that passed sent its records, then
judges once. The verify summary ends with the geometric mean of the time ratios against the baselines.
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

from cann_ops_pipeline.conventions import (
    BENCHMARK_MARKER,
    DEFAULT_MIN_DELTA_US,
    DEFAULT_REGRESSION_THRESHOLD,
    marker_line,
)
from tests.testing import baseline, host_timing
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


_STATE = pytest.StashKey['BenchmarkState']()
_BACKEND = pytest.StashKey[object]()
_TIMED_WITH = pytest.StashKey[str]()  # on the item: the timing backend of its last benchmark_timer call
_HOST_TIMED = pytest.StashKey[bool]()  # on the item: benchmark_host_timer ran


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
    config.addinivalue_line('markers', marker_line(BENCHMARK_MARKER))
    if config.getoption('refresh_baseline') and not config.getoption('run_benchmark'):
        raise pytest.UsageError('--refresh-baseline needs --run-benchmark (benchmark tests are skipped without it)')
    config.stash[_STATE] = BenchmarkState()


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
def benchmark_host_timer(request: pytest.FixtureRequest) -> Callable[[Callable[[], object]], float]:
    """`benchmark_host_timer(fn) -> float`: the host-inclusive wall time per call of `fn()` in microseconds
    (tests/testing/host_timing.py), recorded under an operation ending in '_host' (e.g. 'fwd_host') with
    timing backend 'host', next to the device record. A backend may time it itself (`host_time_us(fn)`);
    the default synchronises the accelerator at the end of each round. Skipped without an accelerator."""
    backend = get_backend(request.config)
    item = request.node

    def timer(fn: Callable[[], object]) -> float:
        if not callable(fn):
            raise TypeError(f'benchmark_host_timer expects a function to call, got {type(fn).__name__}')
        try:
            own = getattr(backend, 'host_time_us', None)
            time_us = own(fn) if own is not None else _device_host_time_us(backend, fn)
        except NoAcceleratorError as exc:
            pytest.skip(str(exc))
        time_us = baseline.check_time_us(time_us, 'the measured host time')
        item.stash[_HOST_TIMED] = True
        return time_us

    return timer


def _device_host_time_us(backend: DeviceBackend, fn: Callable[[], object]) -> float:
    import torch

    device = backend.device  # NoAcceleratorError without one
    module = torch.npu if backend.backend == 'ascend' else torch.cuda
    return host_timing.host_time_us(fn, lambda: module.synchronize(device))


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
    config = request.config
    backend = get_backend(config)

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
        if isinstance(operation, str) and operation.endswith(host_timing.HOST_OPERATION_SUFFIX):
            if _HOST_TIMED not in item.stash:
                raise RuntimeError(
                    f'benchmark_record: operation={operation!r} is a host record: measure time_us with the '
                    'benchmark_host_timer fixture in this test first'
                )
            timed_with = host_timing.HOST_TIMING_BACKEND
        elif _TIMED_WITH not in item.stash:
            raise RuntimeError('benchmark_record: measure time_us with the benchmark_timer fixture in this test first')
        else:
            timed_with = item.stash[_TIMED_WITH]
        _add(
            config.stash[_STATE],
            baseline.make_record(
                kernel=kernel,
                operation=operation,
                params=params,
                time_us=time_us,
                bandwidth_gbs=bandwidth_gbs,
                extras=extras,
                cluster=backend.cluster(),
                timing_backend=timed_with,
                environment=_environment(config),
                node_id=item.nodeid,
            ),
        )

    return record


@dataclasses.dataclass
class BenchmarkState:
    """This run's benchmark results (on config.stash); outside xdist workers, judged once at the end."""

    records: list[dict] = dataclasses.field(default_factory=list)  # made here, or received from the workers
    ran: set[str] = dataclasses.field(default_factory=set)  # benchmark tests whose call phase ran (every worker)
    failed: set[str] = dataclasses.field(default_factory=set)  # benchmark tests that failed or errored
    skipped: int = 0
    lost_workers: list[str] = dataclasses.field(default_factory=list)
    outcome: _Outcome | None = None
    environment: dict | None = None
    checked_collection: bool = False
    exitstatus: int | None = None


def _environment(config: pytest.Config) -> dict:
    state = config.stash[_STATE]
    if state.environment is None:
        state.environment = dict(get_backend(config).environment())
    return state.environment


def _add(state: BenchmarkState, record: dict) -> None:
    key = baseline.record_key(record)
    for other in state.records:
        if baseline.record_key(other) == key:
            raise ValueError(f'benchmark_record: {baseline.format_key(key)} was already recorded by {other["node_id"]}')
    state.records.append(record)


def _baseline_file(config: pytest.Config, nodeid: str) -> Path:
    return baseline.baseline_path(config.rootpath / nodeid.split('::', 1)[0])


def _test_file(config: pytest.Config, path: Path) -> str:
    """The node ID of the test module whose baseline file `path` is (inverse of _baseline_file)."""
    return Path(os.path.relpath(path.parent.parent / f'{path.stem}.py', config.rootpath)).as_posix()


def _load(config: pytest.Config, path: Path) -> list[dict]:
    return baseline.load_baseline(path, _test_file(config, path))


def _relative(config: pytest.Config, path: Path) -> str:
    return os.path.relpath(path, config.rootpath)


def _check_baseline_files(config: pytest.Config, nodeids) -> str | None:
    """Why a baseline file of these tests cannot be read, or None."""
    for path in sorted({_baseline_file(config, nodeid) for nodeid in nodeids}):
        try:
            _load(config, path)
        except CorruptFileError as exc:
            return f'corrupt baseline file {exc}'
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail fast on a corrupt baseline file, before any benchmark runs (xdist: the controller checks)."""
    config = session.config
    if not config.getoption('run_benchmark') or hasattr(config, 'workerinput'):
        return
    problem = _check_baseline_files(
        config, (item.nodeid for item in session.items if item.get_closest_marker('benchmark'))
    )
    if problem:
        raise pytest.UsageError(problem)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """xdist controller: the same check once a worker has collected (a UsageError would be lost there)."""
    config = node.config
    state = config.stash[_STATE]
    if not config.getoption('run_benchmark') or state.checked_collection:
        return
    state.checked_collection = True
    problem = _check_baseline_files(config, ids)
    if problem:
        pytest.exit(problem, returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Note which benchmark tests ran, failed or were skipped (xdist: each worker, for the controller)."""
    report = yield
    if item.get_closest_marker('benchmark') is not None:
        state = item.config.stash[_STATE]
        if report.when == 'call' and not report.skipped:
            state.ran.add(item.nodeid)
        if report.failed:
            state.failed.add(item.nodeid)
        elif report.skipped:
            state.skipped += 1
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: a worker finished; take the records it handed over."""
    config = node.config
    state = config.stash[_STATE]
    output = getattr(node, 'workeroutput', None) or {}
    if _WORKEROUTPUT_KEY in output:
        wire = json.loads(output[_WORKEROUTPUT_KEY])
        state.records.extend(wire['records'])
        state.ran.update(wire['ran'])
        state.failed.update(wire['failed'])
        state.skipped += wire['skipped']
    elif config.getoption('run_benchmark'):
        state.lost_workers.append(f'{node.gateway.id} ({error or "no output"})')


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config.stash[_STATE]
    state.exitstatus = exitstatus
    if hasattr(config, 'workerinput'):  # an xdist worker: the controller judges
        wire = {'records': state.records, 'ran': sorted(state.ran), 'failed': sorted(state.failed)}
        config.workeroutput[_WORKEROUTPUT_KEY] = json.dumps({**wire, 'skipped': state.skipped})
        return
    if not (state.ran or state.records or state.lost_workers):  # no benchmark ran: nothing to judge
        return
    state.outcome = _judge(config, state, exitstatus)
    if state.outcome.failures and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _judge(config: pytest.Config, state: BenchmarkState, exitstatus: int) -> _Outcome:
    refresh = config.getoption('refresh_baseline')
    outcome = _Outcome('refresh' if refresh else 'verify')
    recorded = {r['node_id'] for r in state.records}
    if state.lost_workers:  # what those workers ran is unknown
        outcome.failures.append(f'lost the benchmark records of xdist worker(s) {", ".join(state.lost_workers)}')
    silent = sorted(state.ran - state.failed - recorded)
    if silent:
        outcome.failures.append(
            f'{len(silent)} benchmark test(s) passed but none of their records arrived: {", ".join(silent)}'
        )
    for key, nodes in baseline.duplicate_keys(state.records).items():
        outcome.failures.append(f'{baseline.format_key(key)} recorded more than once, by {", ".join(nodes)}')
    files = sorted({_baseline_file(config, nodeid) for nodeid in state.ran | recorded})
    try:
        old = {path: _load(config, path) for path in files}
    except CorruptFileError as exc:
        outcome.failures.append(f'corrupt baseline file {exc}')
        return outcome
    new = {path: [r for r in state.records if _baseline_file(config, r['node_id']) == path] for path in files}
    if refresh:
        final = _refresh(config, state, outcome, old, new, exitstatus)
    else:
        final = old
        _verify(config, outcome, old, new)
    public = get_backend(config).public_operators()
    for path, records in final.items():
        for r in baseline.stale_records(records, public):
            outcome.lines.append(
                (
                    f'STALE        {baseline.format_key(baseline.record_key(r))} in {_relative(config, path)}: '
                    f'{r["kernel"]!r} is not a public operator of cann_ops_tilelang',
                    {'yellow': True},
                )
            )
    return outcome


def _refresh(
    config: pytest.Config, state: BenchmarkState, outcome: _Outcome, old: dict, new: dict, exitstatus: int
) -> dict:
    reasons = ['the problems below'] if outcome.failures else []
    if state.failed:
        reasons.append(f'{len(state.failed)} benchmark test(s) failed')
    if exitstatus != pytest.ExitCode.OK:
        reasons.append(f'the run ended with {pytest.ExitCode(exitstatus).name}')
    if reasons:
        outcome.failures.append(f'baseline files left unchanged: {"; ".join(reasons)}')
        return old
    final = {}
    for path, records in old.items():
        merged = baseline.merge_refresh(records, new[path], state.ran)
        final[path] = merged
        text = baseline.dumps_baseline(merged)
        if merged and (not path.exists() or path.read_text(encoding='utf-8') != text):
            atomic_write_text(path, text)
        clusters = ', '.join(sorted({r['cluster'] for r in new[path]})) or '-'
        outcome.lines.append(
            (
                f'{_relative(config, path)}: {len(new[path])} record(s) written for {clusters}, '
                f'{len(records) - (len(merged) - len(new[path]))} replaced, '
                f'{len(merged) - len(new[path])} kept',
                {},
            )
        )
    return final


def _verify(config: pytest.Config, outcome: _Outcome, old: dict, new: dict) -> None:
    threshold = config.getoption('benchmark_regression_threshold')
    min_delta = config.getoption('benchmark_min_delta_us')
    counts = dict.fromkeys(('ok', 'regression', 'improvement', 'missing'), 0)
    ratios = []
    for path in old:
        for v in baseline.verify(new[path], old[path], threshold, min_delta):
            counts[v.status] += 1
            outcome.lines.append(_verdict_line(config, v, path))
            if v.ratio is not None:
                ratios.append(v.ratio)
    outcome.lines.append(
        (
            f'{sum(counts.values())} result(s): {counts["ok"]} within thresholds, {counts["regression"]} '
            f'regression(s), {counts["improvement"]} improvement(s), {counts["missing"]} without a baseline '
            f'(regression: slower by > {threshold:.0%} and > {min_delta:g} us; host records by > '
            f'{max(threshold, host_timing.HOST_REGRESSION_THRESHOLD_FLOOR):.0%} and > '
            f'{max(min_delta, host_timing.HOST_MIN_DELTA_US_FLOOR):g} us)',
            {'bold': True},
        )
    )
    if ratios:
        outcome.lines.append((baseline.format_geomean(ratios), {'bold': True}))
    if counts['regression']:
        outcome.failures.append(f'{counts["regression"]} regression(s)')
    if counts['missing']:
        outcome.failures.append(f'{counts["missing"]} result(s) without a baseline (refresh with --refresh-baseline)')


def _verdict_line(config: pytest.Config, v: baseline.Verdict, path: Path) -> tuple[str, dict]:
    r = v.record
    head = f'{v.status.upper() if v.status in ("regression", "missing") else v.status:<12} '
    head += f'{r["kernel"]} {r["operation"]} [{r["params_id"]}] {r["time_us"]:.3f} us'
    if v.baseline is None:
        return f'{head} (no baseline on {r["cluster"]} in {_relative(config, path)})', {'red': True}
    b = v.baseline
    text = f'{head} (baseline {b["time_us"]:.3f} us, {v.ratio - 1:+.1%}, {v.delta_us:+.3f} us)'
    if b['timing_backend'] != r['timing_backend']:
        text += f' [timed with {r["timing_backend"]}, baseline with {b["timing_backend"]}]'
    markup = {'regression': {'red': True}, 'improvement': {'green': True}}.get(v.status, {})
    return text, markup


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    if state.outcome is None:
        finished = state.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
        if finished and config.getoption('run_benchmark') and not hasattr(config, 'workerinput'):
            terminalreporter.write_sep('=', f'benchmark: no benchmark test ran ({state.skipped} skipped)')
        return
    outcome = state.outcome
    terminalreporter.write_sep('=', f'benchmark baselines: {outcome.mode}')
    for text, markup in outcome.lines:
        terminalreporter.write_line(text, **markup)
    if outcome.failures:
        terminalreporter.write_line(f'benchmark {outcome.mode} FAILED:', red=True, bold=True)
        for failure in outcome.failures:
            terminalreporter.write_line(f'  {failure}', red=True)
    else:
        terminalreporter.write_line(f'benchmark {outcome.mode} passed', green=True, bold=True)
