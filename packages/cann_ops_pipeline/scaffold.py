"""Scaffold a new operator the way shared/spec/operator-workflow prescribes (`invoke new-op`).

`new_operator(root, 'foo/foo_bar', public=False)` creates, under the repository `root`:

- `packages/cann_ops_tilelang/foo/__init__.py` when the domain is new, else adds
  `from .foo_bar import foo_bar` and the `__all__` entry to it;
- `packages/cann_ops_tilelang/foo/foo_bar.py` (public interface) and `foo_bar_kernel.py`
  (config, config choice, Ascend + CUDA prim_funcs named `foo_bar_kernel`, cached compile);
- `tests/foo/__init__.py` when missing, `tests/foo/test_foo_bar.py` and `tests/foo/foo_bar_ref.py`;
- with `public=True` only: `from cann_ops_tilelang.foo import foo_bar` and the `__all__` entry in
  the root `packages/cann_ops_tilelang/__init__.py` (without it the operator is experimental,
  reachable as `cann_ops_tilelang.foo.foo_bar` only).

The generated operator is a working example (an elementwise copy of a bf16/fp32 tensor) whose
tests pass as generated. Everything is planned and checked before the first write; nothing is
overwritten; a failure while writing removes the created files and restores the edited ones.

Pure standard library; no import of torch or tilelang.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import keyword
import os
import re
import string
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / 'templates'
PACKAGE = 'cann_ops_tilelang'
FIRST_PARTY = ('cann_ops_tilelang', 'cann_ops_pipeline', 'tests')
LINE_LENGTH = 120  # [tool.ruff] line-length
INDENT = '    '
MAX_OPERATOR_LENGTH = 40

_SNAKE_CASE = re.compile(r'[a-z][a-z0-9]*(?:_[a-z0-9]+)*\Z')
# Operator names ending like this would collide with the files derived from another operator's name.
_RESERVED_SUFFIXES = ('_kernel', '_ref', '_config')
# Names a domain or an operator must not take: project packages and folders, tools, libraries the
# operators import. The tree adds the modules of the root package and the non-domain test folders.
RESERVED_NAMES = frozenset(
    {
        'cann_ops_tilelang',
        'cann_ops_pipeline',
        'packages',
        'tasks',
        'tests',
        'testing',
        'pipeline',
        'plugins',
        'templates',
        'benchmark',
        'npu_mem_profiles',
        'conftest',
        'noxfile',
        'setup',
        'scripts',
        'docs',
        'torch',
        'torch_npu',
        'tilelang',
        'tvm',
        'numpy',
        'pytest',
        'triton',
        'invoke',
        'nox',
    }
)


class ScaffoldError(ValueError):
    """A name or a tree state that `new-op` refuses; nothing has been written."""


@dataclasses.dataclass(frozen=True)
class OperatorName:
    domain: str
    operator: str

    @property
    def class_prefix(self) -> str:
        """'foo_bar' -> 'FooBar' (for `FooBarConfig`)."""
        return ''.join(part[:1].upper() + part[1:] for part in self.operator.split('_'))


@dataclasses.dataclass(frozen=True)
class FileChange:
    path: str  # relative to the repository root, '/'-separated
    content: str
    original: str | None = None  # the current content of an edited file; None for a new file

    @property
    def is_new(self) -> bool:
        return self.original is None


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


# --- names -------------------------------------------------------------------------------------


def _suggest_snake_case(name: str) -> str:
    name = re.sub(r'(?<=[a-z0-9])(?=[A-Z])', '_', name.strip()).lower()
    return re.sub(r'_+', '_', re.sub(r'[^a-z0-9_]', '_', name)).strip('_')


def _check_snake_case(kind: str, name: str) -> None:
    if not _SNAKE_CASE.match(name):
        hint = _suggest_snake_case(name)
        suggestion = f" (e.g. '{hint}')" if hint and _SNAKE_CASE.match(hint) else ''
        raise ScaffoldError(
            f'{kind} name {name!r} is not snake_case: lowercase letters and digits in words joined by '
            f'single underscores, starting with a letter{suggestion}'
        )


def _check_not_shadowing(kind: str, name: str) -> None:
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise ScaffoldError(f'{kind} name {name!r} is a Python keyword')
    if name in sys.stdlib_module_names:
        raise ScaffoldError(f'{kind} name {name!r} shadows the standard-library module {name!r}')
    if name in dir(builtins):
        raise ScaffoldError(f'{kind} name {name!r} shadows the Python builtin {name!r}')
    if name in RESERVED_NAMES:
        raise ScaffoldError(f'{kind} name {name!r} is reserved: it names a project module, folder or tool')


def parse_operator_name(spec: str) -> OperatorName:
    """'<domain>/<operator>' -> OperatorName, checking the naming rules (no file system access)."""
    if not isinstance(spec, str):
        raise ScaffoldError(f'expected "<domain>/<operator>", got {type(spec).__name__}')
    parts = spec.strip().split('/')
    if len(parts) != 2 or not all(parts):
        raise ScaffoldError(f'expected "<domain>/<operator>", e.g. "foo/foo_bar", got {spec!r}')
    domain, operator = parts
    _check_snake_case('domain', domain)
    _check_not_shadowing('domain', domain)
    _check_snake_case('operator', operator)
    if not operator.startswith(f'{domain}_'):
        suggestion = f'{domain}_{operator}'
        raise ScaffoldError(
            f'operator name {operator!r} must start with its domain prefix {domain + "_"!r}: '
            f'use {suggestion!r} (invoke new-op {domain}/{suggestion})'
        )
    _check_not_shadowing('operator', operator)
    if len(operator) > MAX_OPERATOR_LENGTH:
        raise ScaffoldError(f'operator name {operator!r} is longer than {MAX_OPERATOR_LENGTH} characters')
    for suffix in _RESERVED_SUFFIXES:
        if operator.endswith(suffix):
            raise ScaffoldError(
                f'operator name {operator!r} ends with {suffix!r}, which names the files derived from '
                f'another operator (e.g. {operator.removesuffix(suffix)}{suffix}.py)'
            )
    return OperatorName(domain, operator)


# --- isort-style ordering (ruff's I001 and RUF022) ----------------------------------------------


def _natural_key(text: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r'(\d+)', text))


def member_sort_key(name: str) -> tuple:
    """isort order-by-type: CONSTANTS, then Classes, then everything else; natural order within."""
    if len(name) > 1 and name.upper() == name and name.lower() != name:
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    return (kind, _natural_key(name.lower()), _natural_key(name))


def module_sort_key(module: str) -> tuple:
    return (_natural_key(module.lower()), _natural_key(module))


# --- editing __init__.py files -----------------------------------------------------------------


class _Source:
    """A module's lines with AST-node-based replacement (columns are UTF-8 byte offsets)."""

    def __init__(self, text: str, path: str):
        self.path = path
        self.lines = text.splitlines()
        try:
            self.tree = ast.parse(text)
        except SyntaxError as error:
            raise ScaffoldError(f'{path} does not parse: {error}') from None

    def text(self) -> str:
        return '\n'.join(self.lines) + '\n'

    def span(self, node: ast.AST) -> str:
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return self.lines[first].encode()[node.col_offset : node.end_col_offset].decode()
        head = self.lines[first].encode()[node.col_offset :].decode()
        tail = self.lines[last].encode()[: node.end_col_offset].decode()
        return '\n'.join([head, *self.lines[first + 1 : last], tail])

    def replace(self, node: ast.AST, text: str) -> None:
        """Replace the node's source by `text` (which may span lines)."""
        if '#' in self.span(node):
            raise ScaffoldError(
                f'{self.path}:{node.lineno}: comments inside this statement would be lost; edit it by hand'
            )
        first, last = node.lineno - 1, node.end_lineno - 1
        before = self.lines[first].encode()[: node.col_offset].decode()
        after = self.lines[last].encode()[node.end_col_offset :].decode()
        self.lines[first : last + 1] = (before + text + after).split('\n')

    def insert(self, index: int, new_lines: list[str]) -> None:
        self.lines[index:index] = new_lines


