"""Kernels of quant.cast: a contiguous tensor, flattened to n elements, cast element by element to another dtype,
to nearest even or by stochastic rounding.

Semantics (those of TileKernels 2.1.0's `cast(x, dtype, stochastic_rounding)`, with a seed and fixed special
values added):

- Plain casts, between float32, bfloat16, float16, float8_e4m3fn and float8_e5m2 (every ordered pair of two of
  them): the value goes through fp32 (exact: every source value is an fp32 value) and is narrowed once, to
  nearest even. To the FP8 formats the narrowing saturates, at +-448 (e4m3, as the domain's other casts) or
  +-57344 (e5m2), +-inf included, and NaN stays NaN; to bf16 / fp16 it follows IEEE (overflow -> +-inf, NaN
  stays NaN, its payload unspecified).
- Stochastic rounding (`stochastic_rounding`), for float32 -> bfloat16, float32 -> float8_e4m3fn and
  bfloat16 -> float8_e4m3fn: a finite magnitude rounds up to its upper neighbour with probability (distance to
  the lower one) / (spacing), from random bits that are a function of (seed, element index) only:

      key  = fmix32(seed)                                  (the host: MurmurHash3's finaliser, a bijection)
      h    = index * INDEX_STEP + key; h ^= h >> 16; h *= MUL1; h ^= key; h ^= h >> 13; h *= MUL2   (mod 2**32)

  bf16: m = min(|bits|, BF16_MAX_BITS); out = (m + (h >> 16)) >> 16 with x's sign: the low 16 bits of the
  magnitude are the distance fraction, a carry rounds up (into the next binade where it must). Finite values
  saturate at the largest finite bf16, +-inf stay, NaN becomes the quiet NaN 0x7FC0 with x's sign.
  e4m3: a = min(|x|, 448); v = max(a, fp32(a + 2**-6) * 0.5) (below 2**-6, e4m3's subnormal spacing 2**-9, a
  is moved on a grid of 2**-29 with one round to nearest even, into the binade of 2**-7 whose mantissa then has
  e4m3's spacing at bit 20); code = (bits(v) + (h >> 12) - bits(2**-7)) >> 20, the e4m3 magnitude code, with
  x's sign. +-inf and values past 448 saturate to +-448, NaN -> 0x7F with x's sign, -0.0 stays -0.0, fp32
  subnormals round to 0 or 2**-9 like any value below 2**-9.

  Both backends compute this with integer and exact fp32 operations only, so the same seed gives the same bytes
  on both (checked against tests/quant/stochastic_rounding_ref.py on the emulator). The kernels write the bits
  of these outputs (uint16 for bf16, uint8 for e4m3: the interface passes views; CastConfig.out_storage).

Supported: n >= 1 per launch (the interface skips empty tensors), n <= MAX_NUMEL so that every index, and the
end of the last CUDA tile, fits int32 (the hash takes the index as uint32). Any n: tails are whole vector
registers (Ascend: DMA of the valid elements only) or guarded element accesses (CUDA).

One generator builds the Ascend 950 kernel (vector cores, SIMD: _cast_ascend.py) or the CUDA kernel
(_cast_cuda.py), chosen by `cfg.backend`.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle; what they share comes as `recipe`).
from ._cast_ascend import ascend_cast_kernel
from ._cast_cuda import cuda_cast_kernel
from ._contract import MAX_NUMEL as _DOMAIN_MAX_NUMEL
from ._scale_rules import FP8_MAX

# torch dtype -> the name the kernels take, and its bytes per element
DTYPE_NAMES = {
    torch.float32: 'float32',
    torch.bfloat16: 'bfloat16',
    torch.float16: 'float16',
    torch.float8_e4m3fn: 'float8_e4m3fn',
    torch.float8_e5m2: 'float8_e5m2',
}
DTYPE_BYTES = {'float32': 4, 'bfloat16': 2, 'float16': 2, 'float8_e4m3fn': 1, 'float8_e5m2': 1}
# Stochastic rounding's pairs (TileKernels' set), and the dtype of the bits the kernels write for each output
STOCHASTIC_PAIRS = (('float32', 'bfloat16'), ('float32', 'float8_e4m3fn'), ('bfloat16', 'float8_e4m3fn'))
STOCHASTIC_BITS = {'bfloat16': 'uint16', 'float8_e4m3fn': 'uint8'}
SEED_LIMIT = 2**32  # seeds are in [0, SEED_LIMIT): one uint32 key each

_MAX_TILE = 2**18  # elements of one Ascend task or one CUDA thread block, at most
MAX_NUMEL = _DOMAIN_MAX_NUMEL - _MAX_TILE  # the CUDA tile past the last element still fits int32
_ASCEND_STAGE_BYTES = 96 * 1024  # x and out bytes of one task; two buffer versions fill 192 of the 248 KiB of UB
CUDA_ACCESS_BYTES = 16  # bytes of one vector load / store
_CUDA_THREADS = 256
_CUDA_STEPS = 2  # 16-byte accesses of the narrower side per thread, all loads issued before the first store


@dataclasses.dataclass(frozen=True)
class CastRecipe:
    """The constants of the casts, one home for both backends (their files take it as an argument)."""

    index_step: int = 0x9E3779B1  # odd: the golden ratio's 32-bit fraction spreads neighbouring indices apart
    mul1: int = 0x85EBCA6B  # MurmurHash3's finaliser multipliers
    mul2: int = 0xC2B2AE35
    shift1: int = 16
    shift2: int = 13
    bf16_max_bits: int = 0x7F7F0000  # fp32 bits of the largest finite bf16
    e4m3_max: float = FP8_MAX
    e5m2_max: float = 57344.0  # largest finite float8_e5m2
    e4m3_min_normal: float = 2.0**-6
    e4m3_code_base: int = 0x3C000000  # fp32 bits of 2**-7: e4m3 code 0 on the aligned grid
    bf16_random_shift: int = 16  # bf16 takes the top 16 random bits, e4m3 the top 20
    e4m3_random_shift: int = 12


RECIPE = CastRecipe()


def seed_key(seed: int) -> int:
    """The kernels' uint32 key of a seed in [0, SEED_LIMIT): MurmurHash3's finaliser (a bijection)."""
    h = seed
    h ^= h >> 16
    h = (h * RECIPE.mul1) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * RECIPE.mul2) & 0xFFFFFFFF
    return h ^ (h >> 16)


def draw_seed() -> int:
    """A seed from torch's default CPU generator (torch.manual_seed reproduces it; no device is touched)."""
    return int(torch.randint(SEED_LIMIT, (), dtype=torch.int64))


