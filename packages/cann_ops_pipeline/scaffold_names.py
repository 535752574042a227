"""The naming rules of `invoke new-op`: `<domain>/<operator>`, snake_case, the operator prefixed by its domain.

No file system access: the tree is checked by cann_ops_pipeline.scaffold. Pure standard library.
"""

from __future__ import annotations

import builtins
import dataclasses
import keyword
import re
import sys

MAX_OPERATOR_LENGTH = 40

_SNAKE_CASE = re.compile(r'[a-z][a-z0-9]*(?:_[a-z0-9]+)*\Z')
# Operator names ending like this would collide with the files derived from another operator's name, or
# (`_out`) with the name of its out= torch.library op.
_RESERVED_SUFFIXES = ('_kernel', '_ref', '_config', '_out')
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
            derived = (
                f'the out= torch.library op of another operator (cann_ops_tilelang::{operator})'
                if suffix == '_out'
                else f'the files derived from another operator (e.g. {operator}.py)'
            )
            raise ScaffoldError(f'operator name {operator!r} ends with {suffix!r}, which names {derived}')
    return OperatorName(domain, operator)
