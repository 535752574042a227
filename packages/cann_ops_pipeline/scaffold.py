"""Scaffold a new operator the way the operator workflow prescribes (`invoke new-op`).

`new_operator(root, 'foo/foo_bar', public=False)` creates, under the repository `root`:

- `packages/cann_ops_tilelang/foo/__init__.py` when the domain is new, else adds
  `from .foo_bar import foo_bar` and the `__all__` entry to it;
- `packages/cann_ops_tilelang/foo/foo_bar.py` (public interface, with the `_eager` / `_fake` halves its
  torch.library ops call) and `foo_bar_kernel.py` (config, config choice, Ascend + CUDA prim_funcs named
  `foo_bar_kernel`, cached compile);
- the ops `cann_ops_tilelang::foo_bar` and `foo_bar_out` (fake kernels, out= declared mutated) appended to
  `packages/cann_ops_tilelang/foo/_torch_ops.py`, which is created when missing and imported by the domain's
  `__init__.py`, so that importing the domain registers them (no device, no compile);
- `tests/foo/__init__.py` when missing, `tests/foo/test_foo_bar.py` and `tests/foo/foo_bar_ref.py`;
- with `public=True` only: `from cann_ops_tilelang.foo import foo_bar` and the `__all__` entry in
  the root `packages/cann_ops_tilelang/__init__.py` (without it the operator is experimental,
  reachable as `cann_ops_tilelang.foo.foo_bar` only).

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
    'add_root_export',
    'add_torch_ops',
    'add_torch_ops_import',
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
TORCH_OPS = '_torch_ops'  # each domain's module of torch.library registrations
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


def _imports_torch_ops(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.ImportFrom)
        and node.level == 1
        and (node.module == TORCH_OPS or (node.module is None and any(a.name == TORCH_OPS for a in node.names)))
        for node in tree.body
    )


def add_torch_ops_import(text: str, path: str = '__init__.py') -> str:
    """A domain `__init__.py` that imports its `_torch_ops` (unchanged when it does): last, as engram's, so the
    ops are registered once the interfaces they call are imported."""
    if _imports_torch_ops(_parse(text, path)):
        return text
    return text.rstrip('\n') + (
        '\n\n# Registers the torch.library ops after the interfaces they call (no device, no compile).\n'
        f'from . import {TORCH_OPS}  # noqa: F401\n'
    )


# What an operator's section of `_torch_ops.py` refers to, with the import that binds each name.
_TORCH_OPS_IMPORTS = {
    'importlib': ('importlib', None, 'import importlib'),
    'torch': ('torch', None, 'import torch'),
    'NAMESPACE': (f'{PACKAGE}._torch_library', 'NAMESPACE', f'from {PACKAGE}._torch_library import NAMESPACE'),
}


def op_names(operator: str) -> tuple[str, str]:
    """The torch.library ops of a scaffolded operator: the functional form and the out= form."""
    return operator, f'{operator}_out'


def _top_level_names(tree: ast.Module) -> dict[str, ast.stmt]:
    names: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.setdefault(node.name, node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.setdefault(alias.asname or alias.name.split('.')[0], node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.setdefault(leaf.id, node)
    return names


def _binds(node: ast.stmt, module: str, name: str | None) -> bool:
    if name is None:
        return isinstance(node, ast.Import) and any(a.name == module and a.asname is None for a in node.names)
    return (
        isinstance(node, ast.ImportFrom)
        and node.level == 0
        and node.module == module
        and any(a.name == name and a.asname is None for a in node.names)
    )


def add_torch_ops(text: str, section: str, path: str = TORCH_OPS + '.py') -> str:
    """A domain's `_torch_ops.py` with an operator's `section` appended (the imports it needs added): refused
    when the module defines one of the section's names already (`_` aside: each fake kernel's), or binds
    `torch`, `importlib` or `NAMESPACE` to something else."""
    tree = _parse(text, path)
    names = _top_level_names(tree)
    for name in _top_level_names(_parse(section, 'the section of the template')):
        if name != '_' and name in names:
            raise ScaffoldError(f'{path}:{names[name].lineno}: {name!r} is defined already; edit it by hand')
    missing = []
    for name, (module, imported, line) in _TORCH_OPS_IMPORTS.items():
        if name not in names:
            missing.append(line)
        elif not _binds(names[name], module, imported):
            raise ScaffoldError(f'{path}:{names[name].lineno}: {name!r} is not `{line}`; edit it by hand')
    lines = text.rstrip('\n').splitlines()
    if missing:
        _insert_imports(lines, tree, missing)
    return '\n'.join(lines) + '\n' + section


def registered_op_names(root: Path) -> dict[str, str]:
    """Op name -> the `_torch_ops.py` that names it: every string constant of each domain's registrations
    (`'<op>'`, `'...::<op>'`, an f-string's `'::<op>'` part), a superset of the ops it registers."""
    found: dict[str, str] = {}
    for domain in _domains(root / 'packages' / PACKAGE):
        module = domain / f'{TORCH_OPS}.py'
        if not module.is_file():
            continue
        try:
            tree = ast.parse(_read(module))
        except SyntaxError:
            continue  # its domain's import fails anyway; a new operator there is refused when it is edited
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.setdefault(node.value.rpartition('::')[2], module.relative_to(root).as_posix())
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
        changes.append(
            FileChange(f'{package_dir}/__init__.py', add_torch_ops_import(edited, str(domain_init)), original)
        )
    else:
        changes.append(FileChange(f'{package_dir}/__init__.py', render_template('domain_init.py.tmpl', name)))
    changes.append(FileChange(f'{package_dir}/{op}.py', render_template('operator.py.tmpl', name)))
    changes.append(FileChange(f'{package_dir}/{op}_kernel.py', render_template('operator_kernel.py.tmpl', name)))
    torch_ops = root / package_dir / f'{TORCH_OPS}.py'
    section = render_template('operator_torch_ops.py.tmpl', name)
    if domain_init.is_file() and torch_ops.is_file():
        original = _read(torch_ops)
        edited = add_torch_ops(original, section, str(torch_ops))
        changes.append(FileChange(f'{package_dir}/{TORCH_OPS}.py', edited, original))
    else:
        header = render_template('domain_torch_ops.py.tmpl', name)
        changes.append(FileChange(f'{package_dir}/{TORCH_OPS}.py', header + section))
    if not (root / tests_dir / '__init__.py').is_file():
        changes.append(FileChange(f'{tests_dir}/__init__.py', ''))
    changes.append(FileChange(f'{tests_dir}/test_{op}.py', render_template('test_operator.py.tmpl', name)))
    changes.append(FileChange(f'{tests_dir}/{op}_ref.py', render_template('operator_ref.py.tmpl', name)))
    if public:
        root_init = root / 'packages' / PACKAGE / '__init__.py'
        original = _read(root_init)
        changes.append(
            FileChange(
                f'packages/{PACKAGE}/__init__.py',
                _add_export(original, str(root_init), _root_import(domain, op), op),
                original,
            )
        )

    formatted = ruff_fix_and_format({c.path: c.content for c in changes if c.path.endswith('.py') and c.content})
    changes = [dataclasses.replace(c, content=formatted.get(c.path, c.content)) for c in changes]
    for change in changes:
        if change.path.endswith('__init__.py') and change.content:
            _checked(change.content, change.path, op)
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
    """What to run after scaffolding, for the task's output."""
    domain, op = plan.name.domain, plan.name.operator
    steps = [
        f'python -m pytest tests/{domain}/test_{op}.py -q   # CPU tier passes as generated; npu tests need a device',
        f'OPS_TILELANG_TEST_LEVEL=0 python -m pytest tests/{domain}/test_{op}.py -m "not benchmark"   # on a device',
        'ruff check . && ruff format --check .',
    ]
    if plan.public:
        steps.append(
            'python -m pytest tests/engram/test_torch_ops.py -q -m "not npu"   # every public operator has its '
            'torch.library op'
        )
    else:
        steps.append(
            f'experimental (not exported by the root package): use `from {PACKAGE}.{domain} import {op}`; once it is '
            f'stable, add the import and the __all__ entry to packages/{PACKAGE}/__init__.py'
        )
    return steps
