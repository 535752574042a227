"""The benchmark plugin: timing fixtures, baseline files, refresh-then-verify, the regression report.

The pytester runs inject a fake backend through the `pytest_benchmark_backend` hook: its timer
returns whatever the timed function returns (so each test file states its own times), its
cluster and public operators are set per scenario.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from tests.testing import baseline, timing
from tests.testing.files import CorruptFileError
from tests.testing.timing import cluster_name

pytest_plugins = ['pytester']

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
import pytest

pytest_plugins = ['tests.testing.plugins.benchmark']


class FakeBackend:
    def time_us(self, fn):
        return float(fn()), 'fake-timer'

    def cluster(self):
        return {cluster!r}

    def environment(self):
        return {{'device': 'Fake Device', 'torch': torch_version()}}

    def public_operators(self):
        return frozenset({operators!r})


def torch_version():
    import torch
    return torch.__version__


def pytest_benchmark_backend(config):
    return FakeBackend()
"""

TEST_FILE = """
import pytest

from tests.testing.bench import make_param_id

TIMES = {times!r}


@pytest.mark.benchmark
@pytest.mark.parametrize('params', [{{'hidden': h, 'hc': 4}} for h in (4096, 7168)], ids=make_param_id)
def test_op_a_benchmark(benchmark_timer, benchmark_record, params):
    time_us = benchmark_timer(lambda: TIMES['op_a', params['hidden']])
    benchmark_record(kernel='op_a', operation='fwd', params=params, time_us=time_us, bandwidth_gbs=2.5)


@pytest.mark.benchmark
@pytest.mark.parametrize('params', [{{'hidden': 4096, 'dtype': d}} for d in ('bf16', 'fp32')], ids=make_param_id)
def test_op_b_benchmark(benchmark_timer, benchmark_record, params):
    time_us = benchmark_timer(lambda: TIMES['op_b', params['dtype']])
    benchmark_record(kernel='op_b', operation='bwd', params=params, time_us=time_us, extras={{'note': 'x'}})


def test_not_a_benchmark():
    pass
"""

BASE_TIMES = {('op_a', 4096): 100.0, ('op_a', 7168): 200.0, ('op_b', 'bf16'): 10.0, ('op_b', 'fp32'): 20.0}
# Off in these inner runs, each costs ~0.5-1.5 s a run: unraisableexception's gc.collect() with torch
# loaded, and hypothesis' plugin re-importing hypothesis (pytester unloads what a run imported).
QUIET = ('-p', 'no:cacheprovider', '-p', 'no:unraisableexception', '-p', 'no:hypothesispytest')
RUN = (*QUIET, '--run-benchmark')


def setup_project(pytester: pytest.Pytester, times=BASE_TIMES, cluster='fake1', operators=('op_a', 'op_b')) -> Path:
    """The fake project; returns its baseline file."""
    pytester.makeconftest(CONFTEST.format(cluster=cluster, operators=tuple(operators)))
    pytester.makepyfile(test_ops=TEST_FILE.format(times=times))
    return pytester.path / 'benchmark' / 'test_ops.jsonl'


def with_times(**changes) -> dict:
    times = dict(BASE_TIMES)
    for name, value in changes.items():
        op, arg = name.split('_', 1)
        times[f'op_{op}', int(arg) if arg.isdigit() else arg] = value
    return times


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def project(pytester: pytest.Pytester) -> Path:
    """A project whose baseline (cluster fake1) holds BASE_TIMES."""
    path = setup_project(pytester)
    pytester.runpytest(*RUN, '--refresh-baseline').assert_outcomes(passed=5)
    return path


# --- pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ('backend', 'device_name', 'cluster'),
    [
        ('ascend', 'Ascend950PR', 'a5'),
        ('ascend', 'Ascend950DT', 'a5'),
        ('ascend', 'Ascend910B3', 'ascend910b3'),
        ('cuda', 'NVIDIA H200', 'h200'),
        ('cuda', 'NVIDIA H100 80GB HBM3', 'h100'),
        ('cuda', 'NVIDIA A100-SXM4-80GB', 'a100'),
        ('cuda', 'NVIDIA GeForce RTX 4090', 'rtx4090'),
        ('cuda', 'Tesla V100-SXM2-32GB', 'v100'),
    ],
)
def test_cluster_name(backend, device_name, cluster):
    assert cluster_name(backend, device_name) == cluster


