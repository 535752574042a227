"""The npu_mem plugin and the profile files, on a CPU: a fake meter stands in for the device."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.testing import mem_profiles
from tests.testing.files import CorruptFileError
from tests.testing.mem_profiles import make_record, render_profile

pytest_plugins = ['pytester']

TEST_FILE = 'engram/test_ops.py'
PROFILE = 'engram/npu_mem_profiles/test_ops.json'
SMALL1, SMALL2, BIG = (f'{TEST_FILE}::{name}' for name in ('test_small[1]', 'test_small[2]', 'test_big'))
CPU = f'{TEST_FILE}::test_cpu'

CONFTEST = """
import json

pytest_plugins = ['tests.testing.plugins.npu_mem']
MIB = 1 << 20


class FakeMeter:
    # Peaks come from peaks.json (test name -> MiB); a test missing there fails if it is measured.
    def start(self, item):
        pass

    def stop(self, item):
        from tests.testing.plugins.npu_mem import Measurement

        mib = json.loads((item.config.rootpath / 'peaks.json').read_text())[item.name]
        return Measurement(int(mib * MIB) // 2, int(mib * MIB), MIB, 'fake.meter', 'Fake Device')


def pytest_npu_mem_meter(config):
    return FakeMeter()


def pytest_configure(config):
    config.addinivalue_line('markers', 'npu: needs the (fake) device')
"""

TESTS = """
import pytest

@pytest.mark.npu
@pytest.mark.parametrize('n', [1, 2])
def test_small(n):
    pass

@pytest.mark.npu
def test_big():
    pass

def test_cpu():
    pass
"""

PEAKS = {'test_small[1]': 10, 'test_small[2]': 20, 'test_big': 20000}


def fake_record(mib: float) -> dict:
    """What the fake meter records for a peak of `mib` MiB on a device the process has alone."""
    return make_record(
        allocated_bytes=int(mib * 2**20) // 2,
        reserved_bytes=int(mib * 2**20),
        outside_allocator_bytes=2**20,
        method='fake.meter',
        device='Fake Device',
    )


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.setenv('OPS_TILELANG_TEST_LEVEL', '1')
    monkeypatch.setenv('PYTEST_DISABLE_PLUGIN_AUTOLOAD', '1')  # ~1 s less per run; xdist runs ask for -p xdist
    pytester.makeconftest(CONFTEST)
    pytester.mkdir('engram')
    pytester.path.joinpath(TEST_FILE).write_text(TESTS)
    set_peaks(pytester, PEAKS)
    return pytester


def set_peaks(pytester, peaks: dict) -> None:
    pytester.path.joinpath('peaks.json').write_text(json.dumps(peaks))


def write_profile(pytester, records: dict) -> bytes:
    path = pytester.path / PROFILE
    path.parent.mkdir(exist_ok=True)
    path.write_text(render_profile(TEST_FILE, records))
    return path.read_bytes()


def profile_records(pytester) -> dict:
    return json.loads((pytester.path / PROFILE).read_text())['records']


def large_node_ids(pytester, *args: str) -> set[str]:
    result = pytester.runpytest('--collect-only', '-q', '-m', 'large_npu_mem', *args)
    return {line for line in result.outlines if '::' in line}


def test_refresh_writes_a_canonical_profile_beside_the_test_file(project):
    result = project.runpytest('--refresh-mem')
    result.assert_outcomes(passed=4)
    text = (project.path / PROFILE).read_text()
    assert json.loads(text) == {
        'format': 'cann_ops_tilelang.npu_mem_profile',
        'version': 1,
        'test_file': TEST_FILE,
        'unit': 'MiB',
        'records': {
            SMALL1: {
                'allocated_peak_mb': 5.0,
                'reserved_peak_mb': 10.0,
                'outside_allocator_mb': 1.0,
                'peak_mb': 11.0,
                'method': 'fake.meter',
                'device': 'Fake Device',
            },
            SMALL2: fake_record(20),
            BIG: fake_record(20000),
        },
    }, 'one record per device test, none for the CPU test'
    assert text == render_profile(TEST_FILE, profile_records(project)), 'sorted keys, 2-space indent, final newline'
    assert sorted(os.listdir((project.path / PROFILE).parent)) == ['test_ops.json'], 'no temporary file left'
    result.stdout.fnmatch_lines(['*npu memory profiles*', f'{PROFILE}: written (3 added, 0 changed, 0 removed)'])


def test_device_tests_without_profile_or_above_the_threshold_are_marked(project):
    assert large_node_ids(project) == {SMALL1, SMALL2, BIG}, 'no profile: every device test, no CPU test'
    write_profile(project, {SMALL1: fake_record(10), SMALL2: fake_record(20), BIG: fake_record(20000)})
    assert large_node_ids(project) == {BIG}, 'default threshold 15000 MB'
    assert large_node_ids(project, '--npu-mem-threshold', '21') == {BIG}, 'peak 21.0 does not exceed 21'
    assert large_node_ids(project, '--npu-mem-threshold', '20.5') == {SMALL2, BIG}
    assert large_node_ids(project, '--npu-mem-threshold', '0') == {SMALL1, SMALL2, BIG}
    write_profile(project, {SMALL1: fake_record(10), BIG: fake_record(100)})
    assert large_node_ids(project) == {SMALL2}, 'a device test without a record stays large'


def test_missing_only_measures_new_node_ids_and_keeps_records_byte_for_byte(project):
    old = {SMALL1: fake_record(999.5), BIG: fake_record(12345.25)}
    old_bytes = write_profile(project, old)
    set_peaks(project, {'test_small[2]': 20})  # measuring any other test would fail with a KeyError
    result = project.runpytest('--refresh-mem', '--refresh-mem-missing-only')
    result.assert_outcomes(passed=2, deselected=2)  # the two device tests with a record do not run
    new_text = (project.path / PROFILE).read_text()
    assert new_text == render_profile(TEST_FILE, {**old, SMALL2: fake_record(20)})
    for nodeid, record in old.items():
        block = json.dumps({nodeid: record}, indent=2, sort_keys=True)[2:-2]  # the record's lines as written
        assert block.replace('\n', '\n  ') in new_text
        assert block.replace('\n', '\n  ') in old_bytes.decode()

    before = (project.path / PROFILE).stat().st_mtime_ns
    result = project.runpytest('--refresh-mem', '--refresh-mem-missing-only')
    result.stdout.fnmatch_lines([f'{PROFILE}: unchanged (0 added, 0 changed, 0 removed)'])
    assert (project.path / PROFILE).stat().st_mtime_ns == before, 'nothing missing: the file is not rewritten'


def test_refresh_of_a_subset_replaces_only_its_records(project):
    project.runpytest('--refresh-mem').assert_outcomes(passed=4)
    set_peaks(project, {name: 2 * mib for name, mib in PEAKS.items()})
    project.runpytest('--refresh-mem', '-k', 'small').assert_outcomes(passed=2, deselected=2)
    assert profile_records(project) == {SMALL1: fake_record(20), SMALL2: fake_record(40), BIG: fake_record(20000)}
    project.runpytest('--refresh-mem', f'{TEST_FILE}::test_big').assert_outcomes(passed=1)
    assert profile_records(project)[BIG] == fake_record(40000)


@pytest.mark.parametrize(
    ('level', 'args', 'outcome'),
    [
        ('2', [], 'removed'),
        ('2', ['-k', 'small'], 'removed'),  # -k/-m deselect after collection: the whole file was still collected
        ('2', [f'{TEST_FILE}::test_big'], 'kept'),  # narrowed by node ID: the file's other node IDs are unknown
        ('2', ['--refresh-mem-missing-only'], 'reported'),
        ('1', [], 'reported'),  # level 1 collects only some parameter sets
    ],
    ids=['full', 'k-filter', 'node-id', 'missing-only', 'level-1'],
)
def test_stale_node_ids_are_removed_only_by_a_full_refresh(project, monkeypatch, level, args, outcome):
    gone = f'{TEST_FILE}::test_removed_since'
    write_profile(project, {SMALL1: fake_record(1), SMALL2: fake_record(2), BIG: fake_record(3), gone: fake_record(4)})
    monkeypatch.setenv('OPS_TILELANG_TEST_LEVEL', level)
    result = project.runpytest('--refresh-mem', *args)
    assert result.ret == 0
    records = profile_records(project)
    assert (gone in records) == (outcome != 'removed')
    assert set(records) >= {SMALL1, SMALL2, BIG}
    if outcome == 'removed':
        result.stdout.fnmatch_lines([f'{PROFILE}: written (*, 1 removed)'])
    if outcome == 'reported':
        result.stdout.fnmatch_lines([f'{PROFILE}: 1 stale record(s) kept*', f'    {gone}'])
    else:
        result.stdout.no_fnmatch_line('*stale record*')


def test_a_profile_whose_module_lost_all_device_tests_is_deleted_by_a_full_refresh(project, monkeypatch):
    write_profile(project, {f'{TEST_FILE}::test_old': fake_record(1)})
    project.path.joinpath(TEST_FILE).write_text('def test_cpu():\n    pass\n')
    monkeypatch.setenv('OPS_TILELANG_TEST_LEVEL', '2')
    project.runpytest('--refresh-mem').stdout.fnmatch_lines([f'{PROFILE}: deleted (0 added, 0 changed, 1 removed)'])
    assert not (project.path / PROFILE).exists()


def test_xdist_workers_measure_and_the_controller_merges(project):
    result = project.runpytest_subprocess('-p', 'xdist', '-n', '2', '--refresh-mem')
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines([f'{PROFILE}: written (3 added, 0 changed, 0 removed)'])
    shared = {f'{TEST_FILE}::{name}': {**fake_record(mib), 'outside_allocator_mb': None, 'peak_mb': float(mib)}
              for name, mib in PEAKS.items()}  # fmt: skip
    assert profile_records(project) == shared, 'two unbound workers share the device: no device-level figure'
    # Every worker marks alike (else xdist reports different collections): phase 1 of a two-phase run.
    result = project.runpytest_subprocess('-p', 'xdist', '-n', '2', '-m', 'not large_npu_mem')
    result.assert_outcomes(passed=3)


@pytest.mark.parametrize(
    ('text', 'problem'),
    [
        ('', 'not valid JSON (truncated or hand-edited?)*'),
        (render_profile(TEST_FILE, {})[:40], 'not valid JSON*'),
        ('[1, 2]', "not an NPU memory profile: format 'list'*"),
        ('{"format": "something else", "records": {}}', "not an NPU memory profile: format 'something else'*"),
        (render_profile('engram/test_other.py', {}), "is the profile of 'engram/test_other.py', not of *"),
        (render_profile(TEST_FILE, {}).replace('"version": 1', '"version": 2'), 'schema version 2 is not supported*'),
    ],
    ids=['empty', 'truncated', 'list', 'foreign-format', 'other-module', 'version-2'],
)
def test_a_corrupt_profile_is_a_collection_error_that_names_the_file(project, text, problem):
    (project.path / PROFILE).parent.mkdir()
    (project.path / PROFILE).write_text(text)
    result = project.runpytest()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f'*ERROR collecting {TEST_FILE}*', f'{project.path / PROFILE}: {problem}'])


def test_a_corrupt_profile_is_reported_alike_under_xdist(project):
    (project.path / PROFILE).parent.mkdir()
    (project.path / PROFILE).write_text('{"format": "cann_ops_tilelang.npu_mem_pro')
    result = project.runpytest_subprocess('-p', 'xdist', '-n', '2', '--refresh-mem')
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # xdist's exit code for collection errors
    result.stdout.fnmatch_lines([f'{project.path / PROFILE}: not valid JSON*'])
    assert (project.path / PROFILE).read_text() == '{"format": "cann_ops_tilelang.npu_mem_pro', 'never overwritten'


def test_an_interrupted_run_leaves_the_previous_file_intact(project):
    old_bytes = write_profile(project, {SMALL1: fake_record(1), SMALL2: fake_record(2), BIG: fake_record(3)})
    project.path.joinpath('engram/test_zz_interrupt.py').write_text(
        'import pytest\n\n@pytest.mark.npu\ndef test_ctrl_c():\n    raise KeyboardInterrupt\n'
    )
    result = project.runpytest('--refresh-mem', no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(['*no profile written: the run was interrupted; the previous files are unchanged*'])
    assert (project.path / PROFILE).read_bytes() == old_bytes
    assert not (project.path / 'engram/npu_mem_profiles/test_zz_interrupt.json').exists()


def test_a_failing_test_keeps_its_old_record(project):
    old = {SMALL1: fake_record(1), SMALL2: fake_record(2), BIG: fake_record(3)}
    write_profile(project, old)
    tests = TESTS.replace('def test_small(n):\n    pass', 'def test_small(n):\n    assert n == 1')
    project.path.joinpath(TEST_FILE).write_text(tests)
    result = project.runpytest('--refresh-mem')
    result.assert_outcomes(passed=3, failed=1)
    assert profile_records(project) == {SMALL1: fake_record(10), SMALL2: old[SMALL2], BIG: fake_record(20000)}


def test_a_failed_write_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    path = tmp_path / 'npu_mem_profiles' / 'test_ops.json'
    path.parent.mkdir()
    path.write_text(render_profile(TEST_FILE, {SMALL1: fake_record(1)}))
    old_bytes = path.read_bytes()

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, 'fsync', interrupted)
    with pytest.raises(KeyboardInterrupt):
        mem_profiles.write_profile(path, TEST_FILE, {SMALL1: fake_record(2)})
    assert path.read_bytes() == old_bytes
    assert os.listdir(path.parent) == ['test_ops.json'], 'the temporary file is removed'


@pytest.mark.parametrize(
    ('args', 'message'),
    [
        (['--refresh-mem-missing-only'], '*--refresh-mem-missing-only only works together with --refresh-mem*'),
        (['--npu-mem-threshold', '-1'], '*--npu-mem-threshold must be a number of MB >= 0, got -1.0*'),
        (['--npu-mem-threshold', 'nan'], '*--npu-mem-threshold must be a number of MB >= 0, got nan*'),
    ],
)
def test_option_errors_are_usage_errors(project, args, message):
    result = project.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_records_shared_devices_without_the_device_level_figure():
    record = make_record(
        allocated_bytes=3 * 2**20, reserved_bytes=2**21, outside_allocator_bytes=None, method='m', device='d'
    )
    assert record['outside_allocator_mb'] is None
    assert record['peak_mb'] == 3.0, 'the larger of the allocator peaks when the reserved one lags (fake meters)'


def test_profile_path_is_beside_the_test_file():
    expected = Path('tests/engram/npu_mem_profiles/test_x.json')
    assert mem_profiles.profile_path(Path('tests/engram/test_x.py')) == expected


GOOD = fake_record(1)


@pytest.mark.parametrize(
    ('records', 'problem'),
    [
        ({'tests/other.py::test_a': GOOD}, "record 'tests/other.py::test_a' is not a node ID of 'engram/test_ops.py'"),
        ({SMALL1: [1]}, f'record {SMALL1!r} is a list, expected an object'),
        ({SMALL1: {**GOOD, 'extra': 1}}, "has missing fields [] / unknown fields ['extra']"),
        ({SMALL1: {k: v for k, v in GOOD.items() if k != 'peak_mb'}}, "missing fields ['peak_mb']"),
        ({SMALL1: {**GOOD, 'peak_mb': -1}}, 'peak_mb = -1 is not a number of MiB >= 0'),
        ({SMALL1: {**GOOD, 'peak_mb': True}}, 'peak_mb = True is not a number'),
        ({SMALL1: {**GOOD, 'peak_mb': '12'}}, "peak_mb = '12' is not a number"),
        ({SMALL1: {**GOOD, 'outside_allocator_mb': 'x'}}, "outside_allocator_mb = 'x' is neither null nor a number"),
        ({SMALL1: {**GOOD, 'device': 3}}, 'device = 3 is not a string'),
    ],
)
def test_records_are_validated_on_load(records, problem):
    text = render_profile(TEST_FILE, records)
    with pytest.raises(CorruptFileError) as excinfo:
        mem_profiles.parse_profile(text, '/p/npu_mem_profiles/test_ops.json', TEST_FILE)
    assert str(excinfo.value).startswith('/p/npu_mem_profiles/test_ops.json: ')
    assert problem in str(excinfo.value)
    assert excinfo.value.path == Path('/p/npu_mem_profiles/test_ops.json')


def test_the_top_level_is_validated_on_load():
    good = json.loads(render_profile(TEST_FILE, {}))
    for bad, problem in [
        ({**good, 'unit': 'MB'}, "unit 'MB' is not supported"),
        ({**good, 'records': []}, 'records is a list'),
        ({**good, 'version': True}, 'schema version True'),
        ({**good, 'note': 'x'}, "unknown fields ['note']"),
    ]:
        with pytest.raises(CorruptFileError, match=problem.replace('[', r'\[').replace(']', r'\]')):
            mem_profiles.parse_profile(json.dumps(bad), 'p.json', TEST_FILE)
    assert mem_profiles.parse_profile(json.dumps(good), 'p.json', TEST_FILE) == {}


def test_non_utf8_and_absent_files(tmp_path):
    assert mem_profiles.load_profile(tmp_path / 'absent.json', TEST_FILE) == {}
    (tmp_path / 'bin.json').write_bytes(b'\xff\xfe')
    with pytest.raises(CorruptFileError, match='bin.json: not UTF-8'):
        mem_profiles.load_profile(tmp_path / 'bin.json', TEST_FILE)


def test_update_rules():
    a, b, c = (f'{TEST_FILE}::{n}' for n in 'abc')
    old = {a: fake_record(1), b: fake_record(2)}
    measured = {b: fake_record(5), c: fake_record(6)}
    update = mem_profiles.update_records(old, measured, collected={a, b, c}, missing_only=False, prune=True)
    assert update.records == {a: old[a], b: measured[b], c: measured[c]}
    assert (update.added, update.updated, update.removed, update.stale) == ((c,), (b,), (), ())
    update = mem_profiles.update_records(old, measured, collected={b, c}, missing_only=True, prune=False)
    assert update.records == {a: old[a], b: old[b], c: measured[c]}
    assert (update.added, update.updated, update.stale) == ((c,), (), (a,))
    update = mem_profiles.update_records(old, {}, collected={b}, missing_only=False, prune=True)
    assert (update.records, update.removed) == ({b: old[b]}, (a,))
    update = mem_profiles.update_records(old, {}, collected=None, missing_only=False, prune=True)
    assert update.records == old, 'a module that was not collected loses nothing'


class FakeAllocatorApi:
    """The torch.cuda / torch.npu calls the default meter makes, over a scripted device."""

    def __init__(self):
        self.calls = []
        self.used, self.reserved, self.peaks = 1000, 100, (0, 0)

    def synchronize(self):
        self.calls.append('synchronize')

    def empty_cache(self):
        self.calls.append('empty_cache')

    def reset_peak_memory_stats(self):
        self.calls.append('reset_peak_memory_stats')

    def mem_get_info(self):
        return 10_000 - self.used, 10_000  # (free, total)

    def memory_reserved(self):
        return self.reserved

    def max_memory_allocated(self):
        return self.peaks[0]

    def max_memory_reserved(self):
        return self.peaks[1]

    def get_device_name(self):
        return 'Fake H200'


def test_the_torch_meter_counts_memory_outside_the_allocator():
    from tests.testing.plugins.npu_mem import Measurement, TorchMeter

    api = FakeAllocatorApi()
    meter = TorchMeter(api, 'torch.fake')
    meter.start(item=None)
    assert api.calls == ['synchronize', 'empty_cache', 'reset_peak_memory_stats'], 'cached memory is not counted'
    api.used, api.reserved, api.peaks = 1000 + 700, 100 + 500, (300, 600)  # 200 bytes grew outside the allocator
    assert meter.stop(item=None) == Measurement(
        allocated_peak_bytes=300,
        reserved_peak_bytes=600,
        outside_allocator_bytes=200,
        method='torch.fake.max_memory_allocated/max_memory_reserved + torch.fake.mem_get_info',
        device='Fake H200',
    )
    meter.start(item=None)
    api.used, api.reserved = 1000, 50  # the allocator released memory: never a negative figure
    assert meter.stop(item=None).outside_allocator_bytes == 0
