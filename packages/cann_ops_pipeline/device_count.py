"""How many accelerators this host offers, and their memory, without initialising CUDA or the NPU runtime.

Shared by the two-phase run (workers per device, memory share per worker) and the xdist device binding
(tests/testing/plugins/device_binding.py). Pure standard library: the numbers come from environment
overrides or from the vendor tools (`npu-smi info -l`, `npu-smi info -t usages -i <id>`, `nvidia-smi`),
never from torch, so no process that counts has touched a device before its workers are bound to one.
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
DEVICE_MEMORY_ENV = 'OPS_TILELANG_DEVICE_MEMORY_MB'
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


def parse_device_memory_override(value: str) -> int:
    """The value of OPS_TILELANG_DEVICE_MEMORY_MB as MiB > 0; anything else is a ValueError naming it."""
    try:
        memory_mb = int(value.strip())
    except ValueError:
        memory_mb = 0
    if memory_mb <= 0:
        raise ValueError(f'{DEVICE_MEMORY_ENV}={value!r} is not a device memory size: use an integer number of MB > 0')
    return memory_mb


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


def parse_nvidia_smi_memory(text: str) -> list[int | None]:
    """MiB per GPU, in index order, from `nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits`.

    One number per line; a line that is not one (e.g. '[N/A]') is None, so positions stay GPU indices.
    """
    return [int(line) if line.strip().isdecimal() else None for line in text.splitlines() if line.strip()]


def parse_npu_smi_ids(text: str) -> list[int]:
    """The NPU IDs listed by `npu-smi info -l` ('NPU ID : N' lines), in order."""
    return [int(match) for match in re.findall(r'^\s*NPU ID\s*:\s*(\d+)\s*$', text, re.MULTILINE)]


def parse_npu_smi_hbm(text: str) -> list[int]:
    """'HBM Capacity(MB) : N' of `npu-smi info -t usages -i <id>`: one value per chip of the NPU.

    Written against the layout of Huawei's npu-smi reference (the sample in tests/pipeline/
    test_device_binding.py), not yet checked on an Ascend 950. No such line: the memory is unknown.
    """
    return [int(match) for match in re.findall(r'^\s*HBM Capacity\(MB\)\s*:\s*(\d+)\s*$', text, re.MULTILINE)]


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


def _ascend_memory(tool: Tool) -> list[int | None] | None:
    """HBM MiB per chip in logical-device order (NPU IDs ascending, chips in order); None: no npu-smi device."""
    text = tool(['npu-smi', 'info', '-l'])
    ids = parse_npu_smi_ids(text) if text is not None else []
    if not ids:
        return None
    per_chip: list[int | None] = []
    for npu_id in sorted(ids):
        usages = tool(['npu-smi', 'info', '-t', 'usages', '-i', str(npu_id)])
        per_chip.extend((parse_npu_smi_hbm(usages) if usages is not None else []) or [None])
    return per_chip


def _cuda_memory(tool: Tool) -> list[int | None] | None:
    text = tool(['nvidia-smi', '--query-gpu=memory.total', '--format=csv,noheader,nounits'])
    per_gpu = parse_nvidia_smi_memory(text) if text is not None else []
    return per_gpu or None


def smallest_visible(per_device: Sequence[int | None], visible: Sequence[str] | None) -> int | None:
    """The smallest memory among the devices a *_VISIBLE_DEVICES list names; None when one is unknown.

    Index entries select their devices. Other forms (UUIDs, MIG instances) are not resolved: then all
    devices count, which can only give a smaller, safe answer.
    """
    if visible is not None and all(entry.isdecimal() for entry in visible):
        chosen = [per_device[int(entry)] if int(entry) < len(per_device) else None for entry in visible]
    else:
        chosen = list(per_device)
    if not chosen or any(memory is None or memory <= 0 for memory in chosen):
        return None
    return min(chosen)


def device_memory_mb(environ: Mapping[str, str] | None = None, tool: Tool = run_tool) -> int | None:
    """Total memory in MiB of the smallest device this process may use; None when unknown.

    OPS_TILELANG_DEVICE_MEMORY_MB wins (MiB per device; for tests and hosts whose tools mislead).
    Otherwise npu-smi's 'HBM Capacity(MB)' per chip or nvidia-smi's memory.total per GPU, limited to
    the entries of ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES where that is set.
    """
    environ = os.environ if environ is None else environ
    override = environ.get(DEVICE_MEMORY_ENV)
    if override is not None and override.strip():
        return parse_device_memory_override(override)
    for backend, query in (('ascend', _ascend_memory), ('cuda', _cuda_memory)):
        per_device = query(tool)
        if per_device is not None:
            return smallest_visible(per_device, visible_entries(environ.get(VISIBLE_DEVICES_ENV[backend])))
    return None