@pytest.mark.parametrize(
    ('time_us', 'baseline_us', 'verdict'),
    [
        (100.0, 100.0, 'ok'),
        (111.0, 100.0, 'regression'),  # +11 % and +11 us
        (110.5, 100.0, 'regression'),  # +10.5 % and +10.5 us
        (110.0, 100.0, 'ok'),  # exactly +10 %: not above the threshold
        (1.5, 1.0, 'ok'),  # +50 % but +0.5 us: below the minimum delta
        (2.1, 1.0, 'regression'),  # +110 % and +1.1 us
        (105.0, 100.0, 'ok'),  # +5 us but +5 %: below the threshold
        (89.0, 100.0, 'improvement'),  # -11 % and -11 us
        (0.5, 1.0, 'ok'),  # -50 % but -0.5 us
        (95.0, 100.0, 'ok'),  # -5 us but -5 %
    ],
)
def test_judge_needs_both_thresholds(time_us, baseline_us, verdict):
    assert baseline.judge(time_us, baseline_us, threshold=0.10, min_delta_us=1.0) == verdict


@pytest.mark.parametrize(
    ('timing_backend', 'time_us', 'verdict'),
    [
        ('cupti', 27.7 * 1.2, 'regression'),  # a device record: the run's 10 % / 1 us
        ('host', 49.0, 'ok'),  # +77 %: the spread of one H200 host record between a refresh and its verify
        ('host', 27.7 + 200.0, 'regression'),  # the planted 200 us slowdown
        ('host', 1.0 + 9.0, 'ok'),  # +900 % but +9 us: below the host records' 10 us
        ('host', 5.0, 'ok'),  # a 100 % threshold reports no improvement (refresh to take one in)
    ],
)
def test_host_records_are_judged_with_the_host_floors(timing_backend, time_us, verdict):
    base = 1.0 if time_us == 10.0 else 27.7
    old = {**make(time_us=base), 'timing_backend': timing_backend}
    new = {**make(time_us=time_us), 'timing_backend': timing_backend}
    (result,) = baseline.verify([new], [old], threshold=0.10, min_delta_us=1.0)
    assert result.status == verdict


def make(kernel='op_a', cluster='fake1', hidden=4096, time_us=10.0, node='t.py::test[x]') -> dict:
    return baseline.make_record(
        kernel=kernel,
        operation='fwd',
        params={'hidden': hidden, 'dtype': torch.bfloat16, 'shape': (2, 3)},
        time_us=time_us,
        bandwidth_gbs=None,
        extras=None,
        cluster=cluster,
        timing_backend='cupti',
        environment={'device': 'X', 'cann': None},
        node_id=node,
    )


def test_record_is_json_safe_and_keyed_by_param_id():
    record = make()
    assert record['params'] == {'hidden': 4096, 'dtype': 'bf16', 'shape': [2, 3]}
    assert record['params_id'] == 'hidden=4096-dtype=bf16-shape=2x3'
    assert baseline.record_key(record) == ('op_a', 'fwd', 'hidden=4096-dtype=bf16-shape=2x3', 'fake1')
    assert list(record) == list(baseline.FIELDS)


@pytest.mark.parametrize('time_us', [0, -1.0, float('nan'), float('inf'), True, '10'])
def test_record_rejects_bad_times(time_us):
    with pytest.raises(ValueError, match='time_us must be a finite number'):
        make(time_us=time_us)


def test_file_text_is_sorted_and_round_trips(tmp_path):
    records = [make('op_b'), make('op_a', hidden=8192), make('op_a', cluster='a5'), make('op_a')]
    text = baseline.dumps_baseline(records)
    assert text == baseline.dumps_baseline(reversed(records))
    path = tmp_path / 'b.jsonl'
    path.write_text(text)
    loaded = baseline.load_baseline(path)
    assert [baseline.record_key(r) for r in loaded] == sorted(baseline.record_key(r) for r in records)
    assert baseline.dumps_baseline(loaded) == text


