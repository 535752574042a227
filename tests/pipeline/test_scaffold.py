"""`invoke new-op`: name rules, no overwrite, rollback, edits of the __init__.py files, next steps, the invoke task.

That the generated operator works end to end is test_scaffold_end_to_end.py.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from cann_ops_pipeline import file_transaction, scaffold, scaffold_names
from cann_ops_pipeline.scaffold import ScaffoldError

ROOT = Path(__file__).resolve().parents[2]


PACKAGE = 'packages/cann_ops_tilelang'
try:
    RUFF = scaffold._ruff()  # the scaffold's own: this interpreter's ruff, else the one on PATH
    RUFF_MISSING = ''
except ScaffoldError as exc:
    RUFF, RUFF_MISSING = None, str(exc)
# new-op formats what it writes with the pinned ruff of the dev extra; a machine's own Python without it (a
# pre-provisioned accelerator host under --no-venv --no-install) cannot scaffold, and says so.
requires_ruff = pytest.mark.skipif(RUFF is None, reason=RUFF_MISSING)
pytestmark = requires_ruff


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root (caches aside) with its content."""
    return {
        p.relative_to(root).as_posix(): p.read_text(encoding='utf-8')
        for p in sorted(root.rglob('*'))
        if p.is_file() and '__pycache__' not in p.parts
    }


def directories(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob('*') if p.is_dir() and '__pycache__' not in p.parts}


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding='utf-8')


ROOT_INIT = '''"""Root package."""

__version__ = '0.1.0'

__all__: list[str] = []
'''

