"""`invoke new-op` end to end: the generated operator works.

The test scaffolds foo/foo_bar (foo2/foo2_bar, ... when the working package has a `foo` domain already) into a
temporary copy of the repository's needed parts and runs child processes there: ruff over the generated
files, and one child whose results it reads: an import probe, forked off before anything imports the
package, and a pytest run of the generated test file (CPU tier: Ascend and CUDA lowering, contract tests,
the torch.library forms on fake tensors pass; device tests skip with the reason on a CPU, run and pass where
an accelerator is) and of the project-wide tests that walk every public operator (PROJECT_WIDE). The
generated tests run at this run's test level, at most 1.

A module of its own: the longest test of a run's start (tests/testing/plugins/longest_first.py deals files,
and a file's heaviest test starts first only when it is the file).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cann_ops_pipeline import conventions, scaffold
from tests.pipeline.test_scaffold import PACKAGE, ROOT, RUFF, requires_ruff

pytestmark = requires_ruff


# The project-wide tests that walk every public operator (run in the copy, with the new public operator): each
# must pass with a scaffolded operator as generated.
PROJECT_WIDE = (
    'tests/engram/test_torch_ops.py::test_every_public_operator_has_its_ops',
    'tests/engram/test_engram_host_time.py::test_every_public_engram_operator_has_a_host_record',
)


def copy_repository_parts(destination: Path) -> None:
    """What the generated tests need: pyproject, the three packages, tests/conftest.py and tests/testing/; and
    the modules of PROJECT_WIDE (with what they import)."""
    ignore = shutil.ignore_patterns('__pycache__', '*.pyc')
    shutil.copy(ROOT / 'pyproject.toml', destination / 'pyproject.toml')
    # The test plugins use the pipeline package, the shared test tools the emulator's Ascend facts.
    for package in (PACKAGE, 'packages/cann_ops_pipeline', 'packages/cann_ops_ascend_emu'):
        shutil.copytree(ROOT / package, destination / package, ignore=ignore)
    (destination / 'tests/engram').mkdir(parents=True)
    modules = {test.split('::')[0].removeprefix('tests/') for test in PROJECT_WIDE} | {'engram/host_overhead.py'}
    for name in ('__init__.py', 'conftest.py', 'engram/__init__.py', *sorted(modules)):
        shutil.copy(ROOT / 'tests' / name, destination / 'tests' / name)
    shutil.copytree(ROOT / 'tests/testing', destination / 'tests/testing', ignore=ignore)


def child_level() -> int:
    """The level the generated tests run at: this run's, at most 1 (level 2 only widens their shapes)."""
    return min(conventions.test_level_from_env(), 1)


def child_env(root: Path) -> dict[str, str]:
    """This environment for a child run in the copy: the copy first on PYTHONPATH, the other entries kept
    (a pre-provisioned host may need them for torch_npu or tilelang), this checkout's own left out; the
    level of child_level."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(('OPS_TILELANG_', 'PYTEST_'))}
    ours = {str(ROOT), str(ROOT / 'packages')}
    kept = [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p and p not in ours]
    env['PYTHONPATH'] = os.pathsep.join([str(root), str(root / 'packages'), *kept])
    env[conventions.LEVEL_ENV] = str(child_level())
    return env


def unused_domain(root: Path) -> str:
    """'foo', or 'foo2', 'foo3', ... when the copied package already has that domain (a user's `new-op`)."""
    for number in range(1, 100):
        domain = 'foo' if number == 1 else f'foo{number}'
        if not (root / PACKAGE / domain).exists() and not (root / 'tests' / domain).exists():
            return domain
    raise AssertionError('no unused domain name foo, foo2, ... foo99')


def has_accelerator() -> bool:
    from cann_ops_tilelang import config

    return config.is_ascend_available() or config.is_cuda_available()


def test_unused_domain_skips_operators_the_user_generated(tmp_path):
    assert unused_domain(tmp_path) == 'foo'
    (tmp_path / PACKAGE / 'foo').mkdir(parents=True)
    (tmp_path / 'tests' / 'foo2').mkdir(parents=True)
    assert unused_domain(tmp_path) == 'foo3'


def test_child_env_keeps_the_other_pythonpath_entries(tmp_path, monkeypatch):
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join([str(ROOT), '/opt/vendor/python', str(ROOT / 'packages')]))
    monkeypatch.setenv('OPS_TILELANG_TEST_LEVEL', '2')
    env = child_env(tmp_path)
    assert env['PYTHONPATH'].split(os.pathsep) == [str(tmp_path), str(tmp_path / 'packages'), '/opt/vendor/python']
    assert env['OPS_TILELANG_TEST_LEVEL'] == '1'