def test_merge_refresh_replaces_only_this_clusters_records_of_tests_that_ran():
    old = [
        make(hidden=1, node='t.py::ran[1]', time_us=1.0),  # replaced by the same key
        make(hidden=2, node='t.py::ran[2]', time_us=2.0),  # its test ran but no longer records it: dropped
        make(hidden=3, node='t.py::not_run[3]', time_us=3.0),  # test did not run: kept
        make(hidden=1, node='t.py::ran[1]', cluster='a5', time_us=4.0),  # other cluster: kept
    ]
    new = [make(hidden=1, node='t.py::ran[1]', time_us=9.0)]
    merged = baseline.merge_refresh(old, new, ran_node_ids={'t.py::ran[1]', 't.py::ran[2]'})
    assert sorted((r['cluster'], r['params']['hidden'], r['time_us']) for r in merged) == [
        ('a5', 1, 4.0),
        ('fake1', 1, 9.0),
        ('fake1', 3, 3.0),
    ]


GOOD_LINE = json.dumps(make())


@pytest.mark.parametrize(
    ('line', 'problem'),
    [
        ('{"kernel": ', 'line 2: Expecting value'),
        ('[1, 2]', 'line 2: a record must be a JSON object'),
        (json.dumps({k: v for k, v in make().items() if k != 'time_us'}), 'line 2: missing field(s) time_us'),
        (json.dumps({**make(), 'time_us': '10'}), 'line 2: time_us must be a finite number'),
        (json.dumps({**make(), 'kernel': 3}), 'line 2: kernel must be a non-empty string'),
        (json.dumps({**make(), 'params': [1]}), 'line 2: params must be an object'),
        (json.dumps({**make(), 'extra': 1}), 'line 2: unknown field(s) extra'),
        (json.dumps({**make(), 'params_id': 'hidden=1'}), "line 2: params_id 'hidden=1' does not match params"),
        (GOOD_LINE.replace('10.0', 'NaN'), 'line 2: NaN is not a finite number'),
        (GOOD_LINE, 'line 2: duplicate of line 1'),
    ],
    ids=[
        'bad-json',
        'not-object',
        'missing',
        'str-time',
        'int-kernel',
        'list-params',
        'unknown',
        'bad-id',
        'nan',
        'dup',
    ],
)
def test_corrupt_file_names_file_and_line(tmp_path, line, problem):
    path = tmp_path / 'test_x.jsonl'
    path.write_text(GOOD_LINE + '\n' + line + '\n')
    with pytest.raises(CorruptFileError, match=re.escape(problem)) as info:
        baseline.load_baseline(path)
    assert str(info.value).startswith(f'{path}: line 2: ')


def fake_device_backend(monkeypatch, backend: str, bench_ms) -> timing.DeviceBackend:
    """A DeviceBackend on a pretend device whose do_bench is `bench_ms(fn, timer)`."""
    device = timing.DeviceBackend()
    device.backend = backend  # cached properties: set, they are never queried
    device.device = torch.device('cuda', 0)  # only its index is read (no 'npu' device type without torch_npu)
    monkeypatch.setattr(device, '_bench_ms', bench_ms)
    monkeypatch.setattr(torch.profiler, 'supported_activities', lambda: {torch.profiler.ProfilerActivity.CUDA})
    return device


def test_timer_is_the_median_of_the_rounds_in_microseconds(monkeypatch):
    times = iter([0.003, 0.001, 0.002])
    calls = []
    device = fake_device_backend(monkeypatch, 'ascend', lambda fn, timer: calls.append(timer) or next(times))
    assert device.time_us(lambda: None) == (pytest.approx(2.0), 'msprof')
    assert calls == ['msprof'] * timing.ROUNDS


@pytest.mark.parametrize('cupti', ['raises', 'zero'])
def test_cuda_timer_falls_back_to_events_once_when_cupti_fails(monkeypatch, cupti):
    calls = []

    def bench_ms(fn, timer):
        calls.append(timer)
        if timer == 'cupti':
            if cupti == 'raises':
                raise RuntimeError('CUPTI_ERROR_INSUFFICIENT_PRIVILEGES')
            return 0.0
        return 0.01

    device = fake_device_backend(monkeypatch, 'cuda', bench_ms)
    with pytest.warns(UserWarning, match='benchmarks use CUDA events'):
        assert device.time_us(lambda: None) == (pytest.approx(10.0), 'event')
    assert device.time_us(lambda: None) == (pytest.approx(10.0), 'event')
    assert calls == ['cupti'] + ['event'] * (2 * timing.ROUNDS)  # probed once


