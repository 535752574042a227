"""The two-phase runner: argv building, worker counts, memory threshold, exit codes, and one real run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cann_ops_pipeline import phase_gate, two_phase
from cann_ops_pipeline.two_phase import Phase, PhaseResult

pytest_plugins = ['pytester']

PY = sys.executable


def test_unknown_arguments_and_everything_after_the_separator_go_to_pytest():
    options, args = two_phase.parse_command_line(
        ['tests/engram', '--phase1-workers', '3', '-k', 'a or b', '--fail-fast', '--', '--phase2-workers', '9', '-x']
    )
    assert (options.phase1_workers, options.phase2_workers, options.fail_fast) == (3, None, True)
    assert args == ['tests/engram', '-k', 'a or b', '--phase2-workers', '9', '-x']


@pytest.mark.parametrize('bad', ['-1', 'many'])
def test_worker_counts_must_be_counts(bad, capsys):
    with pytest.raises(SystemExit) as info:
        two_phase.parse_command_line(['--phase2-workers', bad])
    assert info.value.code == 4, 'the one usage-error code, as in pytest'
    assert f'{bad!r} is not a worker count' in capsys.readouterr().err


@pytest.mark.parametrize(
    ('args', 'expr', 'rest'),
    [
        (['tests', '-m', 'npu', '-x'], 'npu', ['tests', '-x']),
        (['-mnpu and not benchmark'], 'npu and not benchmark', []),
        (['-m', 'a', '-m', 'b'], 'b', []),  # as in pytest, the last -m wins
        (['--maxfail=2', 'tests'], None, ['--maxfail=2', 'tests']),
    ],
)
def test_the_users_marker_expression_is_taken_out(args, expr, rest):
    assert two_phase.split_markexpr(args) == (expr, rest)


def test_a_dangling_m_is_an_error():
    with pytest.raises(two_phase.UsageError, match='-m needs a marker expression'):
        two_phase.split_markexpr(['tests', '-m'])


@pytest.mark.parametrize('arg', ['-n', '-n4', '-nauto', '-n=2', '--numprocesses', '--numprocesses=4'])
def test_pytests_own_worker_count_is_refused(arg):
    with pytest.raises(two_phase.UsageError, match='--phase1-workers / --phase2-workers'):
        two_phase.check_passthrough(['tests', arg])


def test_marker_expressions_are_combined_with_parentheses():
    assert two_phase.combine_markexpr(None, 'not large_npu_mem') == 'not large_npu_mem'
    assert two_phase.combine_markexpr(' ', 'large_npu_mem') == 'large_npu_mem'
    assert two_phase.combine_markexpr('npu or slow', 'not large_npu_mem') == '(npu or slow) and (not large_npu_mem)'


def test_phase_argv():
    phase1, phase2 = two_phase.build_phases(8, 2)
    assert phase1 == Phase('phase 1', 'not large_npu_mem', 8)
    assert two_phase.phase_argv(phase1, 'npu', ['tests', '-x'], python='py') == [
        'py', '-m', 'pytest', '-m', '(npu) and (not large_npu_mem)', '-n', '8', '--dist', 'worksteal', 'tests', '-x'
    ]  # fmt: skip
    phase2_argv = two_phase.phase_argv(phase2, None, [], python='py')
    assert phase2_argv == ['py', '-m', 'pytest', '-m', 'large_npu_mem', '-n', '2', '--dist', 'worksteal']


@pytest.mark.parametrize('given', [['--dist', 'load'], ['--dist=loadfile'], ['-d', '--tx', 'popen']])
def test_a_given_distribution_mode_is_kept(given):
    phase = Phase('phase 1', 'not large_npu_mem', 8)
    argv = two_phase.phase_argv(phase, None, given, python='py')
    assert argv[5:] == ['-n', '8', *given]  # no --dist worksteal of ours next to the user's


@pytest.mark.parametrize(('workers', 'n'), [(0, 0), (1, 0), (2, 2), (16, 16)])
def test_one_worker_runs_in_process_without_xdist(workers, n):
    assert two_phase.xdist_count(workers) == n
    phase = Phase('phase 2', 'large_npu_mem', workers)
    assert two_phase.phase_argv(phase, None, [], python='py')[5:] == ['-n', str(n)] + (
        ['--dist', 'worksteal'] if n else []
    )


@pytest.mark.parametrize(
    ('devices', 'cpus', 'memory_known', 'expected'),
    [
        (1, 16, True, (16, 1)),  # one worker per CPU of the device
        (2, 16, True, (16, 2)),  # 8 per device
        (1, 128, True, (16, 1)),  # at most 16 per device
        (8, 4, True, (8, 8)),  # at least 1 per device
        (1, 16, False, (4, 1)),  # memory unknown: at most 4 per device
        (2, 4, False, (4, 2)),  # 2 per device, under that cap
        (0, 2, True, (2, 1)),  # no device: one per CPU
        (0, 0, False, (1, 1)),
    ],
)
def test_default_workers(devices, cpus, memory_known, expected):
    assert two_phase.default_workers(devices, cpus, memory_known) == expected


@pytest.mark.parametrize(
    ('workers', 'devices', 'per_device'), [(16, 1, 16), (8, 2, 4), (3, 2, 2), (1, 1, 1), (0, 2, 1), (6, 0, 1)]
)
def test_workers_on_the_busiest_device(workers, devices, per_device):
    assert two_phase.workers_per_device(workers, devices) == per_device


@pytest.mark.parametrize(
    ('args', 'value', 'rest'),
    [
        (['tests', '--npu-mem-threshold', '9000', '-x'], 9000.0, ['tests', '-x']),
        (['--npu-mem-threshold=20.5', 'tests'], 20.5, ['tests']),
        (['--npu-mem-threshold=1', '--npu-mem-threshold', '2'], 2.0, []),  # as in pytest, the last wins
        (['--npu-mem-thresholds=1', 'tests'], None, ['--npu-mem-thresholds=1', 'tests']),  # not ours
    ],
)
def test_the_users_threshold_is_taken_out(args, value, rest):
    assert two_phase.split_threshold(args) == (value, rest)


@pytest.mark.parametrize(
    ('args', 'message'),
    [
        (['--npu-mem-threshold'], '--npu-mem-threshold needs a number of MB'),
        (['--npu-mem-threshold', 'big'], "--npu-mem-threshold 'big': expected a number of MB >= 0"),
        (['--npu-mem-threshold=-1'], "--npu-mem-threshold '-1': expected a number of MB >= 0"),
        (['--npu-mem-threshold=nan'], "--npu-mem-threshold 'nan': expected a number of MB >= 0"),
    ],
)
def test_a_bad_threshold_is_a_usage_error(args, message):
    with pytest.raises(two_phase.UsageError, match=re.escape(message)):
        two_phase.split_threshold(args)


@pytest.mark.parametrize(
    ('user', 'memory', 'per_device', 'note', 'mb', 'reason'),
    [
        (None, 143771, 16, '', 8985, 'device share: 143771 MB / 16 workers; min with npu_mem default 15000'),
        (None, 143771, 4, '', 15000, 'npu_mem default; min with device share 35942 (143771 MB / 4 workers)'),
        (9000.0, 143771, 16, '', 8985, 'device share: 143771 MB / 16 workers; min with given 9000'),
        (20.5, 143771, 1, '', 20.5, 'given; min with device share 143771 (143771 MB / 1 worker)'),
        # a given threshold replaces the default, also upwards; only the device share caps it
        (20000.0, 143771, 4, '', 20000, 'given; min with device share 35942 (143771 MB / 4 workers)'),
        (20000.0, None, 1, 'device memory unknown', 20000, 'given; device memory unknown'),
        (15000.0, None, 1, 'no device', 15000, 'given; no device'),
    ],
)  # fmt: skip
def test_the_threshold_is_the_smallest_bound(user, memory, per_device, note, mb, reason):
    assert two_phase.choose_threshold(user, memory, per_device, note) == two_phase.Threshold(mb, reason)


@pytest.mark.parametrize(('mb', 'text'), [(8985, '8985'), (15000.0, '15000'), (20.5, '20.5'), (0.0, '0')])
def test_thresholds_are_written_as_pytest_reads_them(mb, text):
    assert two_phase.format_mb(mb) == text


@pytest.mark.parametrize(
    ('codes', 'expected'),
    [
        ([0, 0], 0),
        ([5, 0], 0),
        ([0, 5], 0),
        ([5, 5], 5),  # neither phase ran a test
        ([1, 0], 1),
        ([0, 1], 1),
        ([4, 1], 4),  # the first failure's code
        ([-9, 0], 1),  # killed by a signal
        ([1], 1),  # phase 2 not run
    ],
)
def test_exit_codes_combine(codes, expected):
    assert two_phase.combined_exit_code(codes) == expected


@pytest.mark.parametrize(
    ('line', 'selected'),
    [
        ('3 passed, 1 skipped, 2 deselected in 0.12s', 4),
        ('1 failed, 2 passed, 1 xfailed, 3 warnings in 1.50s', 4),
        ('2 errors in 0.5s', 2),
        ('no tests ran in 0.01s', 0),
        (None, None),
    ],
)
def test_selected_counts_come_from_pytests_summary_line(line, selected):
    assert two_phase.selected_count(line) == selected


class FakeRunner:
    def __init__(self, *codes):
        self.codes = list(codes)
        self.calls = []

    def __call__(self, argv, env):
        self.calls.append((list(argv), dict(env)))
        return PhaseResult(self.codes.pop(0), 1.25, '3 passed, 1 deselected in 1.00s')


def no_tools(argv):
    """Neither npu-smi nor nvidia-smi is installed."""
    return None


def run(argv, runner, devices='2', memory='143771', cpus=16, tool=no_tools, env=None):
    lines = []
    environ = {'OPS_TILELANG_DEVICE_COUNT': devices, **(env or {})}
    if memory is not None:
        environ['OPS_TILELANG_DEVICE_MEMORY_MB'] = memory
    code = two_phase.run(
        argv, runner=runner, starter=None, environ=environ, cpu_count=lambda: cpus, tool=tool, out=lines.append
    )
    return code, '\n'.join(lines)


def workers_and_thresholds(runner):
    """(-n, --npu-mem-threshold) of each phase that ran."""
    return [(argv[argv.index('-n') + 1], argv[argv.index('--npu-mem-threshold') + 1]) for argv, _ in runner.calls]


def test_both_phases_run_with_the_extra_args_the_threshold_and_the_device_count():
    runner = FakeRunner(0, 5)
    code, out = run(['tests/engram', '-m', 'npu', '-x'], runner)
    assert code == 0
    argv1, argv2 = (argv for argv, _ in runner.calls)
    assert argv1[3:] == [
        '-m', '(npu) and (not large_npu_mem)', '-n', '16', '--dist', 'worksteal',
        '--npu-mem-threshold', '15000', 'tests/engram', '-x',
    ]  # fmt: skip
    assert argv2[3:] == [
        '-m', '(npu) and (large_npu_mem)', '-n', '2', '--dist', 'worksteal',
        '--npu-mem-threshold', '15000', 'tests/engram', '-x',
    ]  # fmt: skip
    assert all(env['OPS_TILELANG_DEVICE_COUNT'] == '2' for _, env in runner.calls)
    threshold = '--npu-mem-threshold 15000 (npu_mem default; min with device share 17971 (143771 MB / 8 workers))'
    assert out.splitlines()[0] == f'==> threshold: {threshold}'
    assert out.splitlines()[-4:] == [
        'two-phase run: passed',
        f'  {threshold}',
        "  phase 1: -m '(npu) and (not large_npu_mem)' -n 16: exit 0 (passed), selected 3, 1.2 s "
        '[3 passed, 1 deselected in 1.00s]',
        "  phase 2: -m '(npu) and (large_npu_mem)' -n 2: exit 5 (no tests selected), selected 3, 1.2 s "
        '[3 passed, 1 deselected in 1.00s]',
    ]


def test_one_device_16_cpus_phase_1_gets_16_workers_and_their_share_phase_2_runs_in_process():
    runner = FakeRunner(0, 0)
    code, out = run([], runner, devices='1')
    assert code == 0
    assert workers_and_thresholds(runner) == [('16', '8985'), ('0', '8985')]
    assert '  --npu-mem-threshold 8985 (device share: 143771 MB / 16 workers; min with npu_mem default 15000)' in out
    assert out.splitlines()[-1].startswith('  phase 2: -m large_npu_mem -n 0: exit 0 (passed)')


@pytest.mark.parametrize(
    ('args', 'phase1_n', 'threshold'),
    [
        (['--npu-mem-threshold', '9000'], '16', '8985'),  # the share is smaller
        (['--npu-mem-threshold=5000.5'], '16', '5000.5'),  # the user's is smaller
        (['--', '--npu-mem-threshold', '100'], '16', '100'),  # also after --
        (['--npu-mem-threshold=20000'], '16', '8985'),  # never above the share
        (['--phase1-workers', '4'], '4', '15000'),  # share 35942: the default is smaller
        (['--phase1-workers', '1'], '0', '15000'),  # in-process: the whole device, 143771
    ],
)
def test_the_threshold_is_the_users_or_the_default_capped_by_the_share(args, phase1_n, threshold):
    runner = FakeRunner(0, 0)
    run(['tests', *args], runner, devices='1')
    assert workers_and_thresholds(runner) == [(phase1_n, threshold), ('0', threshold)]
    assert all(argv.count('--npu-mem-threshold') == 1 for argv, _ in runner.calls), "the user's is replaced"
    assert not any(arg.startswith('--npu-mem-threshold=') for argv, _ in runner.calls for arg in argv)


def test_with_unknown_device_memory_phase_1_takes_at_most_4_per_device_and_the_threshold_stays():
    runner = FakeRunner(0, 0)
    code, out = run(['--npu-mem-threshold', '12000'], runner, devices='1', memory=None)
    assert code == 0
    assert workers_and_thresholds(runner) == [('4', '12000'), ('0', '12000')]
    assert '--npu-mem-threshold 12000 (given; device memory unknown, phase 1 at most 4 workers per device)' in out
    explicit = FakeRunner(0, 0)
    code, out = run(['--phase1-workers', '12'], explicit, devices='1', memory=None)
    assert code == 0
    assert workers_and_thresholds(explicit) == [('12', '15000'), ('0', '15000')]
    assert '(npu_mem default; device memory unknown)' in out


def test_the_device_memory_comes_from_the_vendor_tool():
    runner = FakeRunner(0, 0)
    tool = {'nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits': '143771\n81559\n'}.get
    run([], runner, memory=None, tool=lambda argv: tool(' '.join(argv)))
    assert workers_and_thresholds(runner) == [('16', '10194'), ('2', '10194')], '81559 MB / 8 workers'


def test_without_devices_phase_1_uses_the_cpus():
    runner = FakeRunner(0, 0)
    code, out = run(['--phase2-workers', '0'], runner, devices='0', cpus=6)
    assert code == 0
    assert workers_and_thresholds(runner) == [('6', '15000'), ('0', '15000')]
    assert '  --npu-mem-threshold 15000 (npu_mem default; no device)' in out


@pytest.mark.parametrize(
    ('workers', 'cpus', 'threads'),
    [(16, 16, '1'), (4, 16, '4'), (3, 16, '5'), (32, 16, '1'), (2, 1, '1')],
)
def test_thread_env_gives_each_worker_its_share_of_the_cpus(workers, cpus, threads):
    assert two_phase.thread_env(workers, cpus, {}) == dict.fromkeys(two_phase.THREAD_ENV_VARS, threads)


def test_thread_env_leaves_in_process_phases_and_the_users_settings_alone():
    assert two_phase.thread_env(1, 16, {}) == {}
    assert two_phase.thread_env(0, 16, {}) == {}
    env = two_phase.thread_env(8, 16, {'OMP_NUM_THREADS': '3'})
    assert 'OMP_NUM_THREADS' not in env
    assert env['TVM_NUM_THREADS'] == '2'


def test_each_phase_runs_with_its_thread_share():
    runner = FakeRunner(0, 0)
    run([], runner, devices='2', cpus=16, env={'MKL_NUM_THREADS': '7'})
    (argv1, env1), (argv2, env2) = runner.calls
    assert argv1[argv1.index('-n') + 1] == '16'
    assert (env1['OMP_NUM_THREADS'], env1['TVM_NUM_THREADS'], env1['MKL_NUM_THREADS']) == ('1', '1', '7')
    assert argv2[argv2.index('-n') + 1] == '2'
    assert (env2['OMP_NUM_THREADS'], env2['MKL_NUM_THREADS']) == ('8', '7')
    runner = FakeRunner(0, 0)
    run([], runner, devices='1', cpus=16)
    assert 'OMP_NUM_THREADS' not in runner.calls[1][1], 'phase 2 in-process (-n 0) keeps the default pools'


def test_a_failing_phase_1_still_runs_phase_2():
    runner = FakeRunner(1, 0)
    code, out = run([], runner)
    assert (code, len(runner.calls)) == (1, 2)
    assert 'two-phase run: FAILED' in out


def test_fail_fast_skips_phase_2():
    runner = FakeRunner(1)
    code, out = run(['--fail-fast'], runner)
    assert (code, len(runner.calls)) == (1, 1)
    assert out.splitlines()[-1] == '  phase 2: -m large_npu_mem -n 2: not run'


def test_an_interrupted_phase_1_stops_the_run():
    runner = FakeRunner(2)
    assert run([], runner)[0] == 2
    assert len(runner.calls) == 1


def test_command_line_errors_run_nothing():
    runner = FakeRunner()
    code, out = run(['tests', '-n', '4'], runner)
    assert code == 4
    assert "two_phase: error: '-n': set the worker counts with --phase1-workers / --phase2-workers" in out
    assert run([], runner, devices='lots')[0] == 4
    code, out = run([], runner, memory='80G')
    assert code == 4
    assert "two_phase: error: OPS_TILELANG_DEVICE_MEMORY_MB='80G' is not a device memory size" in out
    code, out = run(['--npu-mem-threshold=lots'], runner)
    assert (code, out) == (4, "two_phase: error: --npu-mem-threshold 'lots': expected a number of MB >= 0")
    assert run(['--dry-run'], runner, devices='0', memory='80G')[0] == 0, 'without a device the memory is not read'


@pytest.mark.parametrize(
    ('args', 'env', 'message'),
    [
        (
            ['tests', '-m', 'npu or'],
            {},
            "Wrong expression passed to '-m': npu or: at column 7: expected not OR left parenthesis OR identifier",
        ),
        (['-K', 'hidden=4096 or'], {}, '-K: expected a comparison, got the end at column 15'),
        (['-Khidden'], {}, "-K: expected a comparison (= == != < <= > >=) after 'hidden', got the end"),
        ([], {'OPS_TILELANG_TEST_LEVEL': '7'}, "OPS_TILELANG_TEST_LEVEL='7' is not a test level"),
    ],
)
def test_the_selection_is_checked_once_before_any_phase(args, env, message):
    runner = FakeRunner()
    code, out = run(args, runner, env=env)
    assert (code, runner.calls) == (4, [])
    assert out.startswith(f'two_phase: error: {message}')


def test_a_usage_error_in_phase_1_stops_the_run():
    runner = FakeRunner(4)
    assert run([], runner)[0] == 4
    assert len(runner.calls) == 1, 'phase 2 would refuse the same arguments'


def test_dry_run_prints_the_threshold_and_both_commands():
    args = ['--dry-run', 'tests/engram', '-m', 'npu and not benchmark', '-k', 'x y']
    code, out = run(args, FakeRunner(), devices='1')
    assert code == 0
    assert out.splitlines() == [
        'threshold: --npu-mem-threshold 8985 (device share: 143771 MB / 16 workers; min with npu_mem default 15000)',
        'phase 1: OPS_TILELANG_DEVICE_COUNT=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 '
        f"TVM_NUM_THREADS=1 {PY} -m pytest -m '(npu and not benchmark) and (not large_npu_mem)' "
        "-n 16 --dist worksteal --npu-mem-threshold 8985 tests/engram -k 'x y'",
        f"phase 2: OPS_TILELANG_DEVICE_COUNT=1 {PY} -m pytest -m '(npu and not benchmark) and (large_npu_mem)' "
        "-n 0 --npu-mem-threshold 8985 tests/engram -k 'x y'",
    ]


def test_the_subprocess_runner_echoes_output_and_keeps_the_summary_line(capfd):
    summary = '\\x1b[32m==== 2 passed, 1 deselected in 0.50s ====\\x1b[0m'  # coloured, as with PY_COLORS=1
    child = f"print('collected'); print('{summary}'); raise SystemExit(1)"
    result = two_phase.run_subprocess([PY, '-c', child], {})
    assert (result.returncode, result.summary) == (1, '2 passed, 1 deselected in 0.50s')
    assert 'collected' in capfd.readouterr().out


CONFTEST = """
pytest_plugins = ['tests.testing.plugins.npu_mem']

