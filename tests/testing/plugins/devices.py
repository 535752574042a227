"""The `npu` marker: tests that need an accelerator (Ascend NPU or CUDA GPU).

On a machine without one they are skipped with the reason, never silently passed. The `device`
fixture hands such tests the accelerator to put their inputs on.
"""

from __future__ import annotations

import pytest
import torch

from cann_ops_tilelang import config


def accelerator_missing_reason() -> str | None:
    """None when an accelerator is usable, else why not."""
    if config.is_ascend_available() or config.is_cuda_available():
        return None
    npu = 'torch_npu not installed' if config._torch_npu() is None else 'torch_npu sees no NPU'
    return f'needs an accelerator: no Ascend NPU ({npu}) and no CUDA GPU (torch {torch.__version__})'


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line('markers', 'npu: needs an accelerator (Ascend NPU or CUDA GPU); skipped without one')


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    device_items = [item for item in items if item.get_closest_marker('npu') is not None]
    # Probe the device only here, after any xdist worker has been bound to its device.
    reason = accelerator_missing_reason() if device_items else None
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in device_items:
        item.add_marker(skip)


@pytest.fixture
def device() -> torch.device:
    """The accelerator this test runs on (after xdist binding, the worker's device)."""
    return config.get_device()