def test_cuda_timer_keeps_cupti_when_it_works(monkeypatch):
    calls = []
    device = fake_device_backend(monkeypatch, 'cuda', lambda fn, timer: calls.append(timer) or 0.005)
    assert device.time_us(lambda: None) == (pytest.approx(5.0), 'cupti')
    assert calls == ['cupti'] * (1 + timing.ROUNDS)


def test_timer_refuses_an_empty_measurement(monkeypatch):
    device = fake_device_backend(monkeypatch, 'ascend', lambda fn, timer: 0.0)
    with pytest.raises(RuntimeError, match="do_bench\\(backend='msprof'\\) measured 0.0 us"):
        device.time_us(lambda: None)


def test_no_accelerator_is_an_error_not_a_cpu_timing():
    if torch.cuda.is_available():
        pytest.skip('this machine has an accelerator')
    with pytest.raises(timing.NoAcceleratorError, match='never the CPU: needs an accelerator'):
        timing.DeviceBackend().time_us(lambda: None)


def test_baseline_path_sits_beside_the_test_file():
    assert baseline.baseline_path('tests/engram/test_x.py') == Path('tests/engram/benchmark/test_x.jsonl')


# --- the plugin in pytest runs ------------------------------------------------------------------


def test_benchmarks_are_skipped_without_run_benchmark(pytester):
    path = setup_project(pytester)
    result = pytester.runpytest(*QUIET, '-rs')
    result.assert_outcomes(passed=1, skipped=4)
    result.stdout.fnmatch_lines(['SKIPPED [[]2[]] test_ops.py:*: benchmark test: pass --run-benchmark to run it'] * 2)
    result.stdout.no_fnmatch_line('*benchmark baselines*')
    assert not path.exists()


def test_refresh_needs_run_benchmark(pytester):
    setup_project(pytester)
    result = pytester.runpytest(*QUIET, '--refresh-baseline')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(['*--refresh-baseline needs --run-benchmark*'])


def test_refresh_writes_sorted_records(pytester, project):
    records = read_records(project)
    assert [(r['kernel'], r['params_id'], r['time_us']) for r in records] == [
        ('op_a', 'hidden=4096-hc=4', 100.0),
        ('op_a', 'hidden=7168-hc=4', 200.0),
        ('op_b', 'hidden=4096-dtype=bf16', 10.0),
        ('op_b', 'hidden=4096-dtype=fp32', 20.0),
    ]
    first = records[0]
    assert first['cluster'] == 'fake1'
    assert first['timing_backend'] == 'fake-timer'
    assert first['node_id'] == 'test_ops.py::test_op_a_benchmark[hidden=4096-hc=4]'
    assert first['environment'] == {'device': 'Fake Device', 'torch': torch.__version__}
    assert first['bandwidth_gbs'] == 2.5
    assert records[2]['extras'] == {'note': 'x'}
    assert not list(project.parent.glob('.*.tmp'))  # the atomic write left no temporary file


def test_verify_after_refresh_matches_every_record(pytester, project):
    before = project.read_text()
    result = pytester.runpytest(*RUN)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            '*benchmark baselines: verify*',
            'ok * op_a fwd [[]hidden=4096-hc=4[]] 100.000 us (baseline 100.000 us, +0.0%, +0.000 us)',
            '4 result(s): 4 within thresholds, 0 regression(s), 0 improvement(s), 0 without a baseline*',
            'benchmark verify passed',
        ]
    )
    assert project.read_text() == before  # verify never writes


def test_regression_needs_both_thresholds(pytester, project):
    # op_a 4096: +20 %, +20 us -> regression; op_b bf16: +50 % but +0.5 us -> ok;
    # op_a 7168: +4 us but +2 % -> ok; op_b fp32: -25 %, -5 us -> improvement.
    setup_project(pytester, times=with_times(a_4096=120.0, b_bf16=10.5, a_7168=204.0, b_fp32=15.0))
    result = pytester.runpytest(*RUN)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            'REGRESSION * op_a fwd [[]hidden=4096-hc=4[]] 120.000 us (baseline 100.000 us, +20.0%, +20.000 us)',
            'ok * op_a fwd [[]hidden=7168-hc=4[]] 204.000 us (baseline 200.000 us, +2.0%, +4.000 us)',
            'ok * op_b bwd [[]hidden=4096-dtype=bf16[]] 10.500 us (baseline 10.000 us, +5.0%, +0.500 us)',
            'improvement * op_b bwd [[]hidden=4096-dtype=fp32[]] 15.000 us (baseline 20.000 us, -25.0%, -5.000 us)',
            '4 result(s): 2 within thresholds, 1 regression(s), 1 improvement(s), 0 without a baseline*',
            'benchmark verify FAILED:',
            '  1 regression(s)',
        ]
    )


