"""How many accelerators this host offers, counted without initialising CUDA or the NPU runtime.

Shared by the two-phase run (workers per device) and the xdist device binding (tests/testing/plugins/
device_binding.py). Pure standard library: the count comes from an environment override or from the
vendor tools (`npu-smi info -l`, `nvidia-smi -L`), never from torch, so no process that counts has
touched a device before its workers are bound to one.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

DEVICE_COUNT_ENV = 'OPS_TILELANG_DEVICE_COUNT'
VISIBLE_DEVICES_ENV = {'ascend': 'ASCEND_RT_VISIBLE_DEVICES', 'cuda': 'CUDA_VISIBLE_DEVICES'}
TOOL_TIMEOUT_S = 20

Tool = Callable[[Sequence[str]], str | None]


@dataclasses.dataclass(frozen=True)
class DeviceInventory:
    """`count` devices visible to this process; `source` says where the number came from."""

    count: int
    backend: Literal['ascend', 'cuda'] | None
    source: str


def parse_device_count_override(value: str) -> int:
    """The value of OPS_TILELANG_DEVICE_COUNT as a count >= 0; anything else is a ValueError naming it."""
    try:
        count = int(value.strip())
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError(f'{DEVICE_COUNT_ENV}={value!r} is not a device count: use an integer >= 0')
    return count


def visible_entries(value: str | None) -> list[str] | None:
    """The entries of a *_VISIBLE_DEVICES value; None when the variable is unset."""
    if value is None:
        return None
    return [entry.strip() for entry in value.split(',') if entry.strip()]


def parse_npu_smi(text: str) -> int | None:
    """Device count from `npu-smi info -l` ('Total Count : N'); None when the text has no count."""
    match = re.search(r'^\s*Total Count\s*:\s*(\d+)\s*$', text, re.MULTILINE)
    return int(match.group(1)) if match else None


def parse_nvidia_smi(text: str) -> int:
    """Device count from `nvidia-smi -L`: one 'GPU <i>: <name> (UUID: ...)' line per GPU."""
    return sum(1 for line in text.splitlines() if re.match(r'GPU \d+:', line))


def run_tool(argv: Sequence[str]) -> str | None:
    """stdout of a vendor tool, or None when it is not installed, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _physical(tool: Tool) -> tuple[int, Literal['ascend', 'cuda'] | None, str]:
    text = tool(['npu-smi', 'info', '-l'])
    count = parse_npu_smi(text) if text is not None else None
    if count:
        return count, 'ascend', 'npu-smi'
    text = tool(['nvidia-smi', '-L'])
    count = parse_nvidia_smi(text) if text is not None else 0
    if count:
        return count, 'cuda', 'nvidia-smi'
    return 0, None, 'no npu-smi/nvidia-smi device'


def count_devices(environ: Mapping[str, str] | None = None, tool: Tool = run_tool) -> DeviceInventory:
    """Devices this process may use.

    OPS_TILELANG_DEVICE_COUNT wins (also a fake count for tests). Otherwise the vendor tool's count,
    limited to the entries of ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES where that is set.
    """
    environ = os.environ if environ is None else environ
    override = environ.get(DEVICE_COUNT_ENV)
    if override is not None and override.strip():
        return DeviceInventory(parse_device_count_override(override), None, DEVICE_COUNT_ENV)
    count, backend, source = _physical(tool)
    if backend is not None:
        visible = visible_entries(environ.get(VISIBLE_DEVICES_ENV[backend]))
        if visible is not None:
            count = min(count, len(visible))
            source = f'{source}, {VISIBLE_DEVICES_ENV[backend]}'
    return DeviceInventory(count, backend, source)
