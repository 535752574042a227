"""Run a script or module with the operators' Ascend kernels on the emulator, on CPU tensors.

    python -m cann_ops_ascend_emu.run script.py [args ...]
    python -m cann_ops_ascend_emu.run -m package.module [args ...]

The emulator registers itself on import (this module imports it) and OPS_TILELANG_ASCEND_EMULATOR is set to 1
(for child processes too, which must import the emulator themselves); then the target runs as `python
script.py` / `python -m package.module` would run it, with `sys.argv` as it would see it.
"""

from __future__ import annotations

import os
import runpy
import sys

import cann_ops_ascend_emu  # noqa: F401  (registers the emulator with cann_ops_tilelang)
from cann_ops_tilelang.config import ASCEND_EMULATOR_ENV

USAGE = 'usage: python -m cann_ops_ascend_emu.run (script.py | -m module) [args ...]'


def main(argv: list[str]) -> None:
    """Run the target that `argv` (this module's arguments) names."""
    if not argv or argv[0] in ('-h', '--help') or (argv[0] == '-m' and len(argv) < 2):
        raise SystemExit(USAGE)
    os.environ[ASCEND_EMULATOR_ENV] = '1'
    if argv[0] == '-m':
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0], as python -m does
        runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
    else:
        sys.argv = list(argv)
        # As `python script.py`: the script's directory first on sys.path.
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name='__main__')


if __name__ == '__main__':
    main(sys.argv[1:])