def test_thresholds_are_options(pytester, project):
    setup_project(pytester, times=with_times(a_4096=120.0))
    result = pytester.runpytest(*RUN, '--benchmark-regression-threshold=0.25')
    assert result.ret == pytest.ExitCode.OK
    result = pytester.runpytest(*RUN, '--benchmark-min-delta-us=30')
    assert result.ret == pytest.ExitCode.OK
    result = pytester.runpytest(*RUN, '--benchmark-min-delta-us=-1')
    assert result.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.parametrize('option', ['--benchmark-regression-threshold', '--benchmark-min-delta-us'])
@pytest.mark.parametrize('value', ['-1', 'abc', 'inf'])
def test_a_bad_threshold_names_its_option(pytester, option, value):
    pytester.makeconftest("pytest_plugins = ['tests.testing.plugins.benchmark']")
    result = pytester.runpytest(*QUIET, f'{option}={value}')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*error: argument {option}: expected a finite number >= 0, got '{value}'"])


def test_geometric_mean_of_the_time_ratios():
    assert baseline.geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    assert baseline.format_geomean([1.2, 1.2]) == 'geometric mean of time / baseline over 2 result(s): 1.200x (+20.0%)'
    with pytest.raises(ValueError, match='positive numbers'):
        baseline.geometric_mean([])


def test_verify_reports_the_geometric_mean_against_the_baselines(pytester, project):
    setup_project(pytester, times=with_times(a_4096=200.0, a_7168=100.0, b_bf16=20.0, b_fp32=10.0))
    result = pytester.runpytest(*RUN)
    result.stdout.fnmatch_lines(['geometric mean of time / baseline over 4 result(s): 1.000x (+0.0%)'])
    setup_project(pytester, times=with_times(a_4096=110.0))
    result = pytester.runpytest(*RUN)
    result.stdout.fnmatch_lines(['geometric mean of time / baseline over 4 result(s): 1.024x (+2.4%)'])


def test_improvement_alone_passes(pytester, project):
    setup_project(pytester, times=with_times(a_7168=100.0))
    result = pytester.runpytest(*RUN)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(['improvement * op_a fwd [[]hidden=7168-hc=4[]] 100.000 us*-50.0%*'])


def test_missing_baseline_fails(pytester, project):
    setup_project(pytester, cluster='fake2')  # a new cluster has no baselines yet
    result = pytester.runpytest(*RUN)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            'MISSING * op_a fwd [[]hidden=4096-hc=4[]] 100.000 us (no baseline on fake2 in benchmark/test_ops.jsonl)',
            '*4 without a baseline*',
            'benchmark verify FAILED:',
            '  4 result(s) without a baseline (refresh with --refresh-baseline)',
        ]
    )


def test_no_baseline_file_at_all_fails(pytester):
    setup_project(pytester)
    result = pytester.runpytest(*RUN)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(['*4 result(s) without a baseline*'])


def test_stale_kernel_is_reported(pytester, project):
    setup_project(pytester, operators=('op_a', 'op_b', 'op_c'))
    records = read_records(project)
    stale = {**records[0], 'kernel': 'op_old'}
    project.write_text(baseline.dumps_baseline([*records, stale]))
    result = pytester.runpytest(*RUN)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            'STALE * op_old fwd [[]hidden=4096-hc=4[]] on fake1 in benchmark/test_ops.jsonl: '
            "'op_old' is not a public operator of cann_ops_tilelang"
        ]
    )


