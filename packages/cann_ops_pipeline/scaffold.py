"""Scaffold a new operator the way the operator workflow prescribes (`invoke new-op`).

`new_operator(root, 'foo/foo_bar', public=False)` creates, under the repository `root`, an operator on the
operator mechanism (cann_ops_tilelang.operator):

- `packages/cann_ops_tilelang/foo/__init__.py` when the domain is new, else adds
  `from .foo_bar import foo_bar` and the `__all__` entry to it;
- `packages/cann_ops_tilelang/foo/foo_bar.py`: its declaration to `Operator` (arguments and contract,
  configuration choice), its eager path and the public function under `@OP.public`, which registers
  the torch.library forms `cann_ops_tilelang::foo_bar` and `foo_bar_out` when the module is imported;
  `foo_bar_kernel.py` (config, config choice, `make_foo_bar_kernel` and the cached `get_foo_bar_kernel`);
  the prim_funcs `foo_bar_kernel` of the two backends in `_foo_bar_ascend.py` and `_foo_bar_cuda.py`;
- `tests/foo/__init__.py` when missing, `tests/foo/test_foo_bar.py` and `tests/foo/foo_bar_ref.py`;
- in the root `packages/cann_ops_tilelang/__init__.py`: `from cann_ops_tilelang import foo as foo` when it does
  not import the domain yet (every domain is imported by the root package); with `public=True` also
  `from cann_ops_tilelang.foo import foo_bar` and the `__all__` entry (without it the operator is
  experimental, reachable as `cann_ops_tilelang.foo.foo_bar` only).

The generated operator is a working example (an elementwise copy of a bf16/fp32 tensor) whose
tests pass as generated. Three jobs, three modules: the naming rules (`scaffold_names`), the files
(this module: templates, `__init__.py` edits, then the pinned ruff sorts imports and `__all__` and formats
every generated file with the repository's settings), and the all-or-nothing writer (`file_transaction`).
Everything is planned and checked before the first write; nothing is overwritten.

Standard library and ruff; no import of torch or tilelang.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import shutil
import string
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from cann_ops_pipeline.file_transaction import FileChange, TreeChangedError, apply_changes
from cann_ops_pipeline.scaffold_names import (
    RESERVED_NAMES,
    OperatorName,
    ScaffoldError,
    parse_operator_name,
)

__all__ = [
    'RESERVED_NAMES',
    'FileChange',
    'OperatorName',
    'Plan',
    'ScaffoldError',
    'add_domain_export',
    'add_root_domain_import',
    'add_root_export',
    'apply_plan',
    'existing_operators',
    'exported_names',
    'new_operator',
    'next_steps',
    'op_names',
    'parse_operator_name',
    'plan_operator',
    'registered_op_names',
    'ruff_fix_and_format',
]

TEMPLATES = Path(__file__).resolve().parent / 'templates'
PACKAGE = 'cann_ops_tilelang'
RUFF_CONFIG = Path(__file__).resolve().parents[2] / 'pyproject.toml'  # the repository's [tool.ruff]


@dataclasses.dataclass(frozen=True)
class Plan:
    root: Path
    name: OperatorName
    public: bool
    changes: tuple[FileChange, ...]

    @property
    def created(self) -> list[str]:
        return [c.path for c in self.changes if c.is_new]

    @property
    def edited(self) -> list[str]:
        return [c.path for c in self.changes if not c.is_new]


# --- ruff: import order, __all__ order, formatting, line length -------------------------------


def _ruff() -> list[str]:
    """The pinned ruff of the dev extra: this interpreter's, else the one on PATH."""
    if importlib.util.find_spec('ruff') is not None:
        return [sys.executable, '-m', 'ruff']
    found = shutil.which('ruff')
    if found is None:
        raise ScaffoldError(
            'new-op formats the generated files with ruff: install the dev extra (pip install -e .[dev])'
        )
    return [found]