def key_argument(key: int) -> int:
    """The key as the kernels' int32 scalar argument (the same 32 bits)."""
    return key - 2**32 if key >= 2**31 else key


@dataclasses.dataclass(frozen=True)
class CastConfig:
    backend: Backend
    in_dtype: str  # a name of DTYPE_NAMES
    out_dtype: str
    stochastic_rounding: bool
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational: the grid is the tile count)
    tile: int  # elements of one Ascend task / one CUDA thread block
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        for what, name in (('in_dtype', self.in_dtype), ('out_dtype', self.out_dtype)):
            if name not in DTYPE_BYTES:
                raise ValueError(f'{what} must be one of {sorted(DTYPE_BYTES)}, got {name!r}')
        if self.in_dtype == self.out_dtype:
            raise ValueError(f'in_dtype and out_dtype are both {self.in_dtype!r}: nothing to cast')
        if self.stochastic_rounding and (self.in_dtype, self.out_dtype) not in STOCHASTIC_PAIRS:
            raise ValueError(
                f'stochastic rounding casts {STOCHASTIC_PAIRS} only, got ({self.in_dtype!r}, {self.out_dtype!r})'
            )
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.tile < 1 or self.tile > _MAX_TILE:
            raise ValueError(f'tile must be in [1, {_MAX_TILE}], got {self.tile}')
        if self.backend == 'ascend':
            if self.tile % 64:  # whole 64-lane fp32 registers
                raise ValueError(f'Ascend: tile must be a multiple of 64, got {self.tile}')
            if self.num_stages < 1:
                raise ValueError(f'num_stages must be >= 1, got {self.num_stages}')
            if self.tile * (self.in_bytes + self.out_bytes) > _ASCEND_STAGE_BYTES:
                raise ValueError(f'Ascend: a task of {self.tile} elements exceeds {_ASCEND_STAGE_BYTES} bytes of UB')
        else:
            if self.threads % 32 or not 32 <= self.threads <= 1024:
                raise ValueError(f'CUDA: threads must be a multiple of 32 in [32, 1024], got {self.threads}')
            if self.tile % (self.threads * self.vector):
                raise ValueError(
                    f'CUDA: tile {self.tile} must be a multiple of threads x {self.vector} elements per access'
                )

    @property
    def in_bytes(self) -> int:
        return DTYPE_BYTES[self.in_dtype]

    @property
    def out_bytes(self) -> int:
        return DTYPE_BYTES[self.out_dtype]

    @property
    def out_storage(self) -> str:
        """The dtype of the kernel's out argument: the result's dtype, or its bits (the interface passes a view)
        where the kernel writes bits: a stochastic rounding's, and Ascend's e5m2 (TileLang 0.1.15's packed store
        of an fp8 register takes float8_e4m3 pointers but not float8_e5m2 ones: it would store nothing)."""
        if self.stochastic_rounding:
            return STOCHASTIC_BITS[self.out_dtype]
        if self.backend == 'ascend' and self.out_dtype == 'float8_e5m2':
            return 'uint8'
        return self.out_dtype

    @property
    def vector(self) -> int:
        """CUDA: elements per thread and access, 16 bytes of the narrower side (the wider one takes several)."""
        return CUDA_ACCESS_BYTES // min(self.in_bytes, self.out_bytes)

    @property
    def steps(self) -> int:
        """CUDA: accesses of `vector` elements per thread."""
        return self.tile // (self.threads * self.vector)


