"""Kernels of per_block_cast_lossless: FP4 (e2m1) data with power-of-two scales -> FP8 (e4m3) data with one
power-of-two scale per (larger) block, without loss where the scales allow it.

Semantics (those of TileKernels 2.1.0's `per_block_cast_lossless(x, 'e4m3', x_block_size, out_block_size)`,
defined here where the peer asserts on the device). x = (data, sf): data (T, H / 2) bytes, two e2m1 codes each,
the low nibble the even element; sf one scale per input block of (bti, bci) tokens x channels. Only the biased
exponent of a scale is read, e = its UE8M0 byte, or bits 23..30 of an fp32 scale (the mantissa and sign bits are
ignored: the scales of an FP4 cast are powers of two). For each output block of (bto, bco) tokens x channels
(multiples of the input block's), over the rows that exist (the last token block may be partial):

    M = max of the block's input exponents e
    E = max(M - 6, 0)                                the output scale 2 ** (E - 127): fp32 bits E << 23, or UE8M0 E
    data = e4m3(e2m1 * 2 ** (e - E))                 per element, e its input block's exponent; to nearest even

Why 6: the largest e2m1 magnitude is 6 = 1.5 * 2**2 and 1.5 * 2**8 = 384 is an e4m3 value (the largest is 448),
so the block with the largest exponent keeps its values exactly (e - E <= 6) and none overflows.

Exactness: every nonzero e2m1 value is n * 2**-1 for an integer n in {1, 2, 3, 4, 6, 8, 12}, at most two
significant bits; e4m3 holds such values exactly down to its smallest subnormal 2**-9. So an element is exact
when d = e - E >= -8 (for d = -9 only 0.5 and 1.5 round, for d <= -10 more), and

    decode(data) * out_sf == decode(x) * x_sf  bit for bit, for every element, when each output block's input
    exponents lie in 1..254 with max M >= 7 and M - e <= 14

(M >= 7 keeps E >= 1: E = 0 is the fp32 scale 0.0, as in the peer; e = 0 is the scale 0.0 of the input and 255
inf, which the output cannot carry). Beyond the bound (M - e > 14) the element is rounded to nearest even onto
the e4m3 subnormal grid (possibly to +-0), a defined result, no assert and no host synchronisation (the peer's
CUDA kernel asserts M - e <= 11, the normal e4m3 range only, its Ascend kernel the same). The product is formed
exactly on the bits: e2m1 code c with magnitude bits m = c & 7 is 0 (m = 0), 2 ** (d - 1) (m = 1), else the fp32
with bits (m << 22) + ((126 + d) << 23); d is clamped at -16 first, where every value already rounds to +-0.
The sign is the code's (-0 stays -0).

Layouts: data (T, H / 2) int8 in, (T, H) float8_e4m3fn out. Scales: fp32 (rows, H / bc) or UE8M0 bytes
(rows, H / bc rounded up to 4) with zero padding (the interface views four bytes as one int32), rows = T for
bti = 1 per token, ceil(T / bt) otherwise; the output's rows are ceil(T / bto). The output scales may be written
column-major (`col_major_sf`, TileKernels' use_tma_aligned_col_major_sf): the same values, scale k of output row r
at element k * S + r of a buffer of row stride S >= rows (packed UE8M0: word k // 4, byte k % 4), the kernels
taking the transposed view; on Ascend a task's packed scales are then whole int32 words (one burst each).

Supported: bti in (1, 32, 64, 128), bci in (16, 32, 64, 128), bto and bco in (32, 64, 128), bto % bti = 0,
bco % bci = 0; H a positive multiple of max(128, bco) (the peer's `hidden % 128`); T >= 1 per launch (the
interface skips empty inputs). One generator builds the Ascend 950 kernel (_per_block_cast_lossless_ascend.py)
or the CUDA kernel (_per_block_cast_lossless_cuda.py), chosen by `cfg.backend`; both take (x, x_sf, out,
out_sf) and are bit-exact against tests/quant/per_block_cast_lossless_ref.py.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools
import math

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle).
from ._per_block_cast_lossless_ascend import ascend_per_block_cast_lossless_kernel
from ._per_block_cast_lossless_cuda import CUDA_VECTOR, cuda_per_block_cast_lossless_kernel
from ._scale_rules import UE8M0_PACK
from ._tiling import divisors

IN_BLOCK_TOKENS = (1, 32, 64, 128)
IN_BLOCK_CHANNELS = (16, 32, 64, 128)
OUT_BLOCK_TOKENS = (32, 64, 128)
OUT_BLOCK_CHANNELS = (32, 64, 128)
EXPONENT_HEADROOM = 6  # E = max(M - 6, 0): 6 * 2**6 = 384 is still an e4m3 value
EXACT_SPREAD = 14  # M - e <= 14 (d >= -8): every e2m1 value times 2**d is an e4m3 value
MIN_OFFSET = -16  # d is clamped here: 6 * 2**-16 < 2**-10, every value already rounds to +-0
CHUNK = 128  # elements of one Ascend step: 64 bytes of FP4, one byte per 32-bit lane
_ASCEND_TASK_ELEMS = 32768  # elements per Ascend task: 16 KiB of FP4 in, 32 KiB of e4m3 out per buffer version
_ASCEND_UB_BYTES = 192 * 1024
_CUDA_TASK_ELEMS = 16384  # elements per CUDA thread block: 8 KiB of FP4 in, 16 KiB out
_CUDA_THREADS = 256


def hidden_multiple(out_block_channels: int) -> int:
    """What H must be a positive multiple of: whole output blocks and whole 128-element Ascend steps."""
    return max(CHUNK, out_block_channels)


def _aligned(n: int) -> int:
    return -(-n // 32) * 32


@dataclasses.dataclass(frozen=True)
class PerBlockCastLosslessConfig:
    backend: Backend
    hidden: int
    in_block_tokens: int  # bti
    in_block_channels: int  # bci
    out_block_tokens: int  # bto
    out_block_channels: int  # bco
    in_packed: bool  # input scales as UE8M0 bytes (else fp32)
    out_packed: bool  # output scales as UE8M0 bytes (else fp32)
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational)
    block_k: int  # channels of one task / thread block; divides hidden
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions (1 on CUDA)
    # The output scales column-major: the kernels take the transposed view (out_sf_cols, rows) of row stride
    # sf_stride (packed UE8M0: (out_sf_cols / 4, 4 rows) bytes), as per_block_cast's (col_major_scales).
    col_major_sf: bool = False

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        _check_blocks(self.in_block_tokens, self.in_block_channels, self.out_block_tokens, self.out_block_channels)
        unit = hidden_multiple(self.out_block_channels)
        if self.hidden <= 0 or self.hidden % unit:
            raise ValueError(f'hidden must be a positive multiple of {unit}, got {self.hidden}')
        if self.block_k <= 0 or self.block_k % unit or self.hidden % self.block_k:
            raise ValueError(f'block_k {self.block_k} must be a multiple of {unit} dividing hidden {self.hidden}')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.backend == 'ascend' and not self.whole_word_tasks:
            raise ValueError(
                f'Ascend: column-major UE8M0 scales need whole int32 words per task: block_k {self.block_k} must '
                f'hold a multiple of {UE8M0_PACK} output blocks of {self.out_block_channels}, or be the whole row'
            )
        if self.backend == 'ascend':
            if self.num_stages < 1:
                raise ValueError(f'num_stages must be >= 1, got {self.num_stages}')
            if self.ascend_ub_bytes > _ASCEND_UB_BYTES:
                raise ValueError(
                    f'Ascend: a task of {self.out_block_tokens} x {self.block_k} needs {self.ascend_ub_bytes} B '
                    f'of UB, more than {_ASCEND_UB_BYTES}'
                )
        else:
            if self.num_stages != 1:
                raise ValueError(f'CUDA: num_stages must be 1, got {self.num_stages}')
            if self.threads % 32 or not 32 <= self.threads <= 1024:
                raise ValueError(f'CUDA: threads must be a multiple of 32 in [32, 1024], got {self.threads}')
            if self.cuda_steps * self.threads * CUDA_VECTOR != self.out_block_tokens * self.block_k:
                raise ValueError(
                    f'CUDA: threads {self.threads} x {CUDA_VECTOR} elements must divide a tile of '
                    f'{self.out_block_tokens} x {self.block_k}'
                )

    # ---- the math's constants, for the backends (which cannot import this module)
    @property
    def headroom(self) -> int:
        return EXPONENT_HEADROOM

    @property
    def min_offset(self) -> int:
        return MIN_OFFSET

    # ---- scale layouts
    @property
    def per_token_input(self) -> bool:
        return self.in_block_tokens == 1

    @property
    def in_sf_cols(self) -> int:
        """Elements of an input scale row (fp32 scales, or UE8M0 bytes padded to whole int32 words)."""
        blocks = self.hidden // self.in_block_channels
        return -(-blocks // UE8M0_PACK) * UE8M0_PACK if self.in_packed else blocks

    @property
    def out_blocks(self) -> int:
        return self.hidden // self.out_block_channels

    @property
    def out_sf_cols(self) -> int:
        return -(-self.out_blocks // UE8M0_PACK) * UE8M0_PACK if self.out_packed else self.out_blocks

    @property
    def out_sf_padding(self) -> int:
        return self.out_sf_cols - self.out_blocks

    @property
    def in_sf_dtype(self) -> str:
        return 'uint8' if self.in_packed else 'float32'

    @property
    def out_sf_dtype(self) -> str:
        return 'uint8' if self.out_packed else 'float32'

    def in_sf_shape(self, num_tokens: int) -> tuple[int, int]:
        return -(-num_tokens // self.in_block_tokens), self.in_sf_cols

    def out_sf_shape(self, num_tokens: int) -> tuple[int, int]:
        return -(-num_tokens // self.out_block_tokens), self.out_sf_cols

    # ---- tiling
    @property
    def num_col_tiles(self) -> int:
        return self.hidden // self.block_k

    @property
    def in_groups(self) -> int:
        """Input blocks along the channels of one task."""
        return self.block_k // self.in_block_channels

    @property
    def out_groups(self) -> int:
        """Output blocks along the channels of one task."""
        return self.block_k // self.out_block_channels

    @property
    def in_per_out(self) -> int:
        """Input blocks (along the channels) per output block: a power of two, 1..8."""
        return self.out_block_channels // self.in_block_channels

    @property
    def sf_rows_per_task(self) -> int:
        """Input scale rows one task reads (all of them when its token block is whole)."""
        return self.out_block_tokens // self.in_block_tokens

    @property
    def ascend_ub_bytes(self) -> int:
        """UB the Ascend kernel allocates (each buffer rounded up to 32 bytes)."""
        from ._per_block_cast_lossless_ascend import ascend_buffer_shapes

        total = 0
        for shape, itemsize, versions in ascend_buffer_shapes(self):
            n = itemsize
            for s in shape:
                n *= s
            total += _aligned(n) * versions
        return total

    @property
    def whole_word_tasks(self) -> bool:
        """Whether each task's output scales are whole UE8M0 words where they must be (Ascend, column-major packed
        scales: one burst per word): a multiple of 4 blocks per task, or the row in one task (its padding ends it)."""
        if not (self.col_major_sf and self.out_packed):
            return True
        return self.out_groups % UE8M0_PACK == 0 or self.num_col_tiles == 1

    @property
    def cuda_steps(self) -> int:
        """CUDA: CUDA_VECTOR-element pieces of the tile each thread converts."""
        return self.out_block_tokens * self.block_k // (self.threads * CUDA_VECTOR)


def _check_blocks(bti: int, bci: int, bto: int, bco: int) -> None:
    for what, value, allowed in (
        ('in_block_tokens', bti, IN_BLOCK_TOKENS),
        ('in_block_channels', bci, IN_BLOCK_CHANNELS),
        ('out_block_tokens', bto, OUT_BLOCK_TOKENS),
        ('out_block_channels', bco, OUT_BLOCK_CHANNELS),
    ):
        if value not in allowed:
            raise ValueError(f'{what} must be one of {allowed}, got {value}')
    if bto % bti or bco % bci:
        raise ValueError(f'the output block ({bto}, {bco}) must be a multiple of the input block ({bti}, {bci})')


def choose_per_block_cast_lossless_config(
    *,
    backend: Backend,
    num_cores: int,
    hidden: int,
    in_block_tokens: int = 1,
    in_block_channels: int = 32,
    out_block_tokens: int = 32,
    out_block_channels: int = 32,
    in_packed: bool = False,
    out_packed: bool = False,
    col_major_sf: bool = False,
) -> PerBlockCastLosslessConfig:
    """Pure choice of the compile-time parameters (no device query). Invalid combinations raise ValueError."""
    _check_blocks(in_block_tokens, in_block_channels, out_block_tokens, out_block_channels)
    unit = hidden_multiple(out_block_channels)
    if hidden <= 0 or hidden % unit:
        raise ValueError(f'hidden must be a positive multiple of {unit}, got {hidden}')
    make = functools.partial(
        PerBlockCastLosslessConfig, backend, hidden, in_block_tokens, in_block_channels, out_block_tokens,
        out_block_channels, in_packed, out_packed, num_cores, col_major_sf=col_major_sf,
    )  # fmt: skip
    if backend == 'ascend':
        # The widest task of about 32 Ki elements: the op streams x once, so fewer, longer DMAs per core.
        limit = _ASCEND_TASK_ELEMS // out_block_tokens
        block_k = divisors(hidden, unit, limit)[0]
        if col_major_sf and out_packed and (block_k // out_block_channels) % UE8M0_PACK:
            # Column-major UE8M0 words go out one burst each: tasks of whole words, else the row (if UB holds it).
            words = divisors(hidden, math.lcm(unit, UE8M0_PACK * out_block_channels), limit)
            block_k = words[0] if words else hidden  # the config refuses a task that UB cannot hold
        return make(block_k=block_k, threads=0, num_stages=2)
    if backend == 'cuda':
        block_k = divisors(hidden, unit, _CUDA_TASK_ELEMS // out_block_tokens)[0]
        threads = min(_CUDA_THREADS, out_block_tokens * block_k // CUDA_VECTOR)
        while out_block_tokens * block_k % (threads * CUDA_VECTOR):
            threads -= 32
        return make(block_k=block_k, threads=threads, num_stages=1)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_per_block_cast_lossless_kernel(cfg: PerBlockCastLosslessConfig):
    """The TileLang prim_func `per_block_cast_lossless_kernel` for `cfg.backend` (no compile). Arguments:
    x (T, hidden / 2) uint8, x_sf cfg.in_sf_shape(T) cfg.in_sf_dtype, out (T, hidden) float8_e4m3fn (uint8 on
    Ascend: the same bytes), out_sf cfg.out_sf_shape(T) cfg.out_sf_dtype. T is dynamic and must be >= 1."""
    if cfg.backend == 'ascend':
        return ascend_per_block_cast_lossless_kernel(cfg)
    return cuda_per_block_cast_lossless_kernel(cfg)


@functools.cache
def get_per_block_cast_lossless_kernel(cfg: PerBlockCastLosslessConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_per_block_cast_lossless_kernel(cfg), cfg.backend)
