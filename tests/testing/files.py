"""Atomic writes for the files tests produce (memory profiles, baselines).

A reader sees the old file or the new one, never a half-written one: an interrupted or failed
refresh leaves the previous file intact.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temporary file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp', dir=path.parent)
    try:
        with os.fdopen(fd, 'w', encoding='utf-8', newline='\n') as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CorruptFileError(RuntimeError):
    """A profile or baseline file that cannot be trusted; the message names the file."""

    def __init__(self, path: str | os.PathLike, problem: str):
        super().__init__(f'{os.fspath(path)}: {problem}')
        self.path = Path(path)
