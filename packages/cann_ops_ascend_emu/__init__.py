"""Ascend C emulated on CPU: run TileLang-lowered Ascend 950 kernels on torch CPU tensors (a development tool).

Importing this package registers it with cann_ops_tilelang as the process's Ascend emulator
(`cann_ops_tilelang.config.ascend_emulator`); CPU tensors then take the operators' Ascend path where
OPS_TILELANG_ASCEND_EMULATOR=1 opts in. `python -m cann_ops_ascend_emu.run script.py` does both for a script.
"""

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
from cann_ops_tilelang.config import ascend_emulator

# The wheel's extension point: the wheel never imports this package, it calls what registered here.
ascend_emulator.register(compile_prim_func)

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