@pytest.mark.parametrize(('level', 'expected'), [('0', '0'), ('1', '1'), ('2', '1'), (None, '1')])
def test_child_runs_at_this_runs_level_at_most_1(tmp_path, monkeypatch, level, expected):
    if level is None:
        monkeypatch.delenv('OPS_TILELANG_TEST_LEVEL', raising=False)
    else:
        monkeypatch.setenv('OPS_TILELANG_TEST_LEVEL', level)
    assert child_env(tmp_path)['OPS_TILELANG_TEST_LEVEL'] == expected


@dataclasses.dataclass(frozen=True)
class Generated:
    """A copy of the repository with a public and an experimental operator scaffolded, each in a new domain."""

    root: Path
    domain: str
    op: str
    experimental_domain: str
    experimental_op: str
    files: list[str]  # created or edited


@pytest.fixture(scope='module')
def generated(tmp_path_factory) -> Generated:
    root = tmp_path_factory.mktemp('repository')
    copy_repository_parts(root)
    domain = unused_domain(root)
    op = f'{domain}_bar'
    public = scaffold.new_operator(root, f'{domain}/{op}', public=True)
    experimental_domain = unused_domain(root)  # a domain the root package does not import
    experimental_op = f'{experimental_domain}_baz'
    experimental = scaffold.new_operator(root, f'{experimental_domain}/{experimental_op}')
    files = public.created + public.edited + experimental.created + experimental.edited
    return Generated(root, domain, op, experimental_domain, experimental_op, files)


def import_probe(generated: Generated) -> str:
    """A fresh interpreter's view of the copy. First (PROBE root package ok): the public operator through the
    root package, the experimental one only through its domain, which the root package imports (every
    domain). Then (PROBE ops ok): importing the root package declared both operators and registered their
    forms. Before both: every package comes from the copy (an editable install of this checkout would
    otherwise stand in for one the copy lacks)."""
    op, domain = generated.op, generated.domain
    experimental_domain, experimental_op = generated.experimental_domain, generated.experimental_op
    return (
        'import sys\n'
        'import torch\n'
        'import cann_ops_ascend_emu, cann_ops_pipeline, cann_ops_tilelang\n'
        'for package in (cann_ops_ascend_emu, cann_ops_pipeline, cann_ops_tilelang):\n'
        f'    assert package.__file__.startswith({str(generated.root / "packages")!r}), package.__file__\n'
        'import cann_ops_tilelang as c\n'
        'ops = torch.ops.cann_ops_tilelang\n'
        f"assert c.{op} is c.{domain}.{op} and '{op}' in c.__all__\n"
        f"assert 'cann_ops_tilelang.{experimental_domain}' in sys.modules\n"
        f"assert not hasattr(c, '{experimental_op}') and '{experimental_op}' not in c.__all__\n"
        f'assert callable(c.{experimental_domain}.{experimental_op})\n'
        "print('PROBE root package ok', flush=True)\n"
        'from cann_ops_tilelang.operator import OPERATORS\n'
        f"assert OPERATORS['{op}'] is c.{op}.operator\n"
        f"assert OPERATORS['{experimental_op}'] is c.{experimental_domain}.{experimental_op}.operator\n"
        f"assert ops.{op}.default._schema.name == 'cann_ops_tilelang::{op}'\n"
        f'schema = ops.{op}_out.default._schema\n'
        "assert [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write] == ['out']\n"
        f"assert ops.{experimental_op}.default._schema.name == 'cann_ops_tilelang::{experimental_op}'\n"
        "print('PROBE ops ok', flush=True)\n"
    )


# One child process for the probe and the pytest run: it imports torch and tilelang (seconds of a start-up)
# once, then forks the probe, which thus starts before anything imported cann_ops_tilelang, as a fresh
# interpreter would, and whose imports leave the pytest run untouched; the run goes on in the parent.
LAUNCHER = """
import os, sys, traceback
import torch, tilelang

probe, probe_output = sys.argv[1], sys.argv[2]
pid = os.fork()
if pid == 0:
    fd = os.open(probe_output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 0
    try:
        exec(compile(open(probe).read(), probe, 'exec'), {'__name__': '__main__'})
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

import pytest

code = pytest.main(sys.argv[3:])
status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
with open(probe_output, 'a') as f:  # after the probe has written its own lines
    print('PROBE exit status', status, file=f)
sys.exit(code)
"""


@dataclasses.dataclass(frozen=True)
class ChildRuns:
    """What the child in the copy said: the import probe's output, and the pytest run of the generated test
    file together with PROJECT_WIDE, with its testcase outcomes by (module, test name)."""

    probe: str
    pytest: subprocess.CompletedProcess
    outcomes: dict[tuple[str, str], list[str]]

    def failure_text(self) -> str:
        return self.pytest.stdout[-4000:] + self.pytest.stderr[-4000:]