def pytest_configure(config):
    config.addinivalue_line('markers', 'npu: needs the (fake) device')
"""

TESTS = """
import pytest

@pytest.mark.npu
def test_profiled_small():
    pass

@pytest.mark.npu
def test_profiled_large():
    pass

@pytest.mark.npu
def test_not_profiled():
    pass

def test_cpu_fails():
    raise AssertionError('phase 1 fails')
"""


def test_a_real_two_phase_run(pytester, monkeypatch):
    from tests.testing.mem_profiles import make_record, render_profile

    monkeypatch.setenv('PYTEST_DISABLE_PLUGIN_AUTOLOAD', '1')
    monkeypatch.setenv('OPS_TILELANG_DEVICE_COUNT', '0')
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_split=TESTS)
    mib = 2**20
    records = {
        f'test_split.py::test_profiled_{size}': make_record(
            allocated_bytes=peak, reserved_bytes=peak, outside_allocator_bytes=0, method='m', device='d'
        )
        for size, peak in (('small', 100 * mib), ('large', 20000 * mib))
    }
    pytester.mkdir('npu_mem_profiles').joinpath('test_split.json').write_text(render_profile('test_split.py', records))
    result = pytester.run(
        PY, '-m', 'cann_ops_pipeline.two_phase', '--phase1-workers', '0', '--phase2-workers', '0',
        '-p', 'xdist', '-p', 'no:cacheprovider', '-m', 'npu or not npu',
    )  # fmt: skip
    assert result.ret == 1, 'phase 1 failed, phase 2 passed'
    result.stdout.fnmatch_lines(
        [
            'two-phase run: FAILED',
            '  --npu-mem-threshold 15000 (npu_mem default; no device)',
            "  phase 1: -m '(npu or not npu) and (not large_npu_mem)' -n 0: exit 1 (tests failed), selected 2, *",
            "  phase 2: -m '(npu or not npu) and (large_npu_mem)' -n 0: exit 0 (passed), selected 2, *",
        ]
    )


GATED_CONFTEST = (
    CONFTEST
    + """