def test_refresh_keeps_other_clusters_and_tests_not_run(pytester, project):
    records = read_records(project)
    other = [{**r, 'cluster': 'a5', 'time_us': 1.0} for r in records]
    project.write_text(baseline.dumps_baseline([*records, *other]))
    setup_project(pytester, times=with_times(a_4096=150.0, b_bf16=11.0))
    result = pytester.runpytest(*RUN, '--refresh-baseline', '-k', 'op_a')
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(['benchmark/test_ops.jsonl: 2 record(s) written for fake1, 2 replaced, 6 kept'])
    after = {(r['cluster'], r['kernel'], r['params_id']): r['time_us'] for r in read_records(project)}
    assert after == {
        ('a5', 'op_a', 'hidden=4096-hc=4'): 1.0,
        ('a5', 'op_a', 'hidden=7168-hc=4'): 1.0,
        ('a5', 'op_b', 'hidden=4096-dtype=bf16'): 1.0,
        ('a5', 'op_b', 'hidden=4096-dtype=fp32'): 1.0,
        ('fake1', 'op_a', 'hidden=4096-hc=4'): 150.0,  # refreshed
        ('fake1', 'op_a', 'hidden=7168-hc=4'): 200.0,
        ('fake1', 'op_b', 'hidden=4096-dtype=bf16'): 10.0,  # op_b did not run: kept
        ('fake1', 'op_b', 'hidden=4096-dtype=fp32'): 20.0,
    }


def test_failed_refresh_leaves_the_file_intact(pytester, project):
    before = project.read_text()
    setup_project(pytester, times=with_times(a_4096=150.0))
    pytester.makepyfile(
        test_ops=TEST_FILE.format(times=with_times(a_4096=150.0))
        + "\n\n@pytest.mark.benchmark\ndef test_broken_benchmark():\n    raise RuntimeError('boom')\n"
    )
    result = pytester.runpytest(*RUN, '--refresh-baseline')
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ['benchmark refresh FAILED:', '  baseline files left unchanged: *1 benchmark test(s) failed*']
    )
    assert project.read_text() == before


def assert_both_modes_refuse(pytester: pytest.Pytester, stderr_line: str) -> None:
    """Verify and refresh both stop with a usage error whose stderr has the line."""
    for args in (RUN, (*RUN, '--refresh-baseline')):
        result = pytester.runpytest(*args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([stderr_line])


def test_corrupt_baseline_is_a_usage_error_naming_file_and_line(pytester, project):
    lines = project.read_text().splitlines()
    lines[2] = lines[2].replace('"time_us": 10.0', '"time_us": "fast"')
    project.write_text('\n'.join(lines) + '\n')
    assert_both_modes_refuse(
        pytester,
        f"*corrupt baseline file {project}: line 3: time_us must be a finite number of microseconds > 0, got 'fast'*",
    )


def test_a_record_of_another_test_file_is_an_error_naming_file_and_line(pytester, project):
    records = read_records(project)
    foreign = {**records[0], 'node_id': records[0]['node_id'].replace('test_ops.py', 'test_other.py'), 'cluster': 'x'}
    project.write_text(project.read_text() + json.dumps(foreign) + '\n')
    assert_both_modes_refuse(
        pytester,
        f"*corrupt baseline file {project}: line 5: node_id 'test_other.py::test_op_a_benchmark*' is not a test of "
        'test_ops.py*',
    )
    with pytest.raises(CorruptFileError, match='line 5: node_id .* is not a test of test_ops.py'):
        baseline.load_baseline(project, 'test_ops.py')
    assert len(baseline.load_baseline(project)) == 5  # without a test file: no ownership check


def test_unknown_kernel_is_a_clear_error(pytester):
    setup_project(pytester, operators=('op_b',))
    result = pytester.runpytest(*RUN, '--refresh-baseline')
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*ValueError: benchmark_record: kernel='op_a' is not a public operator of cann_ops_tilelang "
            '(its __all__: op_b)*'
        ]
    )
    assert not (pytester.path / 'benchmark' / 'test_ops.jsonl').exists()


def test_a_benchmark_that_records_nothing_fails_the_run(pytester, project):
    pytester.makepyfile(
        test_ops=TEST_FILE.format(times=BASE_TIMES).replace(
            "    benchmark_record(kernel='op_b'", "    return\n    benchmark_record(kernel='op_b'"
        )
    )
    result = pytester.runpytest(*RUN)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ['*2 benchmark test(s) passed but none of their records arrived: test_ops.py::test_op_b_benchmark*']
    )


def test_record_needs_the_marker_and_the_timer(pytester):
    setup_project(pytester)
    pytester.makepyfile(
        test_misuse="""
import pytest

def test_unmarked(benchmark_record):
    pass

@pytest.mark.benchmark
def test_untimed(benchmark_record):
    benchmark_record(kernel='op_a', operation='fwd', params={}, time_us=1.0)
"""
    )
    result = pytester.runpytest(*RUN, 'test_misuse.py')
    result.assert_outcomes(errors=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            '*benchmark_record is for tests marked @pytest.mark.benchmark*',
            '*benchmark_record: measure time_us with the benchmark_timer fixture in this test first*',
        ]
    )