def ruff_fix_and_format(files: dict[str, str]) -> dict[str, str]:
    """The files (relative path -> text) with imports and `__all__` sorted (`ruff check --select I,RUF022
    --fix`) and formatted (`ruff format`) under the repository's ruff settings; a line ruff cannot bring
    under the line length (E501) is a ScaffoldError."""
    ruff = _ruff()
    config = ['--config', str(RUFF_CONFIG), '--no-cache']
    with tempfile.TemporaryDirectory(prefix='new-op-') as tmp:
        paths = {name: Path(tmp, name) for name in files}
        for name, path in paths.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[name], encoding='utf-8')
        argv = [str(p) for p in paths.values()]
        steps = (
            ['check', '--select', 'I,RUF022', '--fix', '--exit-zero', '--quiet'],
            ['format', '--quiet'],
            ['check', '--select', 'E501', '--output-format', 'concise', '--quiet'],
        )
        for step in steps:
            done = subprocess.run([*ruff, *step, *config, *argv], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                problems = (done.stdout + done.stderr).strip().replace(f'{tmp}{os.sep}', '')
                raise ScaffoldError(f'ruff {step[0]} of the generated files: {problems}; choose shorter names')
        return {name: path.read_text(encoding='utf-8') for name, path in paths.items()}


# --- editing __init__.py files -----------------------------------------------------------------


def _parse(text: str, path: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as error:
        raise ScaffoldError(f'{path} does not parse: {error}') from None


def _dunder_all(tree: ast.Module, path: str) -> ast.Assign | ast.AnnAssign | None:
    found = []
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == '__all__' for t in targets):
            if isinstance(node, ast.AugAssign) or (isinstance(node, ast.Assign) and len(node.targets) != 1):
                raise ScaffoldError(f'{path}:{node.lineno}: __all__ must be one literal list; edit it by hand')
            found.append(node)
    if len(found) > 1:
        raise ScaffoldError(f'{path}: __all__ is assigned {len(found)} times; edit it by hand')
    return found[0] if found else None


def _literal_names(node: ast.Assign | ast.AnnAssign, path: str) -> list[str]:
    value = node.value
    if not isinstance(value, (ast.List, ast.Tuple)) or not all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
    ):
        raise ScaffoldError(f'{path}:{node.lineno}: __all__ is not a literal list of strings; edit it by hand')
    return [e.value for e in value.elts]


def exported_names(text: str, path: str = '<module>') -> list[str]:
    """The names of a module's literal `__all__` (empty when it has none)."""
    tree = _parse(text, path)
    node = _dunder_all(tree, path)
    return [] if node is None else _literal_names(node, path)


def _add_export(text: str, path: str, import_line: str, name: str) -> str:
    """`text` with `import_line` among its imports and `name` in its `__all__`, roughly placed: ruff puts
    both where they belong (ruff_fix_and_format)."""
    tree = _parse(text, path)
    node = _dunder_all(tree, path)
    names = [] if node is None else _literal_names(node, path)
    if name in names:
        raise ScaffoldError(f'{path}: {name!r} is already in __all__')
    for statement in tree.body:
        imports = statement.names if isinstance(statement, (ast.Import, ast.ImportFrom)) else []
        if any((alias.asname or alias.name.split('.')[0]) == name for alias in imports):
            raise ScaffoldError(f'{path}:{statement.lineno}: {name!r} is imported already')
    lines = text.splitlines()
    if node is None:
        lines += ['', f"__all__ = ['{name}']"]
    else:  # just inside the opening bracket, which keeps comments and the layout; ruff sorts the entries
        row, column = node.value.lineno - 1, node.value.col_offset + 1  # both literals open with one character
        entry = f"'{name}'" + (', ' if names else '')
        line = lines[row].encode()
        lines[row] = (line[:column] + entry.encode() + line[column:]).decode()
    _insert_imports(lines, tree, [import_line])
    return '\n'.join(lines) + '\n'


def _insert_imports(lines: list[str], tree: ast.Module, import_lines: list[str]) -> None:
    """`import_lines` into `lines` (the source of `tree`) just below the docstring: one import block with the
    module's first imports, which ruff sorts and merges (a `from __future__` import stays first)."""
    body = tree.body
    has_docstring = bool(body) and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    at = body[0].end_lineno if has_docstring else 0
    lines[at:at] = ['', *import_lines, '']