@pytest.fixture(scope='module')
def child_runs(generated) -> ChildRuns:
    """The probe and the pytest run (see LAUNCHER)."""
    root = generated.root
    probe, probe_output, report = root / 'probe.py', root / 'probe.txt', root / 'report.xml'
    probe.write_text(import_probe(generated), encoding='utf-8')
    pytest_args = [f'tests/{generated.domain}/test_{generated.op}.py', *PROJECT_WIDE]
    pytest_args += ['-p', 'no:cacheprovider', '-q', f'--junitxml={report}']
    run = subprocess.run(
        [sys.executable, '-c', LAUNCHER, str(probe), str(probe_output), *pytest_args],
        cwd=root,
        env=child_env(root),
        capture_output=True,
        text=True,
        timeout=600,
    )
    outcomes: dict[tuple[str, str], list[str]] = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter('testcase'):
            name = case.get('name').split('[')[0].replace(generated.op, 'foo_bar')
            skipped = case.find('skipped')
            failed = case.find('failure') is not None or case.find('error') is not None
            outcome = 'failed' if failed else 'passed' if skipped is None else f'skipped: {skipped.get("message")}'
            outcomes.setdefault((case.get('classname'), name), []).append(outcome)
    probe_text = probe_output.read_text(encoding='utf-8') if probe_output.exists() else run.stderr[-4000:]
    return ChildRuns(probe_text, run, outcomes)


def test_generated_operators_pass_their_tests_and_have_their_ops(generated, child_runs):
    """On a CPU the device tests skip with the reason; on a machine with an accelerator they run and pass.
    Importing the root package declares both operators and registers their forms, and the project-wide tests
    that walk every public operator pass with the new one.

    One test for everything the child run says: the run is a module-scoped fixture, and xdist's worksteal
    would hand two tests that share it to two workers, each then scaffolding and running the child."""
    tmp_path, domain, op = generated.root, generated.domain, generated.op

    for command in (['check', '--no-cache'], ['format', '--no-cache', '--check', '--diff']):
        result = subprocess.run([*RUFF, *command, *generated.files], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr

    # Public through the root package; experimental through its domain, which the root imports on first use.
    assert 'PROBE root package ok' in child_runs.probe, child_runs.probe

    # The run holds PROJECT_WIDE too (judged below): exit 1 may be theirs.
    assert child_runs.pytest.returncode in (0, 1), child_runs.failure_text()
    module = f'tests.{domain}.test_{op}'
    outcomes = {name: found for (classname, name), found in child_runs.outcomes.items() if classname == module}
    cpu_tier = [
        'test_foo_bar_ascend_kernel_lowers',
        'test_foo_bar_cuda_kernel_lowers',
        'test_foo_bar_config_rejects_unsupported_dtype',
        'test_foo_bar_rejects_non_tensor',
        'test_foo_bar_rejects_dtype',
        'test_foo_bar_rejects_non_contiguous',
        'test_foo_bar_rejects_too_many_elements',
        'test_foo_bar_rejects_out',
        'test_foo_bar_refuses_cpu_tensors',
        'test_foo_bar_is_declared',
        'test_foo_bar_op_is_registered',
        'test_foo_bar_fake_output',
        'test_foo_bar_fake_calls_raise_the_typed_errors',
        'test_foo_bar_compiles_into_one_graph',
    ]
    device_tier = [
        'test_foo_bar_values',
        'test_foo_bar_empty',
        'test_foo_bar_prints_kernel_source',
        'test_foo_bar_config',
        'test_foo_bar_opcheck',
    ]
    assert sorted(outcomes) == sorted([*cpu_tier, *device_tier, 'test_foo_bar_benchmark']), child_runs.failure_text()
    for name in cpu_tier:
        assert set(outcomes[name]) == {'passed'}, (name, outcomes[name], child_runs.failure_text())
    # 2 dtypes x the template's shapes: 3 at level 0, 7 from level 1 on.
    params = 2 * (3 if child_level() == 0 else 7)
    assert len(outcomes['test_foo_bar_ascend_kernel_lowers']) == params
    assert len(outcomes['test_foo_bar_fake_output']) == params
    device = has_accelerator()
    for name in device_tier:
        if device:
            assert set(outcomes[name]) == {'passed'}, (name, outcomes[name])
        else:
            assert all(o.startswith('skipped: needs an accelerator') for o in outcomes[name]), (name, outcomes[name])
    assert all(o.startswith('skipped') for o in outcomes['test_foo_bar_benchmark'])  # needs --run-benchmark

    assert 'PROBE ops ok' in child_runs.probe and 'PROBE exit status 0' in child_runs.probe, child_runs.probe  # noqa: PT018
    for test in PROJECT_WIDE:
        path, name = test.split('::')
        junit_classname = path.removesuffix('.py').replace('/', '.')
        assert child_runs.outcomes.get((junit_classname, name)) == ['passed'], (test, child_runs.failure_text())
