"""All-or-nothing writes of a set of file changes (used by `invoke new-op`).

`apply_changes(root, changes)` first checks that the tree is still as planned (no new file exists, each
edited file still holds its planned original), then writes; if anything fails, also KeyboardInterrupt,
it removes the files and folders it created and restores the files it edited, then re-raises.
New files are created exclusively, edited ones replaced atomically (temporary file + rename).
Pure standard library.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


class TreeChangedError(ValueError):
    """The tree no longer matches the plan; nothing has been written."""


@dataclasses.dataclass(frozen=True)
class FileChange:
    path: str  # relative to the root, '/'-separated
    content: str
    original: str | None = None  # the current content of an edited file; None for a new file

    @property
    def is_new(self) -> bool:
        return self.original is None


def write_file(path: Path, text: str, *, new: bool) -> None:
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


def check_unchanged(root: Path, changes: Iterable[FileChange]) -> None:
    """TreeChangedError when a new file exists by now or an edited file no longer holds its original."""
    for change in changes:
        path = root / change.path
        if change.is_new and os.path.lexists(path):
            raise TreeChangedError(f'refusing to overwrite {change.path}, created since the plan was made')
        if not change.is_new and (not path.is_file() or path.read_text(encoding='utf-8') != change.original):
            raise TreeChangedError(f'{change.path} changed since the plan was made; run new-op again')


def apply_changes(root: Path, changes: Iterable[FileChange], *, write: Callable[..., None] | None = None) -> None:
    """Write the changes; on any failure remove what was created and restore what was edited, then re-raise."""
    write = write or write_file
    changes = list(changes)
    check_unchanged(root, changes)
    created_dirs: list[Path] = []
    created_files: list[Path] = []
    edited: list[FileChange] = []
    try:
        for change in changes:
            path = root / change.path
            for directory in [p for p in reversed(path.parents) if not p.exists()]:
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
            write_file(root / change.path, change.original, new=False)
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