def _is_exploded(span: str) -> bool:
    """A bracketed construct written one element per line with a magic trailing comma."""
    return '\n' in span and re.search(r',\s*[\])]\s*$', span) is not None


def _bracketed(
    prefix: str,
    items: list[str],
    opening: str,
    closing: str,
    *,
    exploded: bool,
    one_tuple: bool = False,
    bare: bool = False,
) -> str:
    """`prefix[a, b]` on one line if it fits (and was not exploded), else one item per line.

    `one_tuple`: a one-item tuple keeps its comma; `bare`: the one-line form has no brackets (imports).
    """
    single = ', '.join(items) + (',' if one_tuple and len(items) == 1 else '')
    line = f'{prefix}{single}' if bare else f'{prefix}{opening}{single}{closing}'
    if not exploded and len(line) <= LINE_LENGTH:
        return line
    body = ''.join(f'{INDENT}{item},\n' for item in items)
    return f'{prefix}{opening}\n{body}{closing}'


def _dunder_all(source: _Source) -> ast.Assign | ast.AnnAssign | None:
    found = []
    for node in source.tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == '__all__' for t in targets):
            if isinstance(node, ast.AugAssign) or (isinstance(node, ast.Assign) and len(node.targets) != 1):
                raise ScaffoldError(f'{source.path}:{node.lineno}: __all__ must be one literal list; edit it by hand')
            found.append(node)
    if len(found) > 1:
        raise ScaffoldError(f'{source.path}: __all__ is assigned {len(found)} times; edit it by hand')
    return found[0] if found else None


