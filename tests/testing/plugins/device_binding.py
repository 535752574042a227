"""Binds each xdist worker to one accelerator before anything initialises CUDA or the NPU runtime.

The controller counts the devices once (`cann_ops_pipeline.device_count`: OPS_TILELANG_DEVICE_COUNT,
else npu-smi / nvidia-smi, never torch) and hands the count to every worker through `workerinput`.
Worker `gw<i>` takes device `i % count`: in `pytest_configure` (tryfirst) it sets
CUDA_VISIBLE_DEVICES and ASCEND_RT_VISIBLE_DEVICES to that device, or to the i-th entry of a list
that was set already, so the later accelerator probe and every test see one device, index 0.
Several workers may share a device: at its first device test a worker caps its allocator to its
share of the device memory, 1 / (workers on that device), through the `pytest_cap_device_memory` hook.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import MutableMapping

import pytest

from cann_ops_pipeline.device_count import (
    DEVICE_COUNT_ENV,
    VISIBLE_DEVICES_ENV,
    DeviceInventory,
    count_devices,
    parse_device_count_override,
    visible_entries,
)

DEVICE_COUNT_INPUT = 'ops_tilelang_device_count'  # workerinput key: the controller's device count


@dataclasses.dataclass(frozen=True)
class Binding:
    """Worker `worker` runs on device `device` (an index into the controller's visible devices)."""

    worker: int
    device: int
    workers_on_device: int

    @property
    def memory_fraction(self) -> float:
        return 1.0 / self.workers_on_device


binding_key = pytest.StashKey['Binding | None']()
capped_key = pytest.StashKey[bool]()
inventory_key = pytest.StashKey[DeviceInventory]()


class DeviceBindingHookspecs:
    @pytest.hookspec(firstresult=True)
    def pytest_cap_device_memory(self, config: pytest.Config, fraction: float) -> bool | None:
        """Cap this process's device allocator to `fraction` of the device memory; True when done."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(DeviceBindingHookspecs)


def worker_number(workerid: str) -> int:
    """3 for xdist's worker id 'gw3'."""
    match = re.fullmatch(r'gw(\d+)', workerid)
    if match is None:
        raise pytest.UsageError(f'cannot bind xdist worker {workerid!r} to a device: expected an id like gw0')
    return int(match.group(1))


def plan_binding(worker: int, worker_count: int, device_count: int) -> Binding | None:
    """Round-robin: device `worker % device_count`; None without devices."""
    if device_count <= 0:
        return None
    device = worker % device_count
    sharing = len(range(device, worker_count, device_count))
    return Binding(worker=worker, device=device, workers_on_device=max(1, sharing))


def visible_value(var: str, device: int, environ: MutableMapping[str, str]) -> str:
    """What `var` must say to show only `device`: its entry in a pre-set list, else the index."""
    entries = visible_entries(environ.get(var))
    if entries is None:
        return str(device)
    if device >= len(entries):
        raise pytest.UsageError(
            f'cannot bind an xdist worker to device {device}: {var}={environ[var]!r} lists {len(entries)} '
            f'device(s); make {DEVICE_COUNT_ENV} (or the device count) agree with it'
        )
    return entries[device]


def bind_environment(binding: Binding, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Point both runtimes' *_VISIBLE_DEVICES at the worker's device; returns what was set."""
    values = {var: visible_value(var, binding.device, environ) for var in VISIBLE_DEVICES_ENV.values()}
    environ.update(values)
    return values


def worker_device_count(workerinput: dict, environ: MutableMapping[str, str] = os.environ) -> int:
    """The controller's count, else the env override, else 0 (unbound): a worker never probes."""
    if DEVICE_COUNT_INPUT in workerinput:
        return int(workerinput[DEVICE_COUNT_INPUT])
    override = environ.get(DEVICE_COUNT_ENV, '')
    return parse_device_count_override(override) if override.strip() else 0


def workers_sharing_device(config: pytest.Config) -> int:
    """Test processes sharing this process's device: 1 outside xdist, all workers when unbound."""
    binding = config.stash.get(binding_key, None)
    if binding is not None:
        return binding.workers_on_device
    workerinput = getattr(config, 'workerinput', None)
    return int(workerinput['workercount']) if workerinput else 1


def _inventory(config: pytest.Config) -> DeviceInventory:
    if inventory_key not in config.stash:
        try:
            config.stash[inventory_key] = count_devices()
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    return config.stash[inventory_key]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Controller: every worker gets the same device count, counted once here."""
    node.workerinput[DEVICE_COUNT_INPUT] = _inventory(node.config).count


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.stash[capped_key] = False
    workerinput = getattr(config, 'workerinput', None)
    binding = None
    if workerinput is not None:
        try:
            count = worker_device_count(workerinput)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        binding = plan_binding(worker_number(workerinput['workerid']), int(workerinput['workercount']), count)
        if binding is not None:
            bind_environment(binding)
    config.stash[binding_key] = binding


def pytest_report_header(config: pytest.Config) -> str | None:
    workers = getattr(config.option, 'numprocesses', None)
    if hasattr(config, 'workerinput') or not isinstance(workers, int) or workers <= 0:
        return None
    inventory = _inventory(config)
    if inventory.count == 0:
        return f'device binding: none, no device ({inventory.source})'
    per_device = math.ceil(workers / inventory.count)
    return (
        f'device binding: {workers} xdist workers over {inventory.count} device(s) ({inventory.source}), '
        f'up to {per_device} per device'
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Cap the allocator once, when the worker's first device test starts."""
    config = item.config
    binding = config.stash.get(binding_key, None)
    if binding is None or binding.workers_on_device == 1 or config.stash[capped_key]:
        return
    if item.get_closest_marker('npu') is None:
        return
    config.stash[capped_key] = True
    config.hook.pytest_cap_device_memory(config=config, fraction=binding.memory_fraction)


@pytest.hookimpl(trylast=True)
def pytest_cap_device_memory(config: pytest.Config, fraction: float) -> bool | None:
    """Default: torch's per-process memory fraction on the current NPU or GPU (index 0 once bound)."""
    import torch

    from cann_ops_tilelang import config as runtime

    if runtime.is_ascend_available():
        torch.npu.set_per_process_memory_fraction(fraction)
        return True
    if runtime.is_cuda_available():
        torch.cuda.set_per_process_memory_fraction(fraction)
        return True
    return None
