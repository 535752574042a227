"""Bytecode for the pipeline's test processes where the environment forbids writing it beside the sources.

Container images often set PYTHONDONTWRITEBYTECODE (the lent H200's does, and its torch was installed without
bytecode). Every Python process then compiles each module it imports from source: torch, TileLang, this
project and its tests (pytest's assertion rewriting), again in every xdist worker, in every child run of the
pipeline's own tests, and in every run. The pipeline's pytest steps therefore write bytecode to a directory
of their own instead (PYTHONPYCACHEPREFIX): nothing lands beside the sources, which is what the setting is
for, and a run reads what an earlier one compiled.

    OPS_TILELANG_BYTECODE_CACHE=<dir>   where the bytecode goes (default ~/.cache/cann_ops_tilelang/bytecode;
                                        a PYTHONPYCACHEPREFIX of the environment wins)
    OPS_TILELANG_BYTECODE_CACHE=off     keep the environment's PYTHONDONTWRITEBYTECODE

Without PYTHONDONTWRITEBYTECODE Python writes its __pycache__ itself and nothing changes. Pure standard library.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

BYTECODE_CACHE_ENV = 'OPS_TILELANG_BYTECODE_CACHE'
OFF = 'off'


def default_directory() -> Path:
    return Path.home() / '.cache' / 'cann_ops_tilelang' / 'bytecode'


def bytecode_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a pipeline pytest step adds to `environ` (os.environ when None): none when Python writes
    bytecode anyway or the cache is off; else PYTHONDONTWRITEBYTECODE emptied (Python reads an empty value as
    unset) and PYTHONPYCACHEPREFIX."""
    environ = os.environ if environ is None else environ
    if not environ.get('PYTHONDONTWRITEBYTECODE'):
        return {}
    setting = environ.get(BYTECODE_CACHE_ENV, '').strip()
    if setting.lower() == OFF:
        return {}
    prefix = environ.get('PYTHONPYCACHEPREFIX') or setting or str(default_directory())
    return {'PYTHONDONTWRITEBYTECODE': '', 'PYTHONPYCACHEPREFIX': prefix}