def _domain_import(operator: str) -> str:
    return f'from .{operator} import {operator}'


def _root_import(domain: str, operator: str) -> str:
    return f'from {PACKAGE}.{domain} import {operator}'


def add_domain_export(text: str, operator: str, path: str = '__init__.py') -> str:
    """A domain `__init__.py` with `from .<operator> import <operator>` and the `__all__` entry."""
    edited = _add_export(text, path, _domain_import(operator), operator)
    return _checked(ruff_fix_and_format({'__init__.py': edited})['__init__.py'], path, operator)


def add_root_export(text: str, domain: str, operator: str, path: str = '__init__.py') -> str:
    """The root `__init__.py` with `from cann_ops_tilelang.<domain> import <operator>` and `__all__`."""
    edited = _add_export(text, path, _root_import(domain, operator), operator)
    return _checked(ruff_fix_and_format({'__init__.py': edited})['__init__.py'], path, operator)


def _imports_domain(tree: ast.Module, domain: str) -> bool:
    """Whether a root `__init__.py` imports the domain subpackage by name (`from cann_ops_tilelang import
    <domain>`, `from . import <domain>`, with or without `as`)."""
    return any(
        isinstance(node, ast.ImportFrom)
        and ((node.level == 0 and node.module == PACKAGE) or (node.level == 1 and node.module is None))
        and any(alias.name == domain for alias in node.names)
        for node in tree.body
    )


def add_root_domain_import(text: str, domain: str, path: str = '__init__.py') -> str:
    """The root `__init__.py` with `from cann_ops_tilelang import <domain> as <domain>` (unchanged when it imports
    the domain already): every domain is an attribute of the root package from its import on, so that an
    experimental operator is `cann_ops_tilelang.<domain>.<op>` and its torch.library forms are registered."""
    tree = _parse(text, path)
    if _imports_domain(tree, domain):
        return text
    lines = text.splitlines()
    _insert_imports(lines, tree, [f'from {PACKAGE} import {domain} as {domain}'])
    return '\n'.join(lines) + '\n'


def op_names(operator: str) -> tuple[str, str]:
    """The torch.library forms of a scaffolded operator: the functional one and the out= one."""
    return operator, f'{operator}_out'


def _registered_in(tree: ast.Module) -> list[str]:
    """The op names a module registers: the first argument of each `Operator('<name>', ...)` (and
    `<name>_out` where it declares an `out(...)` argument, whose form the mechanism registers) and of each
    `<op>.define('<form>', ...)`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, 'id', None)
            first = node.args[0]
            if callee in ('Operator', 'define') and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append(first.value)
                if callee == 'Operator' and any(_calls(arg, 'out') for arg in node.args[1:]):
                    found.append(f'{first.value}_out')
    return found


def _calls(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, 'id', None) == name


def registered_op_names(root: Path) -> dict[str, str]:
    """Op name -> the module of the package that registers it (see _registered_in)."""
    found: dict[str, str] = {}
    for domain in _domains(root / 'packages' / PACKAGE):
        for module in sorted(domain.glob('*.py')):
            try:
                tree = ast.parse(_read(module))
            except SyntaxError:
                continue  # its domain's import fails anyway; a new operator there is refused when it is edited
            for name in _registered_in(tree):
                found.setdefault(name, module.relative_to(root).as_posix())
    return found


def _checked(text: str, path: str, name: str) -> str:
    """The edited module still parses and exports `name`."""
    if name not in exported_names(text, path):
        raise ScaffoldError(f'{path}: internal error, {name!r} missing from __all__ after the edit')
    return text


# --- rendering ----------------------------------------------------------------------------------


def render_template(template: str, name: OperatorName) -> str:
    """A template of `templates/` with the names filled in (made ruff-clean by ruff_fix_and_format)."""
    raw = (TEMPLATES / template).read_text(encoding='utf-8')
    return string.Template(raw).substitute(domain=name.domain, op=name.operator, Op=name.class_prefix)


# --- the tree -----------------------------------------------------------------------------------


def _read(path: Path) -> str:
    return path.read_text(encoding='utf-8')


def _domains(package: Path) -> list[Path]:
    return sorted(
        d
        for d in package.iterdir()
        if d.is_dir() and not d.name.startswith(('_', '.')) and (d / '__init__.py').is_file()
    )


def existing_operators(root: Path) -> dict[str, str]:
    """Operator name -> where it lives: every domain's modules and `__all__`, the root `__all__`."""
    package = root / 'packages' / PACKAGE
    found: dict[str, str] = {}
    for domain in _domains(package):
        for module in sorted(domain.glob('*.py')):
            if not module.name.startswith('_'):
                found.setdefault(module.stem.removesuffix('_kernel'), module.relative_to(root).as_posix())
        for exported in _exports_or_nothing(domain / '__init__.py'):
            found.setdefault(exported, (domain / '__init__.py').relative_to(root).as_posix())
    for exported in _exports_or_nothing(package / '__init__.py'):
        found.setdefault(exported, (package / '__init__.py').relative_to(root).as_posix())
    return found