def _literal_names(source: _Source, node: ast.Assign | ast.AnnAssign) -> list[str]:
    value = node.value
    if not isinstance(value, (ast.List, ast.Tuple)) or not all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
    ):
        raise ScaffoldError(f'{source.path}:{node.lineno}: __all__ is not a literal list of strings; edit it by hand')
    return [e.value for e in value.elts]


def exported_names(text: str, path: str = '<module>') -> list[str]:
    """The names of a module's literal `__all__` (empty when it has none)."""
    source = _Source(text, path)
    node = _dunder_all(source)
    return [] if node is None else _literal_names(source, node)


def _add_to_all(source: _Source, name: str) -> None:
    node = _dunder_all(source)
    if node is None:  # no __all__ yet: add one at the end
        while source.lines and not source.lines[-1].strip():
            source.lines.pop()
        source.lines += ['', f"__all__ = ['{name}']"]
        return
    names = _literal_names(source, node)
    if name in names:
        raise ScaffoldError(f'{source.path}: {name!r} is already in __all__')
    names = sorted([*names, name], key=member_sort_key)
    opening, closing = ('(', ')') if isinstance(node.value, ast.Tuple) else ('[', ']')
    prefix = source.lines[node.lineno - 1].encode()[: node.value.col_offset].decode()
    exploded = _is_exploded(source.span(node.value))
    text = _bracketed(prefix, [f"'{n}'" for n in names], opening, closing, exploded=exploded, one_tuple=opening == '(')
    source.replace(node.value, text.removeprefix(prefix))


def _import_from_text(module: str, level: int, aliases: Iterable[ast.alias], *, exploded: bool) -> str:
    items = [a.name if a.asname is None else f'{a.name} as {a.asname}' for a in aliases]
    return _bracketed(f'from {"." * level}{module} import ', items, '(', ')', exploded=exploded, bare=True)