def test_timer_skips_without_an_accelerator(pytester):
    if torch.cuda.is_available():
        pytest.skip('this machine has an accelerator')
    pytester.makeconftest("pytest_plugins = ['tests.testing.plugins.benchmark']")
    pytester.makepyfile(
        test_real="""
import pytest

@pytest.mark.benchmark
def test_needs_device(benchmark_timer):
    benchmark_timer(lambda: None)
"""
    )
    result = pytester.runpytest(*RUN, '-rs')
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            '*benchmark: no benchmark test ran (1 skipped)*',
            '*benchmarks time device work, never the CPU: needs an accelerator*',
        ]
    )


def test_xdist_controller_writes_every_workers_records(pytester, monkeypatch):
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join([str(REPO), str(REPO / 'packages')]))
    path = setup_project(pytester)
    # The controller runs in this process (where torch is imported already), the two workers in their own:
    # a controller of its own would only add a start-up, it times nothing.
    result = pytester.runpytest(*RUN, '-n', '2', '-p', 'no:benchmark', '--refresh-baseline', '-v')
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(['[[]gw0[]]*PASSED*test_op_*_benchmark*'], consecutive=False)
    result.stdout.fnmatch_lines(['[[]gw1[]]*PASSED*test_op_*_benchmark*'], consecutive=False)  # both workers timed
    result.stdout.fnmatch_lines(['benchmark/test_ops.jsonl: 4 record(s) written for fake1, 0 replaced, 0 kept'])
    assert len(read_records(path)) == 4


def test_xdist_controller_verifies_every_workers_results(project, pytester, monkeypatch):
    # The baseline comes from an in-process refresh (the project fixture); the verify runs on two workers.
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join([str(REPO), str(REPO / 'packages')]))
    setup_project(pytester, times=with_times(a_4096=150.0, b_fp32=40.0))
    result = pytester.runpytest(*RUN, '-n', '2', '-p', 'no:benchmark', '-v')
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(['[[]gw0[]]*PASSED*test_op_*_benchmark*'], consecutive=False)
    result.stdout.fnmatch_lines(['[[]gw1[]]*PASSED*test_op_*_benchmark*'], consecutive=False)  # both workers timed
    result.stdout.fnmatch_lines(
        [
            '*4 result(s): 2 within thresholds, 2 regression(s), 0 improvement(s), 0 without a baseline*',
            '  2 regression(s)',
        ]
    )
    output = result.stdout.str()
    assert output.count('REGRESSION ') == 2 and output.count('\nok ') == 2  # noqa: PT018


def test_xdist_corrupt_baseline_stops_the_run_with_the_reason(pytester, monkeypatch):
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join([str(REPO), str(REPO / 'packages')]))
    path = setup_project(pytester)
    path.parent.mkdir()
    path.write_text('{"kernel": \n')
    # The controller runs in this process, the two workers in their own.
    result = pytester.runpytest(*RUN, '-n', '2', '-p', 'no:benchmark')  # pytest-benchmark warns under xdist
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines([f'*Exit: corrupt baseline file {path}: line 1: Expecting value*'])


def test_experimental_operators_are_named_with_their_domain():
    """A domain's operators that the root package does not export are benchmarked as '<domain>.<name>'."""
    import types

    from tests.testing.timing import experimental_operators

    def operator_function():
        pass

    operator_function.operator = object()
    package = types.ModuleType('pkg')
    package.__all__ = ['stable']
    stable, trial = types.ModuleType('pkg.stable_domain'), types.ModuleType('pkg.trial')
    stable.__all__, stable.stable = ['stable'], operator_function

    def plain_call():  # a call without a torch.library form (a list of tensors) is benchmarked too
        pass

    trial.__all__ = ['cast', 'QuantTensor', 'batched', 'LIMIT']
    trial.cast, trial.QuantTensor, trial.batched, trial.LIMIT = operator_function, tuple, plain_call, 4
    package.stable_domain, package.trial = stable, trial
    package.elsewhere = types.ModuleType('other.trial')  # not a subpackage of pkg
    assert experimental_operators(package) == {'trial.cast', 'trial.batched'}
