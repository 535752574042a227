"""The pipeline phases: what each nox session / invoke task runs, and that both front ends list them."""

import subprocess
import sys
from pathlib import Path

import pytest

from cann_ops_pipeline import phases
from cann_ops_pipeline.bytecode_cache import BYTECODE_CACHE_ENV


@pytest.fixture(autouse=True)
def _bytecode_written_by_python(monkeypatch):
    """The steps' environments without the bytecode cache's variables (test_bytecode_cache_reaches_...)."""
    monkeypatch.delenv('PYTHONDONTWRITEBYTECODE', raising=False)


SESSIONS = [
    'lint', 'tests-cpu', 'verify-0', 'verify-1', 'verify-2', 'run-tests',
    'refresh-mem', 'refresh-baseline', 'verify-baseline', 'build-wheel',
]  # fmt: skip


def _pytest_args(step):
    assert step.argv[:3] == ('python', '-m', 'pytest'), step.argv
    return list(step.argv[3:])


def test_cpu_tier_deselects_device_and_benchmark_tests():
    cpu, _ = phases.tests_cpu(['-x'])
    assert _pytest_args(cpu) == ['-m', 'not npu and not benchmark', '-n', 'auto', '-x']
    assert cpu.success_codes == (0,)


def test_cpu_tier_runs_the_device_tests_at_level_0_on_the_emulator():
    _, emulated = phases.tests_cpu(['-x', 'tests/engram'])
    assert _pytest_args(emulated) == [
        '-m', 'npu and not benchmark', '--ascend-emulator', '-n', 'auto', '-x', 'tests/engram'
    ]  # fmt: skip
    assert emulated.env == {'OPS_TILELANG_TEST_LEVEL': '0'}
    assert 'emulated' in emulated.description
    assert emulated.success_codes == (0, 5)  # a selection without device tests is not a failure


@pytest.mark.parametrize(
    ('args', 'renamed'),
    [
        (['--junitxml=build/ci/junit.xml'], ['--junitxml=build/ci/junit-emulated.xml']),
        (['--junitxml', 'junit.xml', '-x'], ['--junitxml', 'junit-emulated.xml', '-x']),
        (['-x'], ['-x']),
    ],
)
def test_the_emulated_step_writes_its_own_junit_report(args, renamed):
    cpu, emulated = phases.tests_cpu(args)
    assert _pytest_args(cpu)[4:] == args
    assert _pytest_args(emulated)[5:] == renamed


@pytest.mark.parametrize('level', [0, 1, 2])
def test_verify_sets_the_level(level):
    (step,) = phases.verify(level, ['tests/engram'], device_count=0)
    assert step.env == {'OPS_TILELANG_TEST_LEVEL': str(level)}
    assert _pytest_args(step) == [
        '-m', 'not benchmark', '--ascend-emulator', '-n', 'auto', '--durations=10', 'tests/engram'
    ]  # fmt: skip


def test_verify_runs_through_the_two_phase_runner_where_a_device_is():
    (step,) = phases.verify(0, ['tests/engram', '-x'], device_count=1)
    assert step.argv == (
        'python', '-m', 'cann_ops_pipeline.two_phase', '-m', 'not benchmark', '--durations=10', 'tests/engram', '-x'
    )  # fmt: skip
    assert step.env['OPS_TILELANG_TEST_LEVEL'] == '0'
    assert str(phases.ROOT / 'packages') in step.env['PYTHONPATH']
    assert 'two-phase' in step.description


DEVICE_SESSIONS = ['run-tests', 'refresh-mem', 'refresh-baseline', 'verify-baseline']


@pytest.mark.parametrize('session', DEVICE_SESSIONS)
def test_device_sessions_check_for_a_device_first(session):
    steps = getattr(phases, session.replace('-', '_'))()
    assert steps[0].argv == ('python', '-m', 'cann_ops_pipeline.require_device', session)
    assert [step.argv[:3] for step in steps].count(steps[0].argv[:3]) == 1
    # the one step a front end may run before it installs anything (nox does: see test_nox_device_check_...)
    assert [step.needs_nothing_installed for step in steps] == [True] + [False] * (len(steps) - 1)


