"""Every repository path that a doc, a docstring or a comment names exists.

Scanned: the Markdown files (all of their text), the scaffold's templates (`*.tmpl`, all of their text) and the
Python files (their docstrings and comments only: string literals in code are data, e.g. the throw-away projects
the tooling tests build). Two kinds of reference are checked:

- a path that starts with one of the repository's top-level folders (`docs/engram.md`, `tests/engram/...`,
  `packages/...`), resolved against the repository root;
- the target of a Markdown link, `[text](path)`, resolved against the folder of the file that holds it
  (external URLs and in-page anchors are not checked; a `#fragment` is dropped).

A reference is a pattern, not a path, and is skipped when it holds `<`, `*`, `{`, `$` or `...` (`tests/<domain>/`,
`tests/*/benchmark/*.jsonl`, `${op}_kernel.py`, `tests/engram/...`), or when one of its parts is a name the docs use
for an example operator or test file (`foo`, `foo_bar`, `test_x.py`: see PLACEHOLDER_PART).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Folders the scan never enters: version control, virtualenvs, caches, build outputs.
SKIPPED_DIRS = frozenset({
    '.git', '.nox', '.venv', 'venv', '.pytest_cache', '.ruff_cache', '__pycache__', 'build', 'dist', '.device',
    '.scratch', 'node_modules',
})  # fmt: skip
# The top-level folders of the repository that a root-relative path starts with.
TOP_LEVEL = ('packages', 'tests', 'docs', 'tasks', '.github', '.ci')
# A root-relative path: one of the folders above, then path characters, not inside a longer word or path.
ROOT_PATH = re.compile(r'(?<![\w./\-~])((?:' + '|'.join(re.escape(t) for t in TOP_LEVEL) + r')/[\w.\-/<>*{}$]*)')
# A Markdown link's target: `](target)` or `](target "title")`.
MARKDOWN_LINK = re.compile(r'\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
TEMPLATE_CHARS = ('<', '*', '{', '$', '...')
# Names the docs use for the example operator of the scaffold (`invoke new-op foo/foo_bar`) and for an example
# test module (`tests/engram/test_x.py`): parts of a pattern, not of a real path.
PLACEHOLDER_PART = re.compile(r'(?:foo|foo_bar|test_foo_bar|test_x|x)(?:\.\w+)?')


def _scanned_files() -> list[Path]:
    files = []
    for path in ROOT.rglob('*'):
        relative = path.relative_to(ROOT)
        if any(part in SKIPPED_DIRS or part.endswith('.egg-info') for part in relative.parts[:-1]):
            continue
        if path.is_file() and path.suffix in ('.py', '.md', '.tmpl'):
            files.append(path)
    return sorted(files)


def _python_prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python source."""
    prose = []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return [(1, text)]  # not Python after all: scan it whole
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                prose.append((node.body[0].lineno, docstring))
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            prose.append((token.start[0], token.string))
    return prose


def _trimmed(reference: str) -> str:
    """A match without the sentence's punctuation after it (`docs/engram.md.`); an elided path keeps its `...`."""
    return reference if reference.endswith('...') else reference.rstrip('.-')


def _is_pattern(reference: str) -> bool:
    if any(char in reference for char in TEMPLATE_CHARS):
        return True
    return any(PLACEHOLDER_PART.fullmatch(part) for part in reference.strip('/').split('/'))


def _references(path: Path, text: str) -> list[tuple[int, str, Path]]:
    """(line, reference as written, what it must resolve to) of the checked references in `text`, the text
    of the file at `path`."""
    chunks = _python_prose(text) if path.suffix == '.py' else [(1, text)]
    found = []
    for first_line, chunk in chunks:
        for match in ROOT_PATH.finditer(chunk):
            reference = _trimmed(match.group(1))
            if reference and not _is_pattern(reference):
                line = first_line + chunk.count('\n', 0, match.start())
                found.append((line, reference, ROOT / reference))
        if path.suffix != '.md':
            continue
        for match in MARKDOWN_LINK.finditer(chunk):
            target = match.group(1).split('#', 1)[0]
            if not target or re.match(r'[a-z][a-z0-9+.\-]*:', target) or _is_pattern(target):
                continue  # an anchor in the page, a URL (http:, mailto:), a pattern
            line = first_line + chunk.count('\n', 0, match.start())
            base = ROOT if target.startswith('/') else path.parent
            found.append((line, target, base / target.lstrip('/')))
    return found


def test_the_scan_sees_the_docs_and_the_sources():
    files = {path.relative_to(ROOT).as_posix() for path in _scanned_files()}
    assert {'README.md', 'tests/README.md', 'docs/engram.md', 'tests/pipeline/test_doc_links.py'} <= files
    assert not any(name.startswith(('.nox/', '.git/')) for name in files)


@pytest.mark.parametrize(
    ('text', 'expected'),
    [
        ('see docs/engram.md, "Host path".', ['docs/engram.md']),
        ('`tests/engram/benchmark/` holds them', ['tests/engram/benchmark/']),
        ('node tests/engram/test_engram_hash.py::test_a[x=1]', ['tests/engram/test_engram_hash.py']),
        ('(packages/cann_ops_tilelang/operator.py)', ['packages/cann_ops_tilelang/operator.py']),
        ('tests/<domain>/test_<op>.py and tests/*/benchmark/*.jsonl', []),
        ('${op}_kernel.py in packages/cann_ops_tilelang/${domain}/', []),
        ('tests/engram/... and tests/foo/test_foo_bar.py and tests/engram/test_x.py', []),
        ('mirror-cann/asc-devkit, docs/zh/api/SIMD-API/C-API/...', []),
        ('a/docs/x.md and ~/docs/y.md and subtests/z.py', []),
    ],
)
def test_root_relative_references_are_found_precisely(text, expected):
    found = [_trimmed(m.group(1)) for m in ROOT_PATH.finditer(text)]
    assert [r for r in found if not _is_pattern(r)] == expected


def test_markdown_links_resolve_against_their_folder():
    text = '[a](engram.md) [b](../README.md#top) [c](https://example.com/x.md) [d](#anchor) [e](missing.md)'
    targets = [(target, resolved) for _, target, resolved in _references(ROOT / 'docs' / 'probe.md', text)]
    assert [t for t, _ in targets] == ['engram.md', '../README.md', 'missing.md']
    assert [r.resolve().relative_to(ROOT).as_posix() for _, r in targets] == [
        'docs/engram.md',
        'README.md',
        'docs/missing.md',
    ]


def test_python_files_are_scanned_in_their_docstrings_and_comments_only():
    source = (
        '"""Module doc: docs/engram.md."""\n'
        "PATH = 'tests/engram/not_prose.py'\n"
        'def f():\n'
        '    """See tests/README.md."""\n'
        '    return 1  # and packages/cann_ops_tilelang/operator.py\n'
    )
    assert [text.strip() for _, text in _python_prose(source)] == [
        'Module doc: docs/engram.md.',
        'See tests/README.md.',
        '# and packages/cann_ops_tilelang/operator.py',
    ]


def test_every_named_repository_path_exists():
    missing = []
    for path in _scanned_files():
        for line, reference, resolved in _references(path, path.read_text(encoding='utf-8')):
            if not resolved.exists():
                missing.append(f'{path.relative_to(ROOT).as_posix()}:{line}: {reference}')
    assert not missing, f'{len(missing)} reference(s) to repository paths that do not exist:\n' + '\n'.join(missing)