import os, time

def pytest_sessionstart(session):
    if os.environ.get('CANN_OPS_PHASE_GATE'):  # the phase started ahead
        with open('phase2_started_up', 'w') as f:
            f.write(repr(time.time()))
"""
)

GATED_TESTS = """
import time
import pytest

def test_cpu_slow():
    time.sleep(1.5)
    with open('phase1_end', 'w') as f:
        f.write(repr(time.time()))
    assert not FAIL

@pytest.mark.npu
def test_not_profiled():
    with open('phase2_test_start', 'w') as f:
        f.write(repr(time.time()))
"""


def _gated_run(pytester, monkeypatch, *args, fail: bool):
    monkeypatch.setenv('PYTEST_DISABLE_PLUGIN_AUTOLOAD', '1')
    monkeypatch.setenv('OPS_TILELANG_DEVICE_COUNT', '0')
    pytester.makeconftest(GATED_CONFTEST)
    pytester.makepyfile(test_gated=f'FAIL = {fail}\n' + GATED_TESTS)
    return pytester.run(
        PY, '-m', 'cann_ops_pipeline.two_phase', '--phase1-workers', '0', '--phase2-workers', '0', *args,
        '-p', 'xdist', '-p', 'no:cacheprovider', '-m', 'npu or not npu', '-v',
    )  # fmt: skip


def test_phase_2_starts_up_during_phase_1_and_tests_after_it(pytester, monkeypatch):
    result = _gated_run(pytester, monkeypatch, fail=False)
    assert result.ret == 0, result.stdout.str()
    started_up, phase1_end, phase2_test = (
        float(pytester.path.joinpath(name).read_text())
        for name in ('phase2_started_up', 'phase1_end', 'phase2_test_start')
    )
    assert started_up < phase1_end <= phase2_test
    out = result.stdout.str()
    assert out.index('test_cpu_slow') < out.index('==> phase 2') < out.index('test_not_profiled'), 'phase 2 shown after'


def test_a_phase_started_ahead_with_nothing_selected_ends_during_phase_1(pytester, monkeypatch):
    """Nothing for phase 2 (no device test): its process ends without waiting for the gate, before phase 1's
    test is done, and the run passes."""
    monkeypatch.setenv('PYTEST_DISABLE_PLUGIN_AUTOLOAD', '1')
    monkeypatch.setenv('OPS_TILELANG_DEVICE_COUNT', '0')
    pytester.makeconftest(
        GATED_CONFTEST
        + """