ENGRAM_INIT = '''"""Engram."""

from .engram_fused_weight import engram_fused_weight

__all__ = ['engram_fused_weight']
'''


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A minimal repository: the root package with modules, an engram domain, non-domain test folders."""
    write(
        tmp_path,
        {
            f'{PACKAGE}/__init__.py': ROOT_INIT,
            f'{PACKAGE}/config.py': '',
            f'{PACKAGE}/validation.py': '',
            f'{PACKAGE}/kernel_target.py': '',
            f'{PACKAGE}/engram/__init__.py': ENGRAM_INIT,
            f'{PACKAGE}/engram/_contract.py': '',
            f'{PACKAGE}/engram/engram_fused_weight.py': '',
            f'{PACKAGE}/engram/engram_fused_weight_kernel.py': '',
            f'{PACKAGE}/engram/engram_grad_w_reduce_kernel.py': '',  # its interface not written yet
            'tests/__init__.py': '',
            'tests/conftest.py': '',
            'tests/engram/__init__.py': '',
            'tests/testing/__init__.py': '',
            'tests/pipeline/__init__.py': '',
        },
    )
    return tmp_path


# --- names ---------------------------------------------------------------------------------------


def test_valid_names():
    name = scaffold.parse_operator_name('foo/foo_bar')
    assert (name.domain, name.operator, name.class_prefix) == ('foo', 'foo_bar', 'FooBar')
    assert scaffold.parse_operator_name(' engram2/engram2_gate_v3 ').class_prefix == 'Engram2GateV3'


@pytest.mark.parametrize(
    ('spec', 'match'),
    [
        ('foo_bar', 'expected "<domain>/<operator>"'),
        ('foo/foo_bar/baz', 'expected "<domain>/<operator>"'),
        ('/foo_bar', 'expected "<domain>/<operator>"'),
        ('foo/', 'expected "<domain>/<operator>"'),
        ('foo/bar', r"must start with its domain prefix 'foo_': use 'foo_bar' \(invoke new-op foo/foo_bar\)"),
        ('foo/barfoo_x', "use 'foo_barfoo_x'"),
        ('Foo/foo_bar', r"domain name 'Foo' is not snake_case.*\(e\.g\. 'foo'\)"),
        ('foo/fooBar', r"operator name 'fooBar' is not snake_case.*\(e\.g\. 'foo_bar'\)"),
        ('foo/foo-bar', r"not snake_case.*\(e\.g\. 'foo_bar'\)"),
        ('foo/foo__bar', 'not snake_case'),
        ('foo/foo_bar_', 'not snake_case'),
        ('_foo/_foo_bar', 'not snake_case'),
        ('1foo/1foo_bar', 'not snake_case'),
        ('class/class_x', "domain name 'class' is a Python keyword"),
        ('match/match_x', "domain name 'match' is a Python keyword"),
        ('os/os_path', "shadows the standard-library module 'os'"),
        ('sre/sre_parse', "operator name 'sre_parse' shadows the standard-library module"),
        ('list/list_x', "shadows the Python builtin 'list'"),
        ('testing/testing_x', "domain name 'testing' is reserved"),
        ('torch/torch_x', "domain name 'torch' is reserved"),
        ('foo/foo_kernel', "ends with '_kernel'"),
        ('foo/foo_bar_ref', "ends with '_ref'"),
        (
            'foo/foo_bar_out',
            r"ends with '_out', which names the out= torch.library op .*cann_ops_tilelang::foo_bar_out",
        ),
        ('foo/foo_' + 'x' * 40, 'longer than 40 characters'),
    ],
)
def test_invalid_names(spec, match):
    with pytest.raises(ScaffoldError, match=match):
        scaffold.parse_operator_name(spec)


@pytest.mark.parametrize(
    ('spec', 'match'),
    [
        ('engram/engram_fused_weight', r"'engram_fused_weight' exists already \(packages/.*/engram_fused_weight"),
        ('engram/engram_grad_w_reduce', "'engram_grad_w_reduce' exists already"),
        ('validation/validation_x', "domain 'validation' would shadow packages/cann_ops_tilelang/validation"),
        ('kernel/kernel_target', "operator 'kernel_target' clashes with packages/cann_ops_tilelang/kernel_target"),
        ('pipeline/pipeline_x', "domain name 'pipeline' is reserved"),
    ],
)
def test_clashes_with_the_tree(tree, spec, match):
    before = snapshot(tree)
    with pytest.raises(ScaffoldError, match=match):
        scaffold.new_operator(tree, spec)
    assert snapshot(tree) == before


def test_clash_with_root_exports_and_orphan_test_folders(tree):
    write(tree, {f'{PACKAGE}/__init__.py': ROOT_INIT.replace('= []', "= ['bar_baz']"), 'tests/qux/x.txt': ''})
    with pytest.raises(ScaffoldError, match=r"'bar_baz' exists already \(packages/cann_ops_tilelang/__init__.py\)"):
        scaffold.new_operator(tree, 'bar/bar_baz')
    with pytest.raises(ScaffoldError, match='tests/qux exists but packages/cann_ops_tilelang/qux/ is no domain'):
        scaffold.new_operator(tree, 'qux/qux_x')


# An operator on the operator mechanism, with a form whose name is not the operator's.
ENGRAM_GATE = '''"""Gate."""

from cann_ops_tilelang.operator import Operator

OP = Operator('engram_gate', check=None, choose_config=None, get_kernel=None)
_out = OP.define('engram_gate_out', '(Tensor x, Tensor(a!) out) -> ()', None, None)
_nosave = OP.define('engram_gate_nosave', '(Tensor x) -> Tensor', None, None)
_extra = OP.define('engram_extra_out', '(Tensor x, Tensor(a!) out) -> ()', None, None)
_side = OP.define('engram_side_nosave', '(Tensor x) -> Tensor', None, None)
'''


@pytest.mark.parametrize(
    ('spec', 'match'),
    [
        (
            'engram_side/engram_side_nosave',
            r'engram_side_nosave is registered already \(packages/.*/engram/engram_gate.py',
        ),
        ('engram/engram_extra', 'op cann_ops_tilelang::engram_extra_out is registered already'),  # its out= form
        ('engram/engram_gate_nosave', r'engram_gate_nosave is registered already \(packages/.*/engram/engram_gate.py'),
        ('foo/foo_x', None),  # foo_x_out is nobody's
    ],
    ids=['other-domain', 'out-form', 'declared-form', 'free'],
)
def test_clash_with_registered_ops(tree, spec, match):
    write(tree, {f'{PACKAGE}/engram/engram_gate.py': ENGRAM_GATE})
    registered = scaffold.registered_op_names(tree)
    assert registered['engram_gate'] == registered['engram_gate_out'] == f'{PACKAGE}/engram/engram_gate.py'
    if match is None:
        scaffold.plan_operator(tree, spec)
        return
    before = snapshot(tree)
    with pytest.raises(ScaffoldError, match=match):
        scaffold.new_operator(tree, spec)
    assert snapshot(tree) == before


def test_not_a_repository_root(tmp_path):
    with pytest.raises(ScaffoldError, match='is not the repository root'):
        scaffold.new_operator(tmp_path, 'foo/foo_bar')


# --- no overwrite, rollback ----------------------------------------------------------------------


def test_creates_the_files_of_the_workflow(tree):
    plan = scaffold.new_operator(tree, 'foo/foo_bar')
    assert plan.created == [
        f'{PACKAGE}/foo/__init__.py',
        f'{PACKAGE}/foo/foo_bar.py',
        f'{PACKAGE}/foo/foo_bar_kernel.py',
        f'{PACKAGE}/foo/_foo_bar_ascend.py',
        f'{PACKAGE}/foo/_foo_bar_cuda.py',
        'tests/foo/__init__.py',
        'tests/foo/test_foo_bar.py',
        'tests/foo/foo_bar_ref.py',
    ]
    # Not public: the root package only imports the new domain, which registers its operators' forms.
    assert plan.edited == [f'{PACKAGE}/__init__.py']
    root_init = (tree / PACKAGE / '__init__.py').read_text()
    assert root_init == ROOT_INIT.replace(
        '\n\n__version__', '\n\nfrom cann_ops_tilelang import foo as foo\n\n__version__'
    )
    kernel = (tree / PACKAGE / 'foo/foo_bar_kernel.py').read_text()
    for needle in (
        'class FooBarConfig',
        'def choose_foo_bar_config(',
        'def make_foo_bar_kernel(',
        'from ._foo_bar_ascend import ascend_foo_bar_kernel\n',
        'from ._foo_bar_cuda import cuda_foo_bar_kernel\n',
    ):
        assert needle in kernel
    assert '@functools.cache\ndef get_foo_bar_kernel(' in kernel
    for backend in ('ascend', 'cuda'):
        source = (tree / PACKAGE / f'foo/_foo_bar_{backend}.py').read_text()
        assert f'def {backend}_foo_bar_kernel(cfg):' in source
        assert '    def foo_bar_kernel(\n' in source  # the prim_func's name, which the tests look for
        assert 'foo_bar_kernel import' not in source  # the backends do not import the kernel module: no circle
    interface = (tree / PACKAGE / 'foo/foo_bar.py').read_text()
    for needle in (
        "OP = Operator(\n    'foo_bar',\n    tensor('x', TILELANG_DTYPES),",
        "    out('out', like='x'),",
        'launcher = OP.plan(x, out)',
        "@OP.public(_eager, returns='Tensor', fake=_fake)\ndef foo_bar(x: torch.Tensor, *, out: torch.Tensor | None",
    ):
        assert needle in interface
    registered = scaffold.registered_op_names(tree)
    assert registered['foo_bar'] == registered['foo_bar_out'] == f'{PACKAGE}/foo/foo_bar.py'  # the mechanism's forms
    assert scaffold.exported_names((tree / PACKAGE / 'foo/__init__.py').read_text()) == ['foo_bar']
    assert '_torch_ops' not in '\n'.join(snapshot(tree / PACKAGE / 'foo').values())  # each operator registers itself

    # A second operator of the domain: only the domain's __init__.py is edited (the root imports it already).
    plan = scaffold.new_operator(tree, 'foo/foo_baz')
    assert plan.edited == [f'{PACKAGE}/foo/__init__.py']
    assert scaffold.exported_names((tree / PACKAGE / 'foo/__init__.py').read_text()) == ['foo_bar', 'foo_baz']
    assert (tree / PACKAGE / '__init__.py').read_text().count('import foo as foo') == 1

    # An existing domain the root package does not import yet, public: the domain import and the export.
    plan = scaffold.new_operator(tree, 'engram/engram_gate_bwd', public=True)
    assert plan.created == [
        f'{PACKAGE}/engram/engram_gate_bwd.py',
        f'{PACKAGE}/engram/engram_gate_bwd_kernel.py',
        f'{PACKAGE}/engram/_engram_gate_bwd_ascend.py',
        f'{PACKAGE}/engram/_engram_gate_bwd_cuda.py',
        'tests/engram/test_engram_gate_bwd.py',
        'tests/engram/engram_gate_bwd_ref.py',
    ]
    assert plan.edited == [f'{PACKAGE}/engram/__init__.py', f'{PACKAGE}/__init__.py']
    engram_init = (tree / PACKAGE / 'engram/__init__.py').read_text()
    assert scaffold.exported_names(engram_init) == ['engram_fused_weight', 'engram_gate_bwd']
    root_init = (tree / PACKAGE / '__init__.py').read_text()
    for line in (
        'from cann_ops_tilelang import engram as engram\n',
        'from cann_ops_tilelang import foo as foo\n',
        'from cann_ops_tilelang.engram import engram_gate_bwd\n',
    ):
        assert line in root_init
    assert scaffold.exported_names(root_init) == ['engram_gate_bwd']


def test_the_longest_names_fit_the_line_length(tree):
    # Every template line holding a name stays within ruff's 120 columns for the longest operator name.
    spec = 'f/f_' + 'x' * (scaffold_names.MAX_OPERATOR_LENGTH - 2)
    plan = scaffold.plan_operator(tree, spec, public=True)
    assert len(plan.name.operator) == scaffold_names.MAX_OPERATOR_LENGTH
    assert all(len(line) <= 120 for change in plan.changes for line in change.content.splitlines())


def test_never_overwrites(tree):
    scaffold.new_operator(tree, 'foo/foo_bar')
    before = snapshot(tree)
    with pytest.raises(ScaffoldError, match="'foo_bar' exists already"):
        scaffold.new_operator(tree, 'foo/foo_bar', public=True)
    # A stray file where a new one would go: refused before anything is written.
    write(tree, {'tests/foo/foo_baz_ref.py': 'keep me\n'})
    before = snapshot(tree)
    with pytest.raises(ScaffoldError, match='refusing to overwrite existing files: tests/foo/foo_baz_ref.py'):
        scaffold.new_operator(tree, 'foo/foo_baz', public=True)
    assert snapshot(tree) == before


def test_plan_is_rechecked_before_writing(tree):
    plan = scaffold.plan_operator(tree, 'foo/foo_bar', public=True)
    write(tree, {f'{PACKAGE}/__init__.py': ROOT_INIT + '# edited meanwhile\n'})
    before = snapshot(tree)
    with pytest.raises(ScaffoldError, match='changed since the plan was made'):
        scaffold.apply_plan(plan)
    assert snapshot(tree) == before


def test_unsupported_init_is_refused_before_any_write(tree):
    write(tree, {f'{PACKAGE}/engram/__init__.py': ENGRAM_INIT + '__all__ += ["x"]\n'})
    before = snapshot(tree)
    with pytest.raises(ScaffoldError, match='__all__ must be one literal list; edit it by hand'):
        scaffold.new_operator(tree, 'engram/engram_x')
    assert snapshot(tree) == before


def failing_writer(fail_at: int, error: BaseException):
    """A writer that behaves like the real one except at its `fail_at`-th call, which raises."""
    calls = []
    real = file_transaction.write_file

    def write(path, text, *, new):
        calls.append(path)
        if len(calls) == fail_at:
            raise error
        real(path, text, new=new)

    return write


@pytest.mark.parametrize('error', [OSError('disk full'), KeyboardInterrupt()], ids=['OSError', 'KeyboardInterrupt'])
@pytest.mark.parametrize('fail_at', [1, 5, 9])
def test_rollback_of_a_new_domain(tree, fail_at, error):
    before, dirs = snapshot(tree), directories(tree)
    plan = scaffold.plan_operator(tree, 'foo/foo_bar', public=True)
    assert len(plan.changes) == 9  # the root __init__.py edit is the last write
    with pytest.raises(type(error)):
        scaffold.apply_plan(plan, write=failing_writer(fail_at, error))
    assert snapshot(tree) == before
    assert directories(tree) == dirs  # packages/.../foo/ and tests/foo/ removed again


@pytest.mark.parametrize('fail_at', [2, 6])
def test_rollback_restores_edited_init_files(tree, fail_at):
    before = snapshot(tree)
    plan = scaffold.plan_operator(tree, 'engram/engram_gate_bwd', public=True)
    assert plan.changes[0].path == f'{PACKAGE}/engram/__init__.py'  # edited first, restored on failure
    with pytest.raises(OSError, match='disk full'):
        scaffold.apply_plan(plan, write=failing_writer(fail_at, OSError('disk full')))
    assert snapshot(tree) == before


def test_rollback_of_a_second_operator_of_a_domain(tree):
    scaffold.new_operator(tree, 'foo/foo_bar')
    before = snapshot(tree)
    plan = scaffold.plan_operator(tree, 'foo/foo_baz')
    assert [c.path for c in plan.changes if not c.is_new] == [f'{PACKAGE}/foo/__init__.py']
    with pytest.raises(OSError, match='disk full'):  # the last write, after the edit
        scaffold.apply_plan(plan, write=failing_writer(len(plan.changes), OSError('disk full')))
    assert snapshot(tree) == before


# --- editing __init__.py -------------------------------------------------------------------------

LONG = ['foo_' + c * 30 for c in 'acdef']  # names long enough that __all__ and imports need several lines
DOMAIN_INITS = {
    'empty_all': '"""Doc."""\n\n__all__: list[str] = []\n',
    'sorted_insert': (
        '"""Doc."""\n\nfrom .foo_a import foo_a\nfrom .foo_c import foo_c\n\n__all__ = [\'foo_a\', \'foo_c\']\n'
    ),
    'natural_order_tuple': "from .foo_b10 import foo_b10\n\n__all__ = ('foo_b10',)\n",
    'exploded_all': "from .foo_a import foo_a\n\n__all__ = [\n    'foo_a',\n]\n",
    'no_all': '"""Doc."""\n',
    'other_sections': (
        '"""Doc."""\n\nfrom __future__ import annotations\n\nimport os\n\nX = os.sep\n__all__ = [\'X\']\n'
    ),
    'long_all': ''.join(f'from .{n} import {n}\n' for n in LONG) + f'\n__all__ = {LONG!r}\n',
}
ROOT_INITS = {
    'no_imports': ROOT_INIT,
    'future_only': '"""Doc."""\n\nfrom __future__ import annotations\n\n__all__: list[str] = []\n',
    'same_domain_merge': (
        '"""Doc."""\n\nfrom cann_ops_tilelang.engram import engram_a, engram_c\n\n'
        "__version__ = '0.1.0'\n\n__all__ = ['engram_a', 'engram_c']\n"
    ),
    'long_merge': f'from cann_ops_tilelang.foo import {", ".join(LONG[1:])}\n\n__all__ = {LONG[1:]!r}\n',
}


def test_domain_export_of_the_engram_form():
    text = scaffold.add_domain_export('"""Engram."""\n\n__all__: list[str] = []\n', 'engram_x')
    assert text == '"""Engram."""\n\nfrom .engram_x import engram_x\n\n__all__: list[str] = [\'engram_x\']\n'


def test_root_export_of_the_initial_form():
    text = scaffold.add_root_export(ROOT_INIT, 'foo', 'foo_bar')
    assert text == (
        '"""Root package."""\n\nfrom cann_ops_tilelang.foo import foo_bar\n\n'
        "__version__ = '0.1.0'\n\n__all__: list[str] = ['foo_bar']\n"
    )
    text = scaffold.add_root_export(text, 'engram', 'engram_x')
    assert 'from cann_ops_tilelang.engram import engram_x\nfrom cann_ops_tilelang.foo import foo_bar\n' in text
    text = scaffold.add_root_export(text, 'foo', 'foo_baz')
    assert 'from cann_ops_tilelang.foo import foo_bar, foo_baz\n' in text
    assert scaffold.exported_names(text) == ['engram_x', 'foo_bar', 'foo_baz']


def imports_of(text: str) -> set[tuple[str, int, str]]:
    return {
        (node.module, node.level, alias.name)
        for node in ast.parse(text).body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_edited_init_files_are_ruff_clean(tmp_path):
    shutil.copy(ROOT / 'pyproject.toml', tmp_path / 'pyproject.toml')
    for case, text in DOMAIN_INITS.items():
        edited = scaffold.add_domain_export(text, 'foo_b', path=case)
        assert 'foo_b' in scaffold.exported_names(edited)
        assert ('foo_b', 1, 'foo_b') in imports_of(edited)
        write(tmp_path, {f'domain_{case}/__init__.py': edited})
    for case, text in ROOT_INITS.items():
        domain = 'engram' if 'engram' in text else 'foo'
        edited = scaffold.add_root_export(text, domain, f'{domain}_b', path=case)
        assert f'{domain}_b' in scaffold.exported_names(edited)
        assert (f'cann_ops_tilelang.{domain}', 0, f'{domain}_b') in imports_of(edited)
        write(tmp_path, {f'root_{case}/__init__.py': edited})
    for command in (['check', '--no-cache', '.'], ['format', '--no-cache', '--check', '--diff', '.']):
        result = subprocess.run([*RUFF, *command], cwd=tmp_path, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ('text', 'match'),
    [
        ("__all__ = ['foo_a']\n__all__ = ['foo_a']\n", '__all__ is assigned 2 times'),
        ('__all__ = sorted(NAMES)\n', '__all__ is not a literal list of strings'),
        ("__all__ = ['foo_b']\n", "'foo_b' is already in __all__"),
        ("from .foo_b import foo_b\n__all__ = ['foo_a']\n", "'foo_b' is imported already"),
        ('__all__ = [\n', 'does not parse'),
    ],
)
def test_init_files_it_will_not_edit(text, match):
    with pytest.raises(ScaffoldError, match=match):
        scaffold.add_domain_export(text, 'foo_b')


def test_comments_in_all_are_kept():
    text = scaffold.add_domain_export("__all__ = [\n    'foo_a',  # the first\n    'foo_c',\n]\n", 'foo_b')
    assert text == (
        "from .foo_b import foo_b\n\n__all__ = [\n    'foo_a',  # the first\n    'foo_b',\n    'foo_c',\n]\n"
    )


# --- the root package's domain imports ---------------------------------------------------------


@pytest.mark.parametrize(
    'text',
    [
        'from cann_ops_tilelang import foo as foo\n',
        'from cann_ops_tilelang import engram, foo\n',
        'from . import foo\n',
    ],
)
def test_a_domain_imported_already_is_left_alone(text):
    assert scaffold.add_root_domain_import(text, 'foo') == text


def test_root_domain_imports_are_ruff_clean(tmp_path):
    shutil.copy(ROOT / 'pyproject.toml', tmp_path / 'pyproject.toml')
    real = (ROOT / PACKAGE / '__init__.py').read_text()  # the repository's own root package, as it is now
    cases = {**ROOT_INITS, 'repository': real}
    edited = scaffold.ruff_fix_and_format(
        {f'root_{case}/__init__.py': scaffold.add_root_domain_import(text, 'foo') for case, text in cases.items()}
    )
    write(tmp_path, edited)
    for path, text in edited.items():
        assert ('cann_ops_tilelang', 0, 'foo') in imports_of(text), path
        assert scaffold.add_root_domain_import(text, 'foo') == text, path  # once
    for command in (['check', '--no-cache', '.'], ['format', '--no-cache', '--check', '--diff', '.']):
        result = subprocess.run([*RUFF, *command], cwd=tmp_path, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


# --- next steps ----------------------------------------------------------------------------------


@pytest.mark.parametrize('public', [True, False], ids=['public', 'experimental'])
def test_next_steps_name_the_emulator_run(tree, public):
    """A kernel with wrong math still lowers: the steps name the run that catches it on a CPU-only machine."""
    steps = scaffold.next_steps(scaffold.plan_operator(tree, 'foo/foo_bar', public=public))
    commands = [step.split('   # ')[0] for step in steps]
    assert commands[:5] == [
        'python -m pytest tests/foo/test_foo_bar.py -q',
        'OPS_TILELANG_TEST_LEVEL=0 python -m pytest tests/foo/test_foo_bar.py -q -m npu --ascend-emulator',
        'OPS_TILELANG_TEST_LEVEL=0 python -m pytest tests/foo/test_foo_bar.py -m "not benchmark"',
        'python -m pytest tests/engram/test_torch_ops.py tests/engram/test_engram_host_time.py -q '
        '-m "not npu and not benchmark"',
        'ruff check . && ruff format --check .',
    ]
    assert 'no values' in steps[0]
    assert "catches a kernel's wrong math" in steps[1]
    assert ('experimental' in steps[-1]) is not public


def test_invoke_task(tmp_path, capsys):
    from invoke import Context, Exit

    from tasks import new_op, ns

    assert 'new-op' in ns.task_names
    write(tmp_path, {f'{PACKAGE}/__init__.py': ROOT_INIT, 'tests/__init__.py': ''})
    before = snapshot(tmp_path)
    new_op.new_op(Context(), 'foo/foo_bar', public=True, dry_run=True, root=str(tmp_path))
    assert snapshot(tmp_path) == before
    assert f'would edit    {PACKAGE}/__init__.py' in capsys.readouterr().out
    with pytest.raises(Exit, match="must start with its domain prefix 'foo_'"):
        new_op.new_op(Context(), 'foo/bar', root=str(tmp_path))
    new_op.new_op(Context(), 'foo/foo_bar', root=str(tmp_path))
    assert f'create  {PACKAGE}/foo/foo_bar_kernel.py' in capsys.readouterr().out
    assert (tmp_path / PACKAGE / 'foo/foo_bar.py').is_file()
    with pytest.raises(Exit, match="'foo_bar' exists already") as info:
        new_op.new_op(Context(), 'foo/foo_bar', root=str(tmp_path))
    assert info.value.code == 4


def test_invoke_task_says_it_rolled_back(tmp_path, monkeypatch, capsys):
    from invoke import Context, Exit

    from tasks import new_op

    write(tmp_path, {f'{PACKAGE}/__init__.py': ROOT_INIT, 'tests/__init__.py': ''})
    before = snapshot(tmp_path)
    monkeypatch.setattr(file_transaction, 'write_file', failing_writer(3, PermissionError(13, 'Permission denied')))
    with pytest.raises(Exit) as info:
        new_op.new_op(Context(), 'foo/foo_bar', public=True, root=str(tmp_path))
    assert info.value.code == 1
    assert info.value.message == (
        'new-op: writing failed ([Errno 13] Permission denied); rolled back: the files it had created are removed '
        'and the edited ones restored, the tree is as before'
    )
    assert snapshot(tmp_path) == before
    assert capsys.readouterr().out == ''
