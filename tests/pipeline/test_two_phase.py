"""The two-phase runner: argv building, phase split, exit-code combination, and one real run."""

from __future__ import annotations

import sys

import pytest

from cann_ops_pipeline import two_phase
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
    with pytest.raises(SystemExit):
        two_phase.parse_command_line(['--phase2-workers', bad])
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
        'py', '-m', 'pytest', '-m', '(npu) and (not large_npu_mem)', '-n', '8', 'tests', '-x'
    ]  # fmt: skip
    phase2_argv = two_phase.phase_argv(phase2, None, [], python='py')
    assert phase2_argv == ['py', '-m', 'pytest', '-m', 'large_npu_mem', '-n', '2']


@pytest.mark.parametrize(
    ('devices', 'cpus', 'expected'), [(2, 16, (8, 2)), (1, 16, (4, 1)), (0, 2, (2, 1)), (0, 0, (1, 1))]
)
def test_default_workers(devices, cpus, expected):
    assert two_phase.default_workers(devices, cpus) == expected


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


def run(argv, runner, devices='2'):
    lines = []
    code = two_phase.run(
        argv, runner=runner, environ={'OPS_TILELANG_DEVICE_COUNT': devices}, cpu_count=lambda: 6, out=lines.append
    )
    return code, '\n'.join(lines)


def test_both_phases_run_with_the_extra_args_and_the_device_count():
    runner = FakeRunner(0, 5)
    code, out = run(['tests/engram', '-m', 'npu', '-x'], runner)
    assert code == 0
    argv1, argv2 = (argv for argv, _ in runner.calls)
    assert argv1[3:] == ['-m', '(npu) and (not large_npu_mem)', '-n', '8', 'tests/engram', '-x']
    assert argv2[3:] == ['-m', '(npu) and (large_npu_mem)', '-n', '2', 'tests/engram', '-x']
    assert all(env['OPS_TILELANG_DEVICE_COUNT'] == '2' for _, env in runner.calls)
    assert out.splitlines()[-3:] == [
        'two-phase run: passed',
        "  phase 1: -m '(npu) and (not large_npu_mem)' -n 8: exit 0 (passed), selected 3, 1.2 s "
        '[3 passed, 1 deselected in 1.00s]',
        "  phase 2: -m '(npu) and (large_npu_mem)' -n 2: exit 5 (no tests selected), selected 3, 1.2 s "
        '[3 passed, 1 deselected in 1.00s]',
    ]


def test_without_devices_phase_1_uses_the_cpus():
    runner = FakeRunner(0, 0)
    run(['--phase2-workers', '0'], runner, devices='0')
    assert [argv[6] for argv, _ in runner.calls] == ['6', '0']


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


def test_dry_run_prints_both_commands():
    code, out = run(['--dry-run', '-k', 'x y'], FakeRunner())
    assert code == 0
    assert out.splitlines() == [
        f"phase 1: OPS_TILELANG_DEVICE_COUNT=2 {PY} -m pytest -m 'not large_npu_mem' -n 8 -k 'x y'",
        f"phase 2: OPS_TILELANG_DEVICE_COUNT=2 {PY} -m pytest -m large_npu_mem -n 2 -k 'x y'",
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
            "  phase 1: -m '(npu or not npu) and (not large_npu_mem)' -n 0: exit 1 (tests failed), selected 2, *",
            "  phase 2: -m '(npu or not npu) and (large_npu_mem)' -n 0: exit 0 (passed), selected 2, *",
        ]
    )
