"""Runtime configuration: which accelerator runs a call, its core counts, debug switches.

Everything here is lazy. Importing this module (or the package) never imports torch_npu,
never initialises CUDA and never compiles a kernel: the first operator call does that.

An Ascend emulator (a development tool of this repository, not shipped in the wheel) can make CPU tensors
run the Ascend kernels: it registers itself with `ascend_emulator` when imported, and a process opts in with
OPS_TILELANG_ASCEND_EMULATOR=1. It is never a fallback: without the opt-in, CPU tensors raise RuntimeError.
The wheel never imports the emulator; the emulator imports the wheel.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any, Literal

import torch

Backend = Literal['ascend', 'cuda']

PRINT_KERNEL_SOURCE_ENV = 'OPS_TILELANG_PRINT_KERNEL_SOURCE'
ASCEND_EMULATOR_ENV = 'OPS_TILELANG_ASCEND_EMULATOR'
# The emulated chip: Ascend 950PR, 64 vector (AIV) cores, what the CPU tier lowers Ascend kernels for.
EMULATED_VECTOR_CORES = 64
_TRUE = {'1', 'true', 'yes', 'on'}
_FALSE = {'', '0', 'false', 'no', 'off'}


def _env_flag(name: str) -> bool:
    """A boolean environment variable (unset or empty is False); anything else is a ValueError."""
    value = os.environ.get(name, '').strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f'{name}={os.environ[name]!r} is not a boolean: use 1/0, true/false, yes/no or on/off')


@functools.cache
def _torch_npu():
    """torch_npu, imported on first use (importing this package must not import it); None where it is not
    installed."""
    try:
        import torch_npu
    except ImportError:
        return None
    return torch_npu


def is_ascend_available() -> bool:
    return _torch_npu() is not None and torch.npu.is_available()


def is_cuda_available() -> bool:
    return torch.cuda.is_available()


def require_ascend() -> None:
    """Raise RuntimeError unless an Ascend NPU with torch_npu is usable (for Ascend-only operators)."""
    if _torch_npu() is None:
        raise RuntimeError('this operator needs an Ascend NPU: torch_npu is not installed')
    if not torch.npu.is_available():
        raise RuntimeError('this operator needs an Ascend NPU: torch_npu found no NPU device')


class AscendEmulator:
    """The Ascend emulator opt-in, the one place that knows it, and the extension point an emulator fills.

    An emulator (a backend that runs the Ascend kernels on CPU tensors) calls `register` when it is imported;
    the wheel calls it only through `compile`, so the wheel never imports it. A process opts in with
    OPS_TILELANG_ASCEND_EMULATOR=1 (`enabled`): then CPU tensors take the Ascend path (`runs`), as on an
    Ascend 950 with EMULATED_VECTOR_CORES vector cores and no device to switch to. Without the opt-in a
    registered emulator changes nothing. `require` refuses the opt-in on a machine with a real NPU (kernels
    are cached once per configuration, built for one of the two) and where no emulator is registered.
    """

    def __init__(self) -> None:
        self.compile_prim_func: Callable[[Any], Any] | None = None
        """The registered hook, None while nothing registered: prim_func -> a kernel called as TileLang's JIT
        kernel of it (its parameters in order, CPU tensors and numbers), with `get_kernel_source()`."""

    def register(self, compile_prim_func: Callable[[Any], Any]) -> None:
        """Make `compile_prim_func` the emulator of this process (a later registration replaces it)."""
        self.compile_prim_func = compile_prim_func

    def enabled(self) -> bool:
        """Whether OPS_TILELANG_ASCEND_EMULATOR opts in (read on every call: tests and users may set it)."""
        return _env_flag(ASCEND_EMULATOR_ENV)

    def runs(self, device: torch.device) -> bool:
        """Whether tensors on `device` take the Ascend path on the emulator: CPU tensors under the opt-in."""
        return device.type == 'cpu' and self.enabled()

    def active(self) -> bool:
        """Whether Ascend kernels are built for the emulator here: the opt-in on a machine without an NPU
        (where there is one, `require` refuses CPU tensors and npu tensors get real kernels)."""
        return self.enabled() and not is_ascend_available()

    def require(self) -> None:
        """RuntimeError, one line saying what to do, unless the emulator can run CPU tensors here."""
        if is_ascend_available():
            raise RuntimeError(f'{ASCEND_EMULATOR_ENV}=1 is for machines without an Ascend NPU: this one has one')
        if self.compile_prim_func is None:
            # The wheel cannot import the emulator (it is not shipped), so the message names what the user runs.
            raise RuntimeError(
                f'{ASCEND_EMULATOR_ENV}=1 but no Ascend emulator is registered in this process: import '
                "cann_ops_ascend_emu (a checkout's packages/ on sys.path) before the first call, or run the "
                'script with python -m cann_ops_ascend_emu.run script.py'
            )

    def compile(self, prim_func):
        """`prim_func` built by the registered emulator (RuntimeError, as `require`, where it cannot run)."""
        self.require()
        return self.compile_prim_func(prim_func)


ascend_emulator = AscendEmulator()
"""The process's emulator opt-in and registration (see AscendEmulator)."""


