"""Device memory profiles: `--refresh-mem` measures the device tests; collection marks `large_npu_mem`.

Every device test (`npu` marker) whose profile record is missing, or whose `peak_mb` exceeds
`--npu-mem-threshold`, gets the `large_npu_mem` marker before `-m` is applied, so the two-phase run
(`cann_ops_pipeline.two_phase`) can send it to the narrow phase. The marking depends only on the
profile files and the options, so every xdist worker marks alike.

With `--refresh-mem` each device test that passes is measured between the start of its setup and
the end of its call by the meter of the `pytest_npu_mem_meter` hook (torch.npu / torch.cuda by
default; tests fake it on a CPU). xdist workers send their records through `workeroutput`; the
controller (or the single process) merges them at session finish and writes each profile once,
atomically (tests/testing/mem_profiles.py). An interrupted run writes nothing.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
from pathlib import Path
from typing import Protocol

import pytest

from cann_ops_pipeline.conventions import (
    DEFAULT_NPU_MEM_THRESHOLD_MB,
    LARGE_MARKER,
    NPU_MEM_THRESHOLD_OPTION,
    TEST_LEVELS,
    marker_line,
    test_level_from_env,
)
from tests.testing.files import CorruptFileError
from tests.testing.mem_profiles import load_profile, make_record, profile_path, update_records, write_profile
from tests.testing.plugins.device_binding import workers_sharing_device

WORKEROUTPUT_KEY = 'ops_tilelang_npu_mem'
NOT_WRITTEN = {
    pytest.ExitCode.INTERRUPTED: 'interrupted',
    pytest.ExitCode.INTERNAL_ERROR: 'stopped by an internal error',
    pytest.ExitCode.USAGE_ERROR: 'stopped by a usage error',
}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What a meter saw over one test, in bytes; `outside_allocator_bytes` None when not measurable."""

    allocated_peak_bytes: int
    reserved_peak_bytes: int
    outside_allocator_bytes: int | None
    method: str
    device: str


class Meter(Protocol):
    def start(self, item: pytest.Item) -> None: ...

    def stop(self, item: pytest.Item) -> Measurement: ...


class NpuMemHookspecs:
    @pytest.hookspec(firstresult=True)
    def pytest_npu_mem_meter(self, config: pytest.Config) -> Meter | None:
        """The device memory meter for --refresh-mem, asked once per process; None: nothing to measure."""


@dataclasses.dataclass
class FileSeen:
    """A collected test module with a profile: its node ID, its device node IDs, whether collected whole."""

    test_file: str
    node_ids: set[str]
    whole: bool

    def to_wire(self) -> dict:
        return {'test_file': self.test_file, 'node_ids': sorted(self.node_ids), 'whole': self.whole}

    def merge(self, other: FileSeen) -> None:
        self.node_ids |= other.node_ids
        self.whole = self.whole and other.whole


@dataclasses.dataclass
class ProfileState:
    profiles: dict[Path, dict[str, dict]] = dataclasses.field(default_factory=dict)  # loaded at collection
    files: dict[str, FileSeen] = dataclasses.field(default_factory=dict)  # by profile path
    measured: dict[str, dict[str, dict]] = dataclasses.field(default_factory=dict)  # profile path -> node ID
    meter: Meter | None = None
    meter_asked: bool = False
    metered: bool = False  # some process had a meter
    summary: list[str] = dataclasses.field(default_factory=list)


