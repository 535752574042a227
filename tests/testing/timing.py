"""Device timing for benchmarks: the clock, the cluster name and the environment of a record.

`DeviceBackend` is what the benchmark plugin uses on a real accelerator; CPU tests of the plugin
replace it (hook `pytest_benchmark_backend`) with any object of the same four methods.

Timing: `tilelang.profiler.bench.do_bench`, device time only, never the CPU clock:
- Ascend: backend 'msprof' (per-kernel device durations from the NPU profiler);
- CUDA: backend 'cupti' (kernel durations from the CUDA profiler), or 'event' (CUDA events around
  each call) where CUPTI is unavailable. CUPTI is probed once per process, on the first timing:
  unsupported by this torch, raising, or reporting no kernel time all switch to 'event' for good.

do_bench runs `fn` once, estimates its time from 5 calls, warms up for WARMUP_MS, then times
REP_MS worth of calls (at least one), flushing the L2 cache before each call and excluding the
flush from the time. 'msprof' and 'cupti' return the mean device time per call of those calls
(`return_mode` only shapes 'event', which returns the median call). `time_us` repeats this ROUNDS
times and returns the median of the rounds, so one disturbed round does not move a baseline.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import re
import types
import warnings
from collections.abc import Callable

import torch

from cann_ops_tilelang import config
from tests.testing.plugins.devices import accelerator_missing_reason

WARMUP_MS = 25
REP_MS = 50
ROUNDS = 3

_VENDOR_WORDS = {'nvidia', 'geforce', 'tesla', 'quadro'}
_VARIANT_WORD = re.compile(r'\d+gb|sxm\d*|pcie|hbm\d*e?|nvl|nvlink|mig.*')


def cluster_name(backend: str, device_name: str) -> str:
    """The baseline cluster of a device: 'a5' for any Ascend 950, else a slug of the model.

    'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA A100-SXM4-80GB' -> 'a100',
    'NVIDIA GeForce RTX 4090' -> 'rtx4090'; other Ascend chips keep their name ('Ascend910B3' ->
    'ascend910b3'), so they never mix with Ascend 950 baselines.
    """
    if backend == 'ascend' and '950' in device_name:
        return 'a5'
    words = [w for w in re.split(r'[\s_\-]+', device_name.strip().lower()) if w and w not in _VENDOR_WORDS]
    model = []
    for word in words:
        if _VARIANT_WORD.fullmatch(word):
            break
        model.append(re.sub(r'[^a-z0-9]', '', word))
    name = ''.join(model)
    if not name:
        raise RuntimeError(f'cannot derive a baseline cluster name from the device name {device_name!r}')
    return name


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cann_version() -> str | None:
    torch_npu = config._torch_npu()
    if torch_npu is None:
        return None
    try:
        from torch_npu.npu.utils import get_cann_version

        version = get_cann_version('CANN')
    except Exception:  # older torch_npu: no such API, or it cannot read the CANN install
        version = None
    return version or getattr(torch.version, 'cann', None) or None


class NoAcceleratorError(RuntimeError):
    """Benchmarks time device work only: there is no accelerator to time on."""


class DeviceBackend:
    """Times on the current accelerator; names its cluster and environment (device queries are lazy)."""

    def __init__(self) -> None:
        self._cuda_timer: str | None = None  # 'cupti' or 'event', decided on the first CUDA timing

    @functools.cached_property
    def device(self) -> torch.device:
        reason = accelerator_missing_reason()
        if reason is not None:
            raise NoAcceleratorError(f'benchmarks time device work, never the CPU: {reason}')
        return config.get_device()

    @functools.cached_property
    def backend(self) -> str:
        return config.backend_of(self.device)

    @functools.cached_property
    def device_name(self) -> str:
        if self.backend == 'ascend':
            return str(torch.npu.get_device_name(self.device.index))
        return str(torch.cuda.get_device_name(self.device.index))

    def public_operators(self) -> frozenset[str]:
        return public_operator_names()

    def cluster(self) -> str:
        return cluster_name(self.backend, self.device_name)

    def environment(self) -> dict[str, str | None]:
        return {
            'device': self.device_name,
            'cann': _cann_version() if self.backend == 'ascend' else None,
            'cuda': torch.version.cuda if self.backend == 'cuda' else None,
            'torch': torch.__version__,
            'torch_npu': _version('torch_npu') if self.backend == 'ascend' else None,
            'tilelang': _version('tilelang'),
        }

    def time_us(self, fn: Callable[[], object]) -> tuple[float, str]:
        """(median device time of `fn()` in microseconds, the do_bench backend that measured it)."""
        if self.backend == 'ascend':
            return self._rounds(fn, 'msprof'), 'msprof'
        if self._cuda_timer is None:
            self._cuda_timer = self._probe_cupti(fn)
            if self._cuda_timer == 'event':
                return self._rounds(fn, 'event'), 'event'
        return self._rounds(fn, self._cuda_timer), self._cuda_timer

    def _bench_ms(self, fn: Callable[[], object], timer: str) -> float:
        from tilelang.profiler.bench import do_bench

        device = self.device if self.backend == 'ascend' else self.device.index
        return float(do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, backend=timer, return_mode='median', device=device))

    def _rounds(self, fn: Callable[[], object], timer: str) -> float:
        times = sorted(self._bench_ms(fn, timer) * 1e3 for _ in range(ROUNDS))
        median = times[len(times) // 2]
        if not (math.isfinite(median) and median > 0):
            raise RuntimeError(f'do_bench(backend={timer!r}) measured {median} us: no device time was recorded')
        return median

    def _probe_cupti(self, fn: Callable[[], object]) -> str:
        supported = torch.profiler.ProfilerActivity.CUDA in torch.profiler.supported_activities()
        if not supported:
            warnings.warn('CUPTI is not available to torch.profiler: benchmarks use CUDA events', stacklevel=3)
            return 'event'
        fn()  # the function's own errors are not the profiler's
        try:
            probe = self._bench_ms(fn, 'cupti')
        except Exception as exc:
            warnings.warn(f'CUPTI timing failed ({exc!r}): benchmarks use CUDA events', stacklevel=3)
            return 'event'
        if not (math.isfinite(probe) and probe > 0):
            warnings.warn(
                'CUPTI recorded no kernel time (profiling not permitted?): benchmarks use CUDA events', stacklevel=3
            )
            return 'event'
        return 'cupti'


def public_operator_names() -> frozenset[str]:
    """The names a baseline record may carry: the root package's operators, and those of an experimental domain
    as '<domain>.<name>' (what the benchmark plugin records and the committed-records check accepts)."""
    import cann_ops_tilelang

    return frozenset(cann_ops_tilelang.__all__) | experimental_operators(cann_ops_tilelang)


def record_name(domain: str, name: str) -> str:
    """The name a baseline record gives an operator: `name` once the root package exports it, else
    '<domain>.<name>' (one of public_operator_names)."""
    import cann_ops_tilelang

    return name if name in cann_ops_tilelang.__all__ else f'{domain}.{name}'


def experimental_operators(package) -> frozenset[str]:
    """'<domain>.<name>' of every function a domain subpackage exports that the root package does not (an
    experimental domain's, such as 'quant.per_token_cast'; a call without a torch.library form, such as
    'quant.batched_transpose_weight_sf', too; types are not operators): they are benchmarked under that name."""
    names = set()
    for domain, module in vars(package).items():
        if isinstance(module, types.ModuleType) and module.__name__ == f'{package.__name__}.{domain}':
            for name in getattr(module, '__all__', ()):
                value = getattr(module, name)
                if name not in package.__all__ and callable(value) and not isinstance(value, type):
                    names.add(f'{domain}.{name}')
    return frozenset(names)