@pytest.mark.parametrize('level', [3, -1, True, '0'])
def test_verify_refuses_unknown_levels(level):
    with pytest.raises(ValueError, match='test level must be one of'):
        phases.verify(level)


def test_refresh_baseline_refreshes_then_verifies_with_the_same_args():
    _, refresh, verify = phases.refresh_baseline(['-K', 'hidden=4096'])
    assert _pytest_args(refresh) == ['-m', 'benchmark', '--run-benchmark', '--refresh-baseline', '-K', 'hidden=4096']
    assert verify == phases.verify_baseline(['-K', 'hidden=4096'])[1]
    args = _pytest_args(verify)
    assert '--refresh-baseline' not in args
    assert '--benchmark-regression-threshold=0.1' in args
    assert '--benchmark-min-delta-us=1.0' in args


def test_memory_profiles_come_from_device_tests():
    _, step = phases.refresh_mem()
    assert _pytest_args(step) == ['-m', 'npu and not benchmark', '--refresh-mem']


def test_pipeline_modules_run_from_the_source_tree():
    for step in [*phases.run_tests(['-x']), phases.build_wheel('dist')[1], phases.verify(1, device_count=1)[0]]:
        assert step.argv[:3] == ('python', '-m', step.argv[2])
        assert str(phases.ROOT / 'packages') in step.env['PYTHONPATH']


def test_bytecode_cache_reaches_every_pytest_step(monkeypatch, tmp_path):
    monkeypatch.setenv('PYTHONDONTWRITEBYTECODE', '1')
    monkeypatch.setenv(BYTECODE_CACHE_ENV, str(tmp_path))
    monkeypatch.delenv('PYTHONPYCACHEPREFIX', raising=False)
    steps = [
        *phases.tests_cpu(), *phases.verify(0, device_count=0), *phases.verify(0, device_count=1),
        *phases.run_tests(), *phases.refresh_mem(), *phases.refresh_baseline(), *phases.verify_baseline(),
    ]  # fmt: skip
    runs = [step for step in steps if step.argv[2] in ('pytest', 'cann_ops_pipeline.two_phase')]
    assert len(runs) == 9
    for step in runs:
        assert step.env['PYTHONDONTWRITEBYTECODE'] == ''
        assert step.env['PYTHONPYCACHEPREFIX'] == str(tmp_path)


def test_the_wheel_check_gets_the_pins():
    dist = str(phases.ROOT / 'dist')
    check = phases.build_wheel('dist', pins=['torch==2.13.0'])[1]
    assert check.argv == ('python', '-m', 'cann_ops_pipeline.wheel_check', dist, '--pin=torch==2.13.0')
    assert phases.build_wheel('dist')[1].argv[-1] == dist  # the running interpreter's versions


@pytest.mark.parametrize(
    ('outdir', 'expected'),
    [(None, phases.ROOT / 'dist'), ('out/wheels', phases.ROOT / 'out' / 'wheels'), ('/abs/dist', Path('/abs/dist'))],
)
def test_the_wheel_folder_is_absolute(outdir, expected):
    """The wheel check installs from a temporary folder: a relative folder would not be found from there."""
    build, check = phases.build_wheel() if outdir is None else phases.build_wheel(outdir)
    assert build.argv[build.argv.index('--outdir') + 1] == str(expected)
    assert check.argv[3] == str(expected)


def test_python_is_resolved_per_front_end():
    step = phases.tests_cpu()[0]
    assert step.resolved_argv('/venv/bin/python')[0] == '/venv/bin/python'
    assert phases.lint()[0].resolved_argv('/x/python')[0] == 'ruff'