state_key = pytest.StashKey[ProfileState]()
started_key = pytest.StashKey[bool]()
measurement_key = pytest.StashKey[Measurement]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(NpuMemHookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup('cann_ops_tilelang')
    group.addoption(
        '--refresh-mem',
        action='store_true',
        help='measure the peak device memory of the device tests that run and pass, and rewrite their '
        'records in tests/<domain>/npu_mem_profiles/',
    )
    group.addoption(
        '--refresh-mem-missing-only',
        action='store_true',
        help='with --refresh-mem: run and measure only the device tests without a record (those with one are '
        'deselected); existing records stay as they are',
    )
    group.addoption(
        NPU_MEM_THRESHOLD_OPTION,
        type=float,
        default=DEFAULT_NPU_MEM_THRESHOLD_MB,
        metavar='MB',
        help='device tests whose profiled peak exceeds MB (MiB), or that have no profile, are marked '
        f'large_npu_mem (default {DEFAULT_NPU_MEM_THRESHOLD_MB:g})',
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line('markers', marker_line(LARGE_MARKER))
    if config.getoption('refresh_mem_missing_only') and not config.getoption('refresh_mem'):
        raise pytest.UsageError('--refresh-mem-missing-only only works together with --refresh-mem')
    threshold = config.getoption('npu_mem_threshold')
    if not math.isfinite(threshold) or threshold < 0:
        raise pytest.UsageError(f'--npu-mem-threshold must be a number of MB >= 0, got {threshold}')
    config.stash[state_key] = ProfileState()


def _records(config: pytest.Config, test_path: Path, test_file: str) -> dict[str, dict]:
    """The records of a test module's profile, loaded and validated once per process."""
    profiles = config.stash[state_key].profiles
    path = profile_path(test_path)
    if path not in profiles:
        profiles[path] = load_profile(path, test_file)
    return profiles[path]


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A corrupt profile is a collection error of its test module (reported alike under xdist)."""
    report = yield
    if report.passed and isinstance(collector, pytest.Module):
        try:
            _records(collector.config, collector.path, collector.nodeid)
        except CorruptFileError as exc:
            longrepr = f'{exc}\nFix the file, or delete it and re-measure with --refresh-mem.'
            return pytest.CollectReport(collector.nodeid, 'failed', longrepr=longrepr, result=[])
    return report


def _narrowed_paths(config: pytest.Config) -> set[Path]:
    """Test files that a node-ID argument (`path::name`) narrowed: the run did not collect them whole."""
    base = config.invocation_params.dir
    return {(base / arg.partition('::')[0]).resolve() for arg in config.args if '::' in arg}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark before -m/-k/--deselect apply, and note which device node IDs each module has."""
    state = config.stash[state_key]
    threshold = config.getoption('npu_mem_threshold')
    narrowed = _narrowed_paths(config)
    missing_only = config.getoption('refresh_mem_missing_only')
    profiled: list[pytest.Item] = []
    for item in items:
        device = item.get_closest_marker('npu') is not None
        test_file = item.nodeid.split('::', 1)[0]
        try:
            records = _records(config, item.path, test_file)
        except CorruptFileError as exc:
            raise pytest.UsageError(str(exc)) from None
        if not device and not records:
            continue
        whole = not config.option.pyargs and item.path.resolve() not in narrowed
        seen = state.files.setdefault(str(profile_path(item.path)), FileSeen(test_file, set(), whole))
        if not device:
            continue
        seen.node_ids.add(item.nodeid)
        record = records.get(item.nodeid)
        if record is None or record['peak_mb'] > threshold:
            item.add_marker(LARGE_MARKER)
        if missing_only and record is not None:
            profiled.append(item)
    if profiled:  # --refresh-mem-missing-only: a device test that has its record has nothing to measure
        config.hook.pytest_deselected(items=profiled)
        drop = set(map(id, profiled))
        items[:] = [item for item in items if id(item) not in drop]


def _meter(config: pytest.Config) -> Meter | None:
    state = config.stash[state_key]
    if not state.meter_asked:
        state.meter_asked = True
        state.meter = config.hook.pytest_npu_mem_meter(config=config)
        state.metered = state.meter is not None
    return state.meter


def _wants_measurement(item: pytest.Item) -> bool:
    config = item.config
    if not config.getoption('refresh_mem') or item.get_closest_marker('npu') is None:
        return False
    if config.getoption('refresh_mem_missing_only'):
        return item.nodeid not in _records(config, item.path, item.nodeid.split('::', 1)[0])
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _wants_measurement(item) and (meter := _meter(item.config)) is not None:
        meter.start(item)
        item.stash[started_key] = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield  # a failing test raises here: nothing is measured
    if item.stash.get(started_key, False):
        item.stash[measurement_key] = _meter(item.config).stop(item)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Keep a measurement only if the call passed and the teardown passed."""
    report = yield
    if measurement_key in item.stash and (report.when == 'teardown' or not report.passed):
        measurement = item.stash[measurement_key]
        del item.stash[measurement_key]
        if report.when == 'teardown' and report.passed:
            _commit(item, measurement)
    return report


def _commit(item: pytest.Item, measurement: Measurement) -> None:
    config = item.config
    exclusive = workers_sharing_device(config) == 1  # else other workers' memory shows in mem_get_info
    record = make_record(
        allocated_bytes=measurement.allocated_peak_bytes,
        reserved_bytes=measurement.reserved_peak_bytes,
        outside_allocator_bytes=measurement.outside_allocator_bytes if exclusive else None,
        method=measurement.method,
        device=measurement.device,
    )
    measured = config.stash[state_key].measured
    measured.setdefault(str(profile_path(item.path)), {})[item.nodeid] = record


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """Controller: merge what a worker saw and measured."""
    wire = getattr(node, 'workeroutput', {}).get(WORKEROUTPUT_KEY)
    if wire is None:
        return
    state = node.config.stash[state_key]
    for path, data in wire['files'].items():
        seen = FileSeen(data['test_file'], set(data['node_ids']), data['whole'])
        if path in state.files:
            state.files[path].merge(seen)
        else:
            state.files[path] = seen
    for path, records in wire['measured'].items():
        state.measured.setdefault(path, {}).update(records)
    state.metered = state.metered or wire['metered']


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config.stash.get(state_key, None)
    if state is None:
        return
    if hasattr(config, 'workerinput'):
        config.workeroutput[WORKEROUTPUT_KEY] = {
            'files': {path: seen.to_wire() for path, seen in state.files.items()},
            'measured': state.measured,
            'metered': state.metered,
        }
    elif config.getoption('refresh_mem'):
        _write_profiles(config, state, exitstatus)


def _full_level() -> bool:
    """Only the full level collects every parameter set, so only it can tell a node ID is gone."""
    try:
        return test_level_from_env() == max(TEST_LEVELS)
    except ValueError:
        return False


def _write_profiles(config: pytest.Config, state: ProfileState, exitstatus: int) -> None:
    if exitstatus in NOT_WRITTEN or config.option.collectonly:
        why = NOT_WRITTEN.get(exitstatus, 'collect-only')
        state.summary.append(f'no profile written: the run was {why}; the previous files are unchanged')
        return
    if state.files and not state.metered:
        state.summary.append('nothing measured: no device memory meter here (no accelerator?)')
    missing_only = config.getoption('refresh_mem_missing_only')
    full_level = _full_level()
    for path in sorted(set(state.files) | set(state.measured)):
        measured = state.measured.get(path, {})
        seen = state.files.get(path)
        test_file = seen.test_file if seen else next(iter(measured)).split('::', 1)[0]
        update = update_records(
            load_profile(path, test_file),
            measured,
            collected=seen.node_ids if seen is not None and seen.whole else None,  # None: unknown
            missing_only=missing_only,
            prune=not missing_only and full_level,
        )
        outcome = write_profile(path, test_file, update.records)
        if outcome == 'absent':
            continue
        shown = os.path.relpath(path, config.rootpath)
        counts = f'{len(update.added)} added, {len(update.updated)} changed, {len(update.removed)} removed'
        state.summary.append(f'{shown}: {outcome} ({counts})')
        if update.stale:
            state.summary.append(
                f'{shown}: {len(update.stale)} stale record(s) kept, their node IDs were not collected '
                '(a --refresh-mem run of the whole file at OPS_TILELANG_TEST_LEVEL=2 removes them):'
            )
            state.summary.extend(f'    {nodeid}' for nodeid in update.stale)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    state = config.stash.get(state_key, None)
    if state is not None and state.summary:
        terminalreporter.section('npu memory profiles')
        for line in state.summary:
            terminalreporter.write_line(line)


class TorchMeter:
    """torch's caching allocator peaks, plus device memory taken outside the allocator (mem_get_info).

    start() frees the cache first, so memory cached by earlier tests is not counted again. The
    outside-allocator figure is the growth of used device memory at the end of the call minus the
    growth of the allocator's reserved memory (library workspaces, loaded kernels): a sample, not a peak.
    """

    def __init__(self, api, name: str):
        self._api = api  # torch.cuda or torch.npu
        self.method = f'{name}.max_memory_allocated/max_memory_reserved + {name}.mem_get_info'
        self._used0 = self._reserved0 = 0

    def _used(self) -> int:
        free, total = self._api.mem_get_info()
        return total - free

    def start(self, item: pytest.Item) -> None:
        gc.collect()
        self._api.synchronize()
        self._api.empty_cache()
        self._api.reset_peak_memory_stats()
        self._used0, self._reserved0 = self._used(), self._api.memory_reserved()

    def stop(self, item: pytest.Item) -> Measurement:
        self._api.synchronize()
        outside = (self._used() - self._used0) - (self._api.memory_reserved() - self._reserved0)
        return Measurement(
            allocated_peak_bytes=self._api.max_memory_allocated(),
            reserved_peak_bytes=self._api.max_memory_reserved(),
            outside_allocator_bytes=max(0, outside),
            method=self.method,
            device=self._api.get_device_name(),
        )


@pytest.hookimpl(trylast=True)
def pytest_npu_mem_meter(config: pytest.Config) -> Meter | None:
    """Default meter: the current NPU (torch_npu) or GPU, after any xdist device binding."""
    import torch

    from cann_ops_tilelang import config as runtime

    if runtime.is_ascend_available():
        return TorchMeter(torch.npu, 'torch.npu')
    if runtime.is_cuda_available():
        return TorchMeter(torch.cuda, 'torch.cuda')
    return None