def _exports_or_nothing(path: Path) -> list[str]:
    try:
        return exported_names(_read(path), str(path))
    except ScaffoldError:
        return []


def _check_tree(root: Path, name: OperatorName) -> None:
    package = root / 'packages' / PACKAGE
    tests = root / 'tests'
    if not (package / '__init__.py').is_file() or not tests.is_dir():
        raise ScaffoldError(f'{root} is not the repository root: packages/{PACKAGE}/__init__.py or tests/ missing')
    domains = {d.name for d in _domains(package)}
    project_modules = {p.stem for p in package.iterdir() if p.name not in domains and not p.name.startswith('.')}
    test_folders = {p.stem for p in tests.iterdir() if p.name not in domains and not p.name.startswith('.')}
    domain, operator = name.domain, name.operator
    operators = existing_operators(root)

    if domain not in domains:
        if domain in project_modules:
            raise ScaffoldError(f'domain {domain!r} would shadow packages/{PACKAGE}/{domain} (not a domain package)')
        if domain in test_folders:
            raise ScaffoldError(
                f'domain {domain!r}: tests/{domain} exists but packages/{PACKAGE}/{domain}/ is no domain package'
            )
        if domain in operators:
            raise ScaffoldError(f'domain {domain!r} clashes with the operator {domain!r} ({operators[domain]})')
    if operator in operators:
        raise ScaffoldError(f'operator {operator!r} exists already ({operators[operator]})')
    if operator in domains or operator in project_modules:
        raise ScaffoldError(f'operator {operator!r} clashes with packages/{PACKAGE}/{operator}')
    registered = registered_op_names(root)
    for op_name in op_names(operator):
        if op_name in registered:
            raise ScaffoldError(f'op {PACKAGE}::{op_name} is registered already ({registered[op_name]})')


