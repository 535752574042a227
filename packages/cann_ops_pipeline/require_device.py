"""`python -m cann_ops_pipeline.require_device SESSION`: the first step of every session whose point is a device.

Exits 0 when cann_ops_pipeline.device_count finds an accelerator. Without one it prints one line saying
so and exits 1, so that a device workflow on a CPU-only runner fails instead of going green with every
device test skipped; with OPS_TILELANG_ALLOW_NO_DEVICE=1 it says that the device tests will skip and
exits 0. Pure standard library (runs before anything imports torch).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence

from cann_ops_pipeline.conventions import ALLOW_NO_DEVICE_ENV, USAGE_ERROR
from cann_ops_pipeline.device_count import Tool, count_devices, run_tool

NO_DEVICE = 1


def check(
    session: str,
    environ: Mapping[str, str] | None = None,
    tool: Tool = run_tool,
    out: Callable[[str], None] = print,
) -> int:
    """The exit code of the check (0: go on), after one line of output."""
    environ = os.environ if environ is None else environ
    try:
        inventory = count_devices(environ, tool)
    except ValueError as exc:
        out(f'{session}: error: {exc}')
        return USAGE_ERROR
    if inventory.count > 0:
        out(f'{session}: {inventory.count} device(s) ({inventory.source})')
        return 0
    allowed = environ.get(ALLOW_NO_DEVICE_ENV, '').strip()
    if allowed == '1':
        out(f'{session}: no accelerator ({inventory.source}); {ALLOW_NO_DEVICE_ENV}=1, so its device tests skip')
        return 0
    if allowed not in ('', '0'):
        out(f'{session}: error: {ALLOW_NO_DEVICE_ENV}={allowed!r}: use 1 (run without a device) or 0')
        return USAGE_ERROR
    out(
        f'{session}: error: needs an accelerator (Ascend NPU or CUDA GPU) and found none ({inventory.source}); '
        f'set {ALLOW_NO_DEVICE_ENV}=1 to run it anyway with its device tests skipped'
    )
    return NO_DEVICE


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) != 1:
        print('usage: python -m cann_ops_pipeline.require_device SESSION', file=sys.stderr)
        return USAGE_ERROR
    return check(argv[0])


if __name__ == '__main__':
    sys.exit(main())
