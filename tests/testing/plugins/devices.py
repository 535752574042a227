"""The `npu` marker: tests that need an accelerator (Ascend NPU or CUDA GPU), or the Ascend C emulator.

On a machine without one they are skipped with the reason, never silently passed. The `device`
fixture hands such tests the device to put their inputs on.

`--ascend-emulator` (or OPS_TILELANG_ASCEND_EMULATOR=1 in the environment) runs them on a machine
without an accelerator on the CPU instead, through the public interfaces: CPU tensors, with the Ascend
kernels lowered to Ascend C and executed on the emulator of `cann_ops_ascend_emu` (imported here for such a
run, which registers it with cann_ops_tilelang). Results are "Ascend C emulated on CPU", never
hardware-verified. The opt-in applies to `npu` tests only: every other test runs with it unset, so contract
tests still see CPU tensors refused. On the emulator, tests marked `cuda_only` (CUDA-only kernel variants)
and benchmarks skip with the reason.
"""

from __future__ import annotations

import pytest
import torch

from cann_ops_pipeline.conventions import ASCEND_EMULATOR_OPTION, CUDA_ONLY_MARKER, NPU_MARKER, marker_line
from cann_ops_tilelang import config as ops_config

emulator_key = pytest.StashKey[bool]()


def emulator_requested(config: pytest.Config) -> bool:
    """The opt-in, by option or by the environment at start-up."""
    return config.stash[emulator_key]


def real_accelerator() -> bool:
    return ops_config.is_ascend_available() or ops_config.is_cuda_available()


def accelerator_missing_reason(emulator: bool = False, *, emulator_hint: bool = True) -> str | None:
    """None when an accelerator (or, with `emulator`, the emulator) is usable, else why not; `emulator_hint`
    adds that the emulator would run the test (not for benchmarks: it models no speed)."""
    if emulator or real_accelerator():
        return None
    npu = 'torch_npu not installed' if ops_config._torch_npu() is None else 'torch_npu sees no NPU'
    reason = f'needs an accelerator: no Ascend NPU ({npu}) and no CUDA GPU (torch {torch.__version__})'
    return f'{reason}; {ASCEND_EMULATOR_OPTION} runs it on the Ascend C emulator' if emulator_hint else reason


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup('cann_ops_tilelang').addoption(
        ASCEND_EMULATOR_OPTION,
        action='store_true',
        default=False,
        help=f'run device tests (npu) on the Ascend C emulator, on CPU tensors (as {ops_config.ASCEND_EMULATOR_ENV}=1)',
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line('markers', marker_line(NPU_MARKER))
    config.addinivalue_line('markers', marker_line(CUDA_ONLY_MARKER))
    emulator = config.getoption(ASCEND_EMULATOR_OPTION) or ops_config.ascend_emulator.enabled()
    config.stash[emulator_key] = emulator
    if emulator:
        # Importing the emulator registers it with cann_ops_tilelang (in every xdist worker, each configured here).
        import cann_ops_ascend_emu  # noqa: F401


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    device_items = [item for item in items if item.get_closest_marker('npu') is not None]
    if not device_items:
        return
    # Probe the device only here, after any xdist worker has been bound to its device.
    emulator = emulator_requested(config)
    reason = accelerator_missing_reason(emulator)
    if reason is not None:
        for item in device_items:
            benchmark = item.get_closest_marker('benchmark') is not None
            item.add_marker(pytest.mark.skip(reason=accelerator_missing_reason(emulator, emulator_hint=not benchmark)))
        return
    emulated = not real_accelerator()
    if emulated or ops_config.is_ascend_available():
        where = 'the Ascend C emulator' if emulated else 'Ascend'
        cuda_only = [item for item in device_items if item.get_closest_marker(CUDA_ONLY_MARKER) is not None]
        _skip(cuda_only, f'a CUDA-only kernel variant: not run on {where}')
    if emulated:
        benchmarks = [item for item in device_items if item.get_closest_marker('benchmark') is not None]
        _skip(benchmarks, 'the Ascend C emulator does not model speed: no benchmark on it')


def _skip(items: list[pytest.Item], reason: str) -> None:
    marker = pytest.mark.skip(reason=reason)
    for item in items:
        item.add_marker(marker)


@pytest.fixture(autouse=True)
def _ascend_emulator_scope(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The opt-in is on during `npu` tests of an emulated run and off for every other test."""
    if emulator_requested(request.config) and request.node.get_closest_marker('npu') is not None:
        monkeypatch.setenv(ops_config.ASCEND_EMULATOR_ENV, '1')
    else:
        monkeypatch.delenv(ops_config.ASCEND_EMULATOR_ENV, raising=False)


@pytest.fixture
def device() -> torch.device:
    """The device this test runs on: the worker's accelerator, or the CPU on the Ascend C emulator."""
    return ops_config.get_device()