def plan_operator(root: str | os.PathLike, spec: str, *, public: bool = False) -> Plan:
    """Every file `new_operator` would create or edit, with contents; checks names and tree, writes nothing."""
    root = Path(root).resolve()
    name = parse_operator_name(spec)
    _check_tree(root, name)
    domain, op = name.domain, name.operator
    package_dir = f'packages/{PACKAGE}/{domain}'
    tests_dir = f'tests/{domain}'
    changes: list[FileChange] = []

    domain_init = root / package_dir / '__init__.py'
    if domain_init.is_file():
        original = _read(domain_init)
        edited = _add_export(original, str(domain_init), _domain_import(op), op)
        changes.append(FileChange(f'{package_dir}/__init__.py', edited, original))
    else:
        changes.append(FileChange(f'{package_dir}/__init__.py', render_template('domain_init.py.tmpl', name)))
    for template, path in (
        ('operator.py.tmpl', f'{op}.py'),
        ('operator_kernel.py.tmpl', f'{op}_kernel.py'),
        ('operator_ascend.py.tmpl', f'_{op}_ascend.py'),
        ('operator_cuda.py.tmpl', f'_{op}_cuda.py'),
    ):
        changes.append(FileChange(f'{package_dir}/{path}', render_template(template, name)))
    if not (root / tests_dir / '__init__.py').is_file():
        changes.append(FileChange(f'{tests_dir}/__init__.py', ''))
    changes.append(FileChange(f'{tests_dir}/test_{op}.py', render_template('test_operator.py.tmpl', name)))
    changes.append(FileChange(f'{tests_dir}/{op}_ref.py', render_template('operator_ref.py.tmpl', name)))
    # The root package imports every domain by name (experimental operators too); public: also the export.
    root_init = root / 'packages' / PACKAGE / '__init__.py'
    original = _read(root_init)
    edited = add_root_domain_import(original, domain, str(root_init))
    if public:
        edited = _add_export(edited, str(root_init), _root_import(domain, op), op)
    if edited != original:
        changes.append(FileChange(f'packages/{PACKAGE}/__init__.py', edited, original))

    formatted = ruff_fix_and_format({c.path: c.content for c in changes if c.path.endswith('.py') and c.content})
    changes = [dataclasses.replace(c, content=formatted.get(c.path, c.content)) for c in changes]
    # What ruff made of the edited `__init__.py` files still exports the operator and imports the domain.
    root_path = f'packages/{PACKAGE}/__init__.py'
    for change in changes:
        if change.path == f'{package_dir}/__init__.py' or (change.path == root_path and public):
            _checked(change.content, change.path, op)
        if change.path == root_path and not _imports_domain(_parse(change.content, root_path), domain):
            raise ScaffoldError(f'{root_path}: internal error, the domain {domain!r} is not imported after the edit')
    existing = [c.path for c in changes if c.is_new and os.path.lexists(root / c.path)]
    if existing:
        raise ScaffoldError(f'refusing to overwrite existing files: {", ".join(existing)}')
    return Plan(root, name, public, tuple(changes))


# --- writing ------------------------------------------------------------------------------------


def apply_plan(plan: Plan, *, write: Callable[..., None] | None = None) -> None:
    """Write the plan all or nothing (file_transaction.apply_changes); a tree that moved since the plan
    was made is a ScaffoldError, a failure while writing is rolled back and re-raised."""
    try:
        apply_changes(plan.root, plan.changes, write=write)
    except TreeChangedError as error:
        raise ScaffoldError(str(error)) from None


def new_operator(root: str | os.PathLike, spec: str, *, public: bool = False) -> Plan:
    """Plan, check and write a new operator (see the module docstring); returns the plan written."""
    plan = plan_operator(root, spec, public=public)
    apply_plan(plan)
    return plan


def next_steps(plan: Plan) -> list[str]:
    """What to run after scaffolding, for the task's output: each command with what it checks."""
    domain, op = plan.name.domain, plan.name.operator
    test_file = f'tests/{domain}/test_{op}.py'
    steps = [
        f'python -m pytest {test_file} -q   # CPU tier: lowering, contract, torch.library forms (no values: '
        'a kernel with wrong math passes here)',
        f'OPS_TILELANG_TEST_LEVEL=0 python -m pytest {test_file} -q -m npu --ascend-emulator   # values on a '
        "CPU-only machine: the Ascend kernel on the Ascend C emulator (needs g++ with C++20); catches a kernel's "
        'wrong math',
        f'OPS_TILELANG_TEST_LEVEL=0 python -m pytest {test_file} -m "not benchmark"   # on an NPU or a GPU: '
        'the device tests on the device (the CUDA kernel is checked only on a GPU)',
        'python -m pytest tests/engram/test_torch_ops.py tests/engram/test_engram_host_time.py -q -m "not npu and '
        'not benchmark"   # the project-wide checks of every public operator',
        'ruff check . && ruff format --check .',
    ]
    if not plan.public:
        steps.append(
            f'experimental (not exported by the root package): `from {PACKAGE}.{domain} import {op}`; once it is '
            f'stable, add the import and the __all__ entry to packages/{PACKAGE}/__init__.py'
        )
    return steps