def backend_of(device: torch.device) -> Backend:
    """Map a tensor's device to the kernel backend; CPU and other devices raise RuntimeError.

    CPU tensors map to 'ascend' only under the emulator opt-in (OPS_TILELANG_ASCEND_EMULATOR=1).
    """
    if device.type == 'npu':
        return 'ascend'
    if device.type == 'cuda':
        return 'cuda'
    if ascend_emulator.runs(device):
        return 'ascend'
    raise RuntimeError(
        f'cann_ops_tilelang has no kernels for {device.type!r} tensors: move the inputs to an '
        'Ascend NPU (npu) or a CUDA GPU (cuda); there is no CPU fallback'
    )


def require_accelerator(*tensors: torch.Tensor) -> Backend:
    """Device guard for operators with Ascend and CUDA kernels.

    The device of the input tensors decides the backend. All tensors must be on one device;
    CPU tensors, mixed devices and unsupported device types raise RuntimeError.
    """
    if not tensors:
        raise ValueError('require_accelerator() needs at least one tensor')
    device = tensors[0].device
    for t in tensors[1:]:
        if t.device != device:
            raise RuntimeError(f'all tensors must be on one device, got {device} and {t.device}')
    if torch.compiler.is_compiling():
        # Dynamo is tracing the operator's Python call: what follows imports modules and reads the environment,
        # which it cannot trace. The op's fake kernel, which Dynamo runs untraced, checks it (a RuntimeError
        # there reaches the caller as torch._dynamo.exc.TorchRuntimeError, itself a RuntimeError).
        return backend_of(device) if device.type in ('cuda', 'npu') else 'ascend'
    backend = backend_of(device)
    if ascend_emulator.runs(device):
        ascend_emulator.require()
    elif backend == 'ascend':
        require_ascend()
    return backend


def device_guard(device: torch.device):
    """Context manager making `device` current, so kernels compile for it and launch on its stream."""
    if ascend_emulator.runs(device):
        return contextlib.nullcontext()
    if backend_of(device) == 'ascend':
        return torch.npu.device(device)
    return torch.cuda.device(device)


def get_device() -> torch.device:
    """The current accelerator device: the current NPU where torch_npu has one, else the current GPU,
    else the CPU under the Ascend C emulator opt-in."""
    if is_ascend_available():
        return torch.device('npu', torch.npu.current_device())
    if is_cuda_available():
        return torch.device('cuda', torch.cuda.current_device())
    if ascend_emulator.enabled():
        return torch.device('cpu')
    raise RuntimeError('no accelerator: neither an Ascend NPU (torch_npu) nor a CUDA GPU is available')


def _index(device: torch.device | None, backend: Backend) -> int:
    if device is not None and device.index is not None:
        return device.index
    return torch.npu.current_device() if backend == 'ascend' else torch.cuda.current_device()


@functools.cache
def _npu_properties(index: int):
    require_ascend()
    return torch.npu.get_device_properties(index)


def get_num_vector_cores(device: torch.device | None = None) -> int:
    """Vector (AIV) cores of an Ascend device; one vector-only kernel block runs per core."""
    return int(_npu_properties(_index(device, 'ascend')).vector_core_num)


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def get_num_sms(device: torch.device | None = None) -> int:
    """Streaming multiprocessors of a CUDA device."""
    return _cuda_sm_count(_index(device, 'cuda'))


def get_num_cores(device: torch.device) -> int:
    """Cores a persistent vector kernel spreads over: AIV cores on Ascend (the emulated chip's on the
    emulator), SMs on CUDA."""
    if ascend_emulator.runs(device):
        return EMULATED_VECTOR_CORES
    if backend_of(device) == 'ascend':
        return get_num_vector_cores(device)
    return get_num_sms(device)


def cuda_arch_for(major: int, minor: int) -> str:
    """TileLang's arch for a compute capability; Hopper/Blackwell get the arch-specific 'a' target
    (TileLang's warp-specialised TMA pipelines use setmaxnreg, which plain sm_90 rejects)."""
    return f'sm_{major}{minor}' + ('a' if major in (9, 10) else '')


@functools.cache
def _cuda_arch(index: int) -> str:
    return cuda_arch_for(*torch.cuda.get_device_capability(index))


def get_cuda_arch(device: torch.device | None = None) -> str:
    """Arch of a CUDA device as TileLang's target wants it, e.g. 'sm_90a' on an H200."""
    return _cuda_arch(_index(device, 'cuda'))


def should_print_kernel_source() -> bool:
    """Whether OPS_TILELANG_PRINT_KERNEL_SOURCE asks operators to print the generated source."""
    return _env_flag(PRINT_KERNEL_SOURCE_ENV)


# os.environ.get of an unset variable raises and catches a KeyError inside the mapping (about a microsecond);
# every launch asks, and the variable is usually unset. os.environ keeps its encoded items in one dict, which
# its __setitem__ / __delitem__ (monkeypatch.setenv too) update, so a lookup there sees every change.
_ENVIRON_ITEMS = getattr(os.environ, '_data', None)
_PRINT_KERNEL_SOURCE_KEY = os.environ.encodekey(PRINT_KERNEL_SOURCE_ENV) if _ENVIRON_ITEMS is not None else None


def kernel_source_requested() -> bool:
    """should_print_kernel_source() on the launch path: False at the cost of a dict lookup while unset."""
    if _ENVIRON_ITEMS is not None and _PRINT_KERNEL_SOURCE_KEY not in _ENVIRON_ITEMS:
        return False
    return should_print_kernel_source()