def choose_cast_config(
    *,
    backend: Backend,
    num_cores: int,
    in_dtype: torch.dtype | str,
    out_dtype: torch.dtype | str,
    stochastic_rounding: bool = False,
) -> CastConfig:
    """Pure choice of the compile-time parameters (no device query). Dtypes as torch dtypes or their names.
    Invalid combinations raise ValueError."""
    names = []
    for what, dtype in (('in_dtype', in_dtype), ('out_dtype', out_dtype)):
        name = DTYPE_NAMES.get(dtype, dtype if dtype in DTYPE_BYTES else None)
        if name is None:
            raise ValueError(f'{what} must be one of {sorted(DTYPE_BYTES)} (or their torch dtypes), got {dtype!r}')
        names.append(name)
    pair_bytes = DTYPE_BYTES[names[0]] + DTYPE_BYTES[names[1]]
    make = functools.partial(CastConfig, backend, *names, stochastic_rounding, num_cores)
    if backend == 'ascend':
        # The largest power-of-two task whose x and out fit a stage: the cast streams, so few, long DMAs per core.
        tile = 1 << (_ASCEND_STAGE_BYTES // pair_bytes).bit_length() - 1
        return make(tile=tile, threads=0, num_stages=2)
    if backend == 'cuda':
        vector = CUDA_ACCESS_BYTES // min(DTYPE_BYTES[names[0]], DTYPE_BYTES[names[1]])
        return make(tile=_CUDA_THREADS * vector * _CUDA_STEPS, threads=_CUDA_THREADS, num_stages=1)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_cast_kernel(cfg: CastConfig):
    """The TileLang prim_func `cast_kernel` for `cfg.backend` (no compile).

    x: (n,) cfg.in_dtype; out: (n,) cfg.out_storage; with stochastic rounding a third argument, the int32 key
    (key_argument(seed_key(seed))). n is dynamic and must be in [1, MAX_NUMEL].
    """
    if cfg.backend == 'ascend':
        return ascend_cast_kernel(cfg, RECIPE)
    return cuda_cast_kernel(cfg, RECIPE)


@functools.cache
def get_cast_kernel(cfg: CastConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_cast_kernel(cfg), cfg.backend)