def _leading_imports(source: _Source) -> list[ast.Import | ast.ImportFrom]:
    """The top-level imports before the first other statement (the module docstring aside)."""
    imports = []
    for index, node in enumerate(source.tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
        elif index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        else:
            break
    return imports


def _section(node: ast.Import | ast.ImportFrom) -> str:
    if isinstance(node, ast.ImportFrom) and node.level:
        return 'local'
    module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
    if module == '__future__':
        return 'future'
    return 'first-party' if module.split('.')[0] in FIRST_PARTY else 'other'


def _add_import(source: _Source, *, module: str, level: int, name: str) -> None:
    """Add `from <level dots><module> import <name>` where ruff's isort would put it."""
    imports = _leading_imports(source)
    for node in imports:
        if isinstance(node, ast.ImportFrom) and node.module == module and node.level == level:
            if any(a.name == name or a.asname == name for a in node.names):
                raise ScaffoldError(f'{source.path}:{node.lineno}: {name!r} is imported already')
            aliases = sorted([*node.names, ast.alias(name=name)], key=lambda a: member_sort_key(a.name))
            source.replace(node, _import_from_text(module, level, aliases, exploded=_is_exploded(source.span(node))))
            return
    line = _import_from_text(module, level, [ast.alias(name=name)], exploded=False).split('\n')
    section = 'local' if level else 'first-party'
    same = [n for n in imports if _section(n) == section]
    if same:
        key = module_sort_key(module)
        for node in same:
            if isinstance(node, ast.ImportFrom) and module_sort_key(node.module or '') > key:
                source.insert(node.lineno - 1, line)
                return
        source.insert(same[-1].end_lineno, line)
        return
    if imports:
        later = [n for n in imports if section == 'first-party' and _section(n) == 'local']
        if later:  # a first-party section goes before the local (relative) one
            source.insert(later[0].lineno - 1, [*line, ''])
        else:
            source.insert(imports[-1].end_lineno, ['', *line])
        return
    # No imports yet: after the module docstring, one blank line each side (two before a def/class).
    body = source.tree.body
    docstring = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else None
    start = docstring.end_lineno if docstring is not None else 0
    rest = source.lines[start:]
    while rest and not rest[0].strip():
        rest.pop(0)
    gap = ['', ''] if rest and re.match(r'(def|class|async def)\b|@', rest[0]) else ['']
    head = [*source.lines[:start], ''] if docstring is not None else []
    source.lines = [*head, *line, *(gap if rest else []), *rest]


def add_domain_export(text: str, operator: str, path: str = '__init__.py') -> str:
    """A domain `__init__.py` with `from .<operator> import <operator>` and the `__all__` entry."""
    source = _Source(text, path)
    _add_to_all(source, operator)  # first: the import may shift lines
    source = _Source(source.text(), path)
    _add_import(source, module=operator, level=1, name=operator)
    return _checked(source.text(), path, operator)


def add_root_export(text: str, domain: str, operator: str, path: str = '__init__.py') -> str:
    """The root `__init__.py` with `from cann_ops_tilelang.<domain> import <operator>` and `__all__`."""
    source = _Source(text, path)
    _add_to_all(source, operator)
    source = _Source(source.text(), path)
    _add_import(source, module=f'{PACKAGE}.{domain}', level=0, name=operator)
    return _checked(source.text(), path, operator)


def _checked(text: str, path: str, name: str) -> str:
    """The edited module still parses and exports `name`."""
    if name not in exported_names(text, path):
        raise ScaffoldError(f'{path}: internal error, {name!r} missing from __all__ after the edit')
    return text


# --- rendering ----------------------------------------------------------------------------------


def _wrap_long_imports(text: str) -> str:
    """`from m import a, b` lines over the line length, exploded the way ruff formats them."""
    lines = []
    for line in text.split('\n'):
        match = re.match(r'from (\S+) import ([^(#]+)$', line)
        if match and len(line) > LINE_LENGTH:
            names = [n.strip() for n in match.group(2).split(',')]
            line = _bracketed(f'from {match.group(1)} import ', names, '(', ')', exploded=True)
        lines.append(line)
    return '\n'.join(lines)


def render_template(template: str, name: OperatorName) -> str:
    """A template of `templates/` with the names filled in (ruff-clean for every valid name)."""
    raw = (TEMPLATES / template).read_text(encoding='utf-8')
    text = string.Template(raw).substitute(domain=name.domain, op=name.operator, Op=name.class_prefix)
    text = _wrap_long_imports(text)
    for number, line in enumerate(text.split('\n'), 1):
        if len(line) > LINE_LENGTH:
            raise ScaffoldError(
                f'{template}:{number}: the generated line is {len(line)} characters long (limit {LINE_LENGTH}); '
                'choose shorter names'
            )
    return text


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
        changes.append(
            FileChange(f'{package_dir}/__init__.py', add_domain_export(original, op, str(domain_init)), original)
        )
    else:
        changes.append(FileChange(f'{package_dir}/__init__.py', render_template('domain_init.py.tmpl', name)))
    changes.append(FileChange(f'{package_dir}/{op}.py', render_template('operator.py.tmpl', name)))
    changes.append(FileChange(f'{package_dir}/{op}_kernel.py', render_template('operator_kernel.py.tmpl', name)))
    if not (root / tests_dir / '__init__.py').is_file():
        changes.append(FileChange(f'{tests_dir}/__init__.py', ''))
    changes.append(FileChange(f'{tests_dir}/test_{op}.py', render_template('test_operator.py.tmpl', name)))
    changes.append(FileChange(f'{tests_dir}/{op}_ref.py', render_template('operator_ref.py.tmpl', name)))
    if public:
        root_init = root / 'packages' / PACKAGE / '__init__.py'
        original = _read(root_init)
        changes.append(
            FileChange(
                f'packages/{PACKAGE}/__init__.py', add_root_export(original, domain, op, str(root_init)), original
            )
        )

    existing = [c.path for c in changes if c.is_new and os.path.lexists(root / c.path)]
    if existing:
        raise ScaffoldError(f'refusing to overwrite existing files: {", ".join(existing)}')
    return Plan(root, name, public, tuple(changes))


# --- writing ------------------------------------------------------------------------------------


def _write_file(path: Path, text: str, *, new: bool) -> None:
    """Create `path` exclusively (new) or replace it atomically (edit); the one place that writes."""
    if new:
        with open(path, 'x', encoding='utf-8', newline='\n') as f:
            try:
                f.write(text)
            except BaseException:
                path.unlink(missing_ok=True)  # ours: opened exclusively above
                raise
        return
    fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp', dir=path.parent)
    try:
        with os.fdopen(fd, 'w', encoding='utf-8', newline='\n') as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def apply_plan(plan: Plan, *, write: Callable[..., None] | None = None) -> None:
    """Write the plan; on any failure remove what it created and restore what it edited, then re-raise."""
    write = write or _write_file
    root = plan.root
    for change in plan.changes:  # the tree may have moved since planning
        path = root / change.path
        if change.is_new and os.path.lexists(path):
            raise ScaffoldError(f'refusing to overwrite {change.path}, created since the plan was made')
        if not change.is_new and (not path.is_file() or _read(path) != change.original):
            raise ScaffoldError(f'{change.path} changed since the plan was made; run new-op again')
    created_dirs: list[Path] = []
    created_files: list[Path] = []
    edited: list[FileChange] = []
    try:
        for change in plan.changes:
            path = root / change.path
            missing = [p for p in reversed(path.parents) if not p.exists()]
            for directory in missing:
                directory.mkdir()
                created_dirs.append(directory)
            if change.is_new:
                write(path, change.content, new=True)  # cleans up after itself if it fails
                created_files.append(path)
            else:
                edited.append(change)
                write(path, change.content, new=False)
    except BaseException:
        for change in reversed(edited):
            _write_file(root / change.path, change.original, new=False)
        for path in reversed(created_files):
            path.unlink(missing_ok=True)
        for directory in reversed(created_dirs):
            _remove_empty_dir(directory)
        raise


def _remove_empty_dir(directory: Path) -> None:
    cache = directory / '__pycache__'  # an import during the failed run may have left one
    if cache.is_dir() and not any(p.suffix != '.pyc' for p in cache.iterdir()):
        for p in cache.iterdir():
            p.unlink()
        cache.rmdir()
    with contextlib.suppress(OSError):
        directory.rmdir()


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
    if not plan.public:
        steps.append(
            f'experimental (not exported by the root package): use `from {PACKAGE}.{domain} import {op}`; once it is '
            f'stable, add the import and the __all__ entry to packages/{PACKAGE}/__init__.py'
        )
    return steps