def pytest_unconfigure(config):
    if os.environ.get('CANN_OPS_PHASE_GATE'):
        with open('phase2_ended', 'w') as f:
            f.write(repr(time.time()))
"""
    )
    pytester.makepyfile(test_gated='FAIL = False\n' + GATED_TESTS.split('@pytest.mark.npu')[0])
    result = pytester.run(
        PY, '-m', 'cann_ops_pipeline.two_phase', '--phase1-workers', '0', '--phase2-workers', '0',
        '-p', 'xdist', '-p', 'no:cacheprovider', '-m', 'npu or not npu',
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    phase2_ended, phase1_end = (float(pytester.path.joinpath(n).read_text()) for n in ('phase2_ended', 'phase1_end'))
    assert phase2_ended < phase1_end
    result.stdout.fnmatch_lines(["  phase 2: -m '(npu or not npu) and (large_npu_mem)' -n 0: exit 5 (no tests*"])


def test_a_stopped_run_ends_the_phase_started_ahead(pytester, monkeypatch):
    result = _gated_run(pytester, monkeypatch, '--fail-fast', fail=True)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["  phase 2: -m '(npu or not npu) and (large_npu_mem)' -n 0: not run"])
    assert not pytester.path.joinpath('phase2_test_start').exists()
    assert not list(Path(tempfile.gettempdir()).glob('two_phase_gate_*/open')), 'no gate left behind'


def test_the_gate_holds_until_its_file_exists(tmp_path):
    gate = tmp_path / 'open'
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 3:
            phase_gate.open_gate(gate)

    phase_gate.wait_for_gate(gate, poll=0.01, sleep=sleep)
    assert polls == [0.01] * 3
    phase_gate.wait_for_gate(gate, sleep=lambda s: pytest.fail('an open gate is not waited for'))


def test_a_phase_whose_runner_has_gone_stops_waiting(tmp_path):
    parents = iter([100, 100, 1])  # reparented to init: the runner died
    with pytest.raises(phase_gate.RunnerGone, match='pid 100'):
        phase_gate.wait_for_gate(tmp_path / 'open', sleep=lambda s: None, parent=lambda: next(parents))


def test_a_terminated_runner_ends_the_phase_it_started_ahead(pytester, monkeypatch):
    """SIGTERM to the runner while phase 1 runs: phase 2, waiting at its gate, is ended too."""
    monkeypatch.setenv('PYTEST_DISABLE_PLUGIN_AUTOLOAD', '1')
    monkeypatch.setenv('OPS_TILELANG_DEVICE_COUNT', '0')
    pytester.makeconftest(GATED_CONFTEST)
    pytester.makepyfile(test_gated='FAIL = False\nimport time\ntime.sleep(0)\n' + GATED_TESTS.replace('1.5', '30'))
    proc = subprocess.Popen(
        [PY, '-m', 'cann_ops_pipeline.two_phase', '--phase1-workers', '0', '--phase2-workers', '0',
         '-p', 'xdist', '-p', 'no:cacheprovider', '-m', 'npu or not npu'],
        cwd=pytester.path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    started_up = pytester.path / 'phase2_started_up'
    deadline = time.monotonic() + 60
    while not started_up.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started_up.exists(), 'phase 2 did not start up during phase 1'
    proc.terminate()
    assert proc.wait(timeout=30) != 0
    deadline = time.monotonic() + 10
    while _waiting_at_a_gate(pytester.path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _waiting_at_a_gate(pytester.path), 'phase 2 left waiting at its gate'


def _waiting_at_a_gate(cwd: Path) -> list[str]:
    """Command lines of live processes in `cwd` started with the gate plugin (Linux /proc)."""
    found = []
    for proc in Path('/proc').glob('[0-9]*'):
        try:
            argv = (proc / 'cmdline').read_bytes().split(b'\0')
            here = Path(os.readlink(proc / 'cwd')) == cwd
        except OSError:
            continue
        if here and b'cann_ops_pipeline.phase_gate' in argv:
            found.append(b' '.join(argv).decode(errors='replace'))
    return found
