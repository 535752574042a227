"""randn, randn_like, set_seed: normal random numbers from a counter-based generator, the same bits on Ascend and
CUDA for the same seed and shape (TileKernels 2.1.0's calls; its CUDA side falls back to torch.randn).

Plain code, not the operator mechanism: the mechanism dispatches on input tensors and randn has none, and its
result depends on hidden state (the stream offset), which a functional torch.library op would let torch.compile
merge or reorder; so there is no torch.library form (torch.compile runs it as a Python call). The checks give
typed errors in the mechanism's order: types, values and sizes, then the device.

State: one int64[2] tensor per device, [k0 | k1 << 32, pair offset] (_counter_normal.py says what the kernels
make of it). A launch reads it on the device; the offset is then advanced by torch's in-place add on the same
stream (one more tiny kernel per call, stream-ordered, so no race with the launch that read it). Nothing of a
call's stream position is baked into the launch: a captured CUDA graph (both kernels) draws fresh numbers on
every replay. A device's state is made on its first draw (draw once before capturing a graph on a device);
set_seed rewrites existing states in place, which captured graphs then see.
"""

from __future__ import annotations

import torch

from cann_ops_tilelang import config
from cann_ops_tilelang.config import require_accelerator
from cann_ops_tilelang.operator import Launchers

from ._counter_normal import pairs_drawn, seed_keys
from .randn_kernel import MAX_NUMEL, TILELANG_DTYPES, choose_randn_config, get_randn_kernel

_SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed takes
_seed: int | None = None  # None: torch.initial_seed(), read on the first draw
_states: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # state, int32 view, offset
_KERNEL = Launchers(choose_randn_config, get_randn_kernel)  # a launcher per (device, dtype)


def _state_words(seed: int) -> list[int]:
    k0, k1 = seed_keys(seed)
    packed = k0 | k1 << 32
    return [packed - 2**64 if packed >= 2**63 else packed, 0]


def _state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    entry = _states.get(device)
    if entry is None:
        global _seed
        if _seed is None:
            _seed = torch.initial_seed()
        state = torch.tensor(_state_words(_seed), dtype=torch.int64, device=device)
        entry = _states[device] = (state, state.view(torch.int32), state[1:])
    return entry


def set_seed(seed: int) -> None:
    """Seed randn on every device (and torch, as torch.manual_seed(seed) does): the next draws restart the
    stream of `seed` at offset 0. seed: an int in [-2**63, 2**64) (torch.manual_seed's range)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f'seed must be an int, got {type(seed).__name__}')
    if not _SEED_RANGE[0] <= seed <= _SEED_RANGE[1]:
        raise ValueError(f'seed must be in [-2**63, 2**64), got {seed}')
    global _seed
    torch.manual_seed(seed)
    _seed = seed
    words = torch.tensor(_state_words(seed), dtype=torch.int64)
    for state, _, _ in _states.values():
        state.copy_(words)  # in place: launches and captured graphs keep reading this tensor


def _shape(size) -> tuple[int, ...]:
    shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int):
            raise TypeError(f'randn: size must be ints or one tuple of ints, got {type(d).__name__} in {size!r}')
    for d in shape:
        if d < 0:
            raise ValueError(f'randn: size must not be negative, got {tuple(shape)}')
    return tuple(shape)


def _device(device) -> torch.device:
    if device is None:
        return config.get_device()
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f'randn: device must be a str or torch.device, got {type(device).__name__}')
    device = torch.device(device)
    if device.type == 'cuda' and device.index is None:
        device = torch.device('cuda', torch.cuda.current_device())
    elif device.type == 'npu' and device.index is None:
        device = torch.device('npu', torch.npu.current_device())
    return device


def randn(
    *size: int | tuple[int, ...],
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """A new contiguous tensor of `size` filled with standard normal numbers (TileKernels 2.1.0's call).

    Element i of a call is a pure function of (seed, stream offset, i) (_counter_normal.py: Box-Muller on 40 + 22
    bits of a counter hash, with this package's own polynomials for ln, sin and cos, built only from correctly
    rounded operations): the same seed, shape and dtype give the same bits on Ascend and on CUDA, whatever the
    core count. Each call advances the device's stream by ceil(numel / 128) * 64 pairs, so draws of multiples of
    128 elements concatenate (randn(256) equals torch.cat((randn(128), randn(128))) after the same set_seed).

    Args:
        size: the shape, as ints or one tuple (list, torch.Size) of ints, each >= 0; at most 2**31 - 2**20
            elements (the kernels' int32 indices).
        dtype: torch.bfloat16, torch.float16 or torch.float32 (None: torch.get_default_dtype()).
        device: an Ascend NPU or a CUDA GPU (None: the current one, config.get_device()); 'cpu' only under the
            Ascend emulator opt-in.

    Returns:
        The tensor; 0 elements: an empty tensor, nothing launched, the stream not advanced.

    Typed errors: TypeError for the types of size, dtype and device and for an unsupported dtype; ValueError for
    negative or too large sizes; RuntimeError for a device without kernels (CPU without the emulator).
    """
    shape = _shape(size)
    if dtype is None:
        dtype = torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f'randn: dtype must be a torch.dtype, got {type(dtype).__name__}')
    if dtype not in TILELANG_DTYPES:
        raise TypeError(f'randn: dtype must be torch.bfloat16, torch.float16 or torch.float32, got {dtype}')
    numel = 1
    for d in shape:
        numel *= d
    if numel > MAX_NUMEL:
        raise ValueError(f'randn: at most {MAX_NUMEL} elements, got {numel} for size {shape}')
    device = _device(device)
    if device.type not in ('cuda', 'npu'):
        # The device guard on every call here: the emulator opt-in may change after a launcher was made.
        require_accelerator(torch.empty(0, device=device))
    # The device guard (RuntimeError) comes with a device's first launcher (backend None: require_accelerator's).
    launcher = _KERNEL.launcher(None, device, dtype=dtype)
    out = torch.empty(shape, dtype=dtype, device=device)
    if numel:
        _, words, offset = _state(device)
        launcher.launch(out.view(-1), words)
        offset.add_(pairs_drawn(numel))
    return out


def randn_like(input: torch.Tensor) -> torch.Tensor:
    """randn(input.shape, dtype=input.dtype, device=input.device) (TileKernels 2.1.0's call)."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f'randn_like: input must be a torch.Tensor, got {type(input).__name__}')
    return randn(tuple(input.shape), dtype=input.dtype, device=input.device)
