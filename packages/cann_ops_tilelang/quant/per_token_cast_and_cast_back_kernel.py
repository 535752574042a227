"""Kernels of per_token_cast_and_cast_back: in-place FP8 fake quantisation of x (T, H) bf16 / fp32.

Semantics (those of TileKernels 2.1.0's `per_token_cast_and_cast_back(x, fmt, block_size, round_sf, use_e4m3_sf)`):
each row of x is cut into blocks of `block_size` (16, 32, 64 or 128) consecutive elements; a block gets
per_token_cast's scale sf and inverse for the data format (_scale_rules.cuda_cast_scale_and_inverse: fp32 scales
c / m and m / c, round_sf powers of two, or E4M3 scales e4m3(c / m) and the IEEE reciprocal of their value), and

    x[t, h] = x.dtype( fp32(narrow(fp32(x[t, h]) * inverse)) * fp32(sf) )

one fp32 product each way: narrow is per_token_cast's (e4m3: nearest even, saturating at +-448; e2m1: nearest even
on the FP4 grid, saturating at +-6), the widening back is exact, the final cast to bf16 rounds to nearest even (none
for fp32): bit for bit cast_back(per_token_cast(x, fmt, block_size, ...), x.dtype, (1, block_size)). x is
overwritten with the round-tripped values; no scale is returned.
Special values: -0.0 stays -0.0; subnormals are ordinary values; a block with an inf gets sf inf and inverse 0,
so its finite values become +-0 * inf = NaN and the inf NaN (the whole block NaN); NaN in a block is unspecified
(the max reductions may drop it), as in the peer.

Supported: x (T, H) with its last dimension contiguous and any row stride >= H (a dynamic argument of the
kernel: T.StridedTensor), T >= 1 per launch, H a positive multiple of max(64, block_size). Every data format, block
and scale format on both backends (the peer's Ascend kernel: 16-channel blocks with E4M3 scales or 32-channel ones
without).

One generator builds the Ascend 950 kernel (vector cores, SIMD: _per_token_cast_and_cast_back_ascend.py) or the
CUDA kernel (_per_token_cast_and_cast_back_cuda.py), chosen by `cfg.backend`; both take (x) and are bit-exact
against tests/quant/per_token_cast_and_cast_back_ref.py where divisions are IEEE.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools
import math

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle).
from ._per_token_cast_and_cast_back_ascend import ascend_per_token_cast_and_cast_back_kernel
from ._per_token_cast_and_cast_back_cuda import cuda_per_token_cast_and_cast_back_kernel
from ._scale_rules import LANES
from ._tiling import FLOAT_DTYPE_NAMES, divisors
from .per_token_cast_kernel import CAST_BLOCK_SIZES, FORMATS

_ASCEND_MAX_BLOCK_K = 4096  # elements per task: fp32 in and out tiles 16 KiB each, two buffer versions
_CUDA_MAX_BLOCK_K = 2048
_CUDA_THREADS = 64
_ACCESS_BYTES = 16  # the widest CUDA access (one 16-byte vector)
_ELEM_BYTES = {'bfloat16': 2, 'float32': 4}


def hidden_multiple(block_size: int) -> int:
    """What H must be a positive multiple of: whole scale blocks and whole vector registers."""
    return max(LANES, block_size)


@dataclasses.dataclass(frozen=True)
class PerTokenCastAndCastBackConfig:
    backend: Backend
    hidden: int
    in_dtype: str  # 'bfloat16' or 'float32' (x's dtype, in and out)
    block_size: int  # elements per scale factor along H
    round_sf: bool  # power-of-two scales
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the tile count)
    block_k: int  # columns of one row handled per task (Ascend) / per thread block (CUDA); divides hidden
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)
    vec: int  # CUDA: elements per access; x's address and row stride must be multiples of it (unused on Ascend)
    fmt: str = 'e4m3'  # the data format of the round trip (FORMATS: e4m3, or e2m1 FP4)
    e4m3_sf: bool = False  # E4M3 scales (not with round_sf)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.in_dtype not in ('bfloat16', 'float32'):
            raise ValueError(f'in_dtype must be "bfloat16" or "float32", got {self.in_dtype!r}')
        if self.block_size not in CAST_BLOCK_SIZES:
            raise ValueError(f'block_size must be one of {CAST_BLOCK_SIZES}, got {self.block_size}')
        if self.fmt not in FORMATS:
            raise ValueError(f'fmt must be one of {FORMATS}, got {self.fmt!r}')
        if self.e4m3_sf and self.round_sf:
            raise ValueError('e4m3_sf excludes round_sf (E4M3 or power-of-two scales)')
        unit = hidden_multiple(self.block_size)
        if self.hidden <= 0 or self.hidden % unit != 0:
            raise ValueError(
                f'hidden must be a positive multiple of {unit} (block_size {self.block_size}), got {self.hidden}'
            )
        if self.block_k % unit != 0 or self.hidden % self.block_k != 0:
            raise ValueError(f'block_k {self.block_k} must be a multiple of {unit} dividing hidden {self.hidden}')
        if self.backend == 'cuda' and (self.threads <= 0 or self.threads % 32 != 0):
            raise ValueError(f'threads must be a positive multiple of 32, got {self.threads}')
        widest = _ACCESS_BYTES // _ELEM_BYTES[self.in_dtype]
        if self.vec not in [widest >> i for i in range(widest.bit_length())]:
            raise ValueError(f'vec must be a power of two up to {widest} ({self.in_dtype}), got {self.vec}')
        if self.backend == 'ascend' and self.num_stages < 1:
            raise ValueError(f'num_stages must be >= 1, got {self.num_stages}')

    @property
    def groups_per_tile(self) -> int:
        """Scale factors per task / thread block."""
        return self.block_k // self.block_size

    @property
    def num_col_tiles(self) -> int:
        return self.hidden // self.block_k


def choose_per_token_cast_and_cast_back_config(
    *,
    backend: Backend,
    num_cores: int,
    hidden: int,
    in_dtype: torch.dtype | str,
    block_size: int = 32,
    round_sf: bool = False,
    vec: int | None = None,
    fmt: str = 'e4m3',
    e4m3_sf: bool = False,
) -> PerTokenCastAndCastBackConfig:
    """Pure choice of the compile-time parameters (no device query). `in_dtype`: torch.bfloat16 / torch.float32
    (or their names). The row stride is not a parameter: it is the kernel's dynamic argument; `vec` (CUDA) is the
    access width in elements that x's address and row stride must be multiples of: 16 bytes unless given (the
    caller passes a narrower one for a less aligned x), narrowed where H has no whole warp of 16-byte vectors.
    Invalid combinations raise ValueError."""
    if in_dtype not in FLOAT_DTYPE_NAMES:
        raise ValueError(f'in_dtype must be torch.bfloat16 or torch.float32, got {in_dtype!r}')
    dtype = FLOAT_DTYPE_NAMES[in_dtype]
    if block_size not in CAST_BLOCK_SIZES:
        raise ValueError(f'block_size must be one of {CAST_BLOCK_SIZES}, got {block_size}')
    unit = hidden_multiple(block_size)
    if hidden <= 0 or hidden % unit != 0:
        raise ValueError(f'hidden must be a positive multiple of {unit} (block_size {block_size}), got {hidden}')
    widest = _ACCESS_BYTES // _ELEM_BYTES[dtype]
    if vec is not None and vec not in [widest >> i for i in range(widest.bit_length())]:
        raise ValueError(f'vec must be a power of two up to {widest} ({dtype}), got {vec}')
    make = functools.partial(
        PerTokenCastAndCastBackConfig, backend, hidden, dtype, block_size, bool(round_sf), num_cores,
        fmt=fmt, e4m3_sf=bool(e4m3_sf),
    )  # fmt: skip
    if backend == 'ascend':
        # The largest task that fits the buffers: x streams once, so fewer, longer DMAs per core. The DMA takes
        # any element-aligned row start: vec stays the widest (unused).
        return make(block_k=divisors(hidden, unit, _ASCEND_MAX_BLOCK_K)[0], threads=0, num_stages=2, vec=widest)
    if backend == 'cuda':
        # One small thread block per (token, column tile), many per SM, as per_token_cast: each thread holds
        # block_k / threads elements, read and written with 16-byte accesses.
        # A warp's 16-byte vectors (32 * widest elements) tile the row where H allows it (every production size);
        # otherwise the accesses narrow to what block_k / threads elements per thread allow.
        vec = widest if vec is None else vec
        warp_unit = math.lcm(unit, 32 * vec)
        block_k = divisors(hidden, warp_unit if hidden % warp_unit == 0 else unit, _CUDA_MAX_BLOCK_K)[0]
        threads = 32 * max(1, min(_CUDA_THREADS // 32, block_k // 1024))
        while block_k // threads % vec:
            vec //= 2
        return make(block_k=block_k, threads=threads, num_stages=1, vec=vec)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_per_token_cast_and_cast_back_kernel(cfg: PerTokenCastAndCastBackConfig):
    """The TileLang prim_func `per_token_cast_and_cast_back_kernel(x)` for `cfg.backend` (no compile).

    x: (T, hidden) cfg.in_dtype with row stride x.stride(0) >= hidden (dynamic, as T) and unit column stride,
    updated in place. T must be >= 1.
    """
    if cfg.backend == 'ascend':
        return ascend_per_token_cast_and_cast_back_kernel(cfg)
    return cuda_per_token_cast_and_cast_back_kernel(cfg)


@functools.cache
def get_per_token_cast_and_cast_back_kernel(cfg: PerTokenCastAndCastBackConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_per_token_cast_and_cast_back_kernel(cfg), cfg.backend)