def test_nox_lists_every_session():
    listing = subprocess.run(
        [sys.executable, '-m', 'nox', '-l', '-f', str(phases.ROOT / 'noxfile.py')],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    listed = [line.split()[1] for line in listing.splitlines() if line[:2] in ('* ', '- ')]
    assert listed == SESSIONS
    defaults = [line.split()[1] for line in listing.splitlines() if line.startswith('* ')]
    assert defaults == ['lint', 'tests-cpu']


def _description(session: str) -> str:
    """What phases.DESCRIPTIONS says of a nox session (verify-N: the verify text at level N)."""
    level = session.removeprefix('verify-')
    return phases.describe('verify', level) if level.isdigit() else phases.describe(session)


def test_nox_sessions_take_their_descriptions_from_phases():
    listing = subprocess.run(
        [sys.executable, '-m', 'nox', '-l', '-f', str(phases.ROOT / 'noxfile.py')],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    shown = dict(line[2:].split(' -> ', 1) for line in listing.splitlines() if line[:2] in ('* ', '- '))
    assert shown == {name: _description(name) for name in SESSIONS}


def test_invoke_tasks_take_their_descriptions_from_phases():
    from tasks import phases as tasks_phases

    for name in {name for name in SESSIONS if not name.startswith('verify-')}:
        assert getattr(tasks_phases, name.replace('-', '_')).__doc__ == phases.describe(name), name
    assert tasks_phases.verify.__doc__ == phases.describe('verify', 'N (--level)')


def test_the_descriptions_are_worded_once():
    """Neither front end spells a description itself (nor does phases.py a second time)."""
    sources = {path: (phases.ROOT / path).read_text(encoding='utf-8') for path in ('noxfile.py', 'tasks/phases.py')}
    phases_source = Path(phases.__file__).read_text(encoding='utf-8')
    for description in phases.DESCRIPTIONS.values():
        words = description.split('{')[0][:30]
        assert phases_source.count(words) == 1, words
        for path, source in sources.items():
            assert words not in source, (path, words)


def test_invoke_lists_the_same_phases():
    listing = subprocess.run(
        [sys.executable, '-m', 'invoke', '--list'], capture_output=True, text=True, check=True, cwd=phases.ROOT
    ).stdout
    tasks = {line.split()[0] for line in listing.splitlines()[1:] if line.strip()}
    expected = {name for name in SESSIONS if not name.startswith('verify-')} | {'verify'}
    assert expected <= tasks


@pytest.mark.parametrize('level', ['7', 'abc'])
def test_invoke_verify_refuses_a_bad_level_in_one_line(level):
    done = subprocess.run(
        [sys.executable, '-m', 'invoke', 'verify', '--level', level], capture_output=True, text=True, cwd=phases.ROOT
    )
    assert done.returncode == 4
    assert done.stderr == f'verify: --level {level!r} is not a test level: use 0 (core), 1 (default) or 2 (full)\n'
    assert done.stdout == ''


def test_the_readme_set_up_gives_invoke():
    """The README's set-up makes the shared project virtualenv with the dev extra; activated, it has invoke."""
    readme = (phases.ROOT / 'README.md').read_text(encoding='utf-8')
    assert 'source .nox/project/bin/activate' in readme
    pyproject = (phases.ROOT / 'pyproject.toml').read_text(encoding='utf-8')
    dev = pyproject.split('dev = [', 1)[1].split(']', 1)[0]
    assert '"invoke' in dev
    assert '"ruff==' in dev  # new-op formats with it
    assert "'-e', '.[dev]'" in (phases.ROOT / 'noxfile.py').read_text(encoding='utf-8')
    bin_dir = Path(sys.executable).parent
    if '.nox' not in bin_dir.parts:
        pytest.skip('not run from a nox session virtualenv')
    done = subprocess.run([str(bin_dir / 'invoke'), '--list'], capture_output=True, text=True, cwd=phases.ROOT)
    assert done.returncode == 0, done.stderr
    assert 'new-op' in done.stdout
