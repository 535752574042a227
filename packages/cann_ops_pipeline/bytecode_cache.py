"""Bytecode for the pipeline's test processes where the environment forbids writing it and torch has none.

Container images often set PYTHONDONTWRITEBYTECODE, and some install their packages without bytecode (the
lent H200's torch has none). Every Python process then compiles torch, TileLang, this project and its tests
from source, again in every xdist worker, in every child run of the pipeline's own tests, and in every run.
There the pipeline's pytest steps write bytecode to a directory of their own (PYTHONPYCACHEPREFIX): nothing
lands beside the sources, which is what the setting is for, and a run reads what an earlier one compiled.

Where torch has its bytecode (a pip-installed virtualenv, such as nox's), the cache is not used: with a
prefix Python reads no bytecode beside the sources, so a first run would compile all of torch and the
standard library again, and later runs gain nothing measurable (tests/README.md, "Run-wide behaviour").

    OPS_TILELANG_BYTECODE_CACHE unset    the cache where PYTHONDONTWRITEBYTECODE is set and the interpreter's
                                         torch has no bytecode, in ~/.cache/cann_ops_tilelang/bytecode
                                         (a PYTHONPYCACHEPREFIX of the environment wins)
    OPS_TILELANG_BYTECODE_CACHE=<dir>    the cache in <dir> wherever PYTHONDONTWRITEBYTECODE is set
    OPS_TILELANG_BYTECODE_CACHE=off      never: the environment's setting stays

The torch looked at is the one this interpreter finds (found, not imported): a nox session's virtualenv is
another interpreter, whose torch pip installed with its bytecode. Pure standard library.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

BYTECODE_CACHE_ENV = 'OPS_TILELANG_BYTECODE_CACHE'
OFF = 'off'


def default_directory() -> Path:
    return Path.home() / '.cache' / 'cann_ops_tilelang' / 'bytecode'


def torch_lacks_bytecode() -> bool:
    """Whether this interpreter's torch was installed without bytecode beside its sources (False without torch)."""
    spec = importlib.util.find_spec('torch')
    if spec is None or not spec.origin:
        return False
    origin = Path(spec.origin)
    return not (origin.parent / '__pycache__' / f'{origin.stem}.{sys.implementation.cache_tag}.pyc').exists()


def bytecode_env(
    environ: Mapping[str, str] | None = None, *, lacks_bytecode: Callable[[], bool] = torch_lacks_bytecode
) -> dict[str, str]:
    """The variables a pipeline pytest step adds to `environ` (os.environ when None): none where Python writes
    bytecode anyway, the cache is off, or (unset) torch has its bytecode; else PYTHONDONTWRITEBYTECODE
    emptied (Python reads an empty value as unset) and PYTHONPYCACHEPREFIX."""
    environ = os.environ if environ is None else environ
    if not environ.get('PYTHONDONTWRITEBYTECODE'):
        return {}
    setting = environ.get(BYTECODE_CACHE_ENV, '').strip()
    if setting.lower() == OFF or (not setting and not lacks_bytecode()):
        return {}
    prefix = environ.get('PYTHONPYCACHEPREFIX') or setting or str(default_directory())
    return {'PYTHONDONTWRITEBYTECODE': '', 'PYTHONPYCACHEPREFIX': prefix}
