"""Ascend C emulated on CPU: run TileLang-lowered Ascend 950 kernels on torch CPU tensors (a development tool)."""

from cann_ops_ascend_emu.driver import (
    ENV_CACHE_DIR,
    ENV_REPORT,
    ENV_TIMEOUT,
    CoreCounters,
    EmulatorError,
    LaunchReport,
    SourceKernel,
    get_saturation,
    set_saturation,
    set_strict_dma_pad,
    set_vf_membar_check,
)
from cann_ops_ascend_emu.kernel import EmulatedKernel, compile_prim_func

__all__ = [
    'ENV_CACHE_DIR',
    'ENV_REPORT',
    'ENV_TIMEOUT',
    'CoreCounters',
    'EmulatedKernel',
    'EmulatorError',
    'LaunchReport',
    'SourceKernel',
    'compile_prim_func',
    'get_saturation',
    'set_saturation',
    'set_strict_dma_pad',
    'set_vf_membar_check',
]
