"""Kernels of cast_back: FP8 / FP4 dequantisation, data (T, H) float8_e4m3fn or FP4 (T, H / 2) int8 and its
scales -> out (T, H) bf16 / fp32.

Semantics (those of TileKernels 2.1.0's `cast_back((data, sf), fmt, (block_tokens, block_channels))` for
row-major scales): each scale factor covers a block of `block_tokens` (bt) consecutive tokens and
`block_channels` (bc) consecutive channels, and

    out[t, h] = round_to_out( fp32(data[t, h]) * scale(t // bt, h // bc) )

with one fp32 multiply (the e4m3 / e2m1 -> fp32 widening is exact, as is that of E4M3 scales), then the cast to
the output dtype: nearest even into bf16, none for fp32. FP4 data (`fp4`, per_token_cast's 'e2m1'): byte i of a
row holds the e2m1 codes s|ee|m of elements 2 i (low nibble) and 2 i + 1 (high nibble); e2m1 has no inf or NaN,
code 8 is -0.0.

Scale layouts (the kernel's `x_sf`; G = ceil(T / bt) token blocks, the last one may be partial):
  row blocks, bt in (1, 32, 128), bc in (32, 64, 128); bt = 1 also bc = 16 (per_token_cast's blocks):
    fp32        (G, K)                       scale(g, k) = x_sf[g, k], K = ceil(H / bc) blocks a row
    E4M3        (T, K) float8_e4m3fn         scale(t, k) = fp32(x_sf[t, k]) (per-token scales only: `e4m3_sf`)
    UE8M0       (G, 4 * ceil(K / 4))         uint8: byte k of a row is block k, zero padding; the interface
                                             views four bytes as one int32 (the peer's CUDA layout)
    A short last block (`short_block`: bc = 128, H = 64 * odd, per_token_cast's layout for such H, e4m3 or FP4
    data) has the row's last scale, for its 64 channels.
  channel blocks, bc = 1 (the per_channel_cast layout), bt in (32, 128):
    fp32        (G, H)                       scale(g, h) = x_sf[g, h]
    UE8M0       (ceil(G / 4), 4 * H)         uint8 "col-packed": byte [r, 4h + j] is the scale of token block
                                             4r + j for channel h, zero padding past G
A UE8M0 byte b is the fp32 whose bits are b << 23: 2 ** (b - 127), byte 0 gives 0.0 and 255 gives +inf (the
peer's transform_sf). Both backends read the same layouts.

Special values (IEEE fp32 arithmetic on both backends, no flushing of subnormals): NaN data stays NaN (its sign
and payload are the platform's), inf (or UE8M0 255) times 0 is NaN, times a non-zero value +-inf; a scale 0
(UE8M0 0) gives +-0 for finite data; -0.0 keeps its sign under a positive scale; an fp32 product above the
largest bf16 rounds to +-inf, a product in the bf16 subnormal range rounds to nearest even. TileLang's CUDA
compile uses no fast math (`TL_ENABLE_FAST_MATH` off): with it, products below 2**-126 would flush to +-0.

Supported: data contiguous (T, H) (FP4: (T, H / 2) bytes), T >= 1 per launch (the interface skips empty inputs),
H a positive multiple of 64 (whole registers; with bc = 128 a short last block where H is an odd multiple, every
scale layout and token block: on CUDA tiles of whole registers, on Ascend a task of the whole row, H <= 16384;
FP4 at H = 64 * odd: an Ascend task ends in half a 64-byte load, with bc = 128 the short block's), scales
contiguous row-major in the layouts above, or (`col_major_sf`, row blocks: bc > 1) column-major: scale(r, k) of
scale row r (token t, or token block t // bt of R = ceil(T / bt)) at element k * S + r of a buffer of row stride
S >= R (a launch argument), packed UE8M0 word w of row r at w * S + r, as per_token_cast(...,
use_tma_aligned_col_major_sf=True) and per_block_cast(..., use_tma_aligned_col_major_sf=True) write them. FP4
data and E4M3 scales take per-token scales only (what per_token_cast writes). Not here (the peer has them): FP4
data or E4M3 scales with token blocks, strided scale rows. Refused as well (ValueError): on Ascend a short block
past H = 16384 (the row no longer fits one task).

One generator builds the Ascend 950 kernel (vector cores, SIMD: _cast_back_ascend.py) or the CUDA kernel
(_cast_back_cuda.py), chosen by `cfg.backend`; both take (x, x_sf, out) and are bit-exact against
tests/quant/cast_back_ref.py, NaN payloads aside.
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
from ._cast_back_ascend import ascend_cast_back_kernel
from ._cast_back_cuda import VEC_ELEMS, cuda_cast_back_kernel
from ._scale_rules import LANES, UE8M0_PACK
from ._tiling import FLOAT_DTYPE_NAMES, divisors

ROW_BLOCK_TOKENS = (1, 32, 128)  # token extents of a row-layout scale block
ROW_BLOCK_CHANNELS = (32, 64, 128)  # channel extents of a row-layout scale block
TOKEN_BLOCK_CHANNELS = (16, *ROW_BLOCK_CHANNELS)  # per-token scales (bt = 1): per_token_cast's blocks
FP4_LANES = 2 * LANES  # FP4 data: one register load of 64 bytes holds 128 elements
CHANNEL_BLOCK_TOKENS = (32, 128)  # token extents of a per-channel (bc = 1) scale block
_OUT_BYTES = {'bfloat16': 2, 'float32': 4}

_ASCEND_TASK_ELEMS = 16384  # elements per task: fp32 out 80 KiB per buffer version, bf16 48 KiB
_ASCEND_CHANNEL_ROWS = 32  # channel blocks: rows per task, so a task's per-channel scale row serves 32 rows
_ASCEND_UB_BYTES = 248 * 1024  # Unified Buffer of one Ascend 950 vector core
_CUDA_THREADS = 256  # target threads per block
_CUDA_ROWS_PER_THREAD = 4  # 16-byte loads in flight per thread
_CUDA_ROW_THREADS_K = 256  # row blocks: up to 4096 columns per thread block, whole rows where they fit
_CUDA_TOKEN_THREADS_K = 128  # per-token scales: up to 2048 columns of a longer row per thread block
_CUDA_WHOLE_ROW = 4096  # per-token scales: a row up to this many columns is one thread block
_CUDA_CHANNEL_THREADS_K = 32  # channel blocks: 512 columns, 8 rows of threads sharing the scales through L1


# What H (elements, two per FP4 byte) must be a positive multiple of, for every block and data format: whole vector
# registers. With 128-channel blocks an odd multiple ends in a short block (H = 64 * odd: the last scale covers the
# row's last 64 channels), e4m3 or FP4 data.
HIDDEN_UNIT = LANES


def _tile_unit(hidden: int, block_channels: int, fp4: bool) -> int:
    """What a task's / thread block's columns (block_k) are a multiple of: whole scale blocks and whole registers;
    with a short last block whole registers (a CUDA thread's 16 columns lie in one block either way; an Ascend
    task is then the whole row). FP4: whole 64-byte loads of 128 elements where H has them; at H = 64 * odd whole
    registers, each Ascend task then ending in a half load (32 bytes, its UB tile padded to the whole load)."""
    if hidden % block_channels:
        return LANES
    return max(FP4_LANES if fp4 and hidden % FP4_LANES == 0 else LANES, block_channels)


def _check_int(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f'{name} must be an int, got {type(value).__name__}')
    if value < minimum:
        raise ValueError(f'{name} must be >= {minimum}, got {value}')


def _check_block(block_tokens, block_channels) -> None:
    _check_int('block_tokens', block_tokens)
    _check_int('block_channels', block_channels)
    if block_tokens == 1 and block_channels in TOKEN_BLOCK_CHANNELS:
        return
    if block_channels == 1:
        if block_tokens not in CHANNEL_BLOCK_TOKENS:
            raise ValueError(
                f'block_tokens must be one of {CHANNEL_BLOCK_TOKENS} with block_channels 1 (per-channel scales), '
                f'got {block_tokens}'
            )
    elif block_channels not in ROW_BLOCK_CHANNELS:
        raise ValueError(
            f'block_channels must be 1 or one of {ROW_BLOCK_CHANNELS} ({TOKEN_BLOCK_CHANNELS} with block_tokens 1), '
            f'got {block_channels}'
        )
    elif block_tokens not in ROW_BLOCK_TOKENS:
        raise ValueError(f'block_tokens must be one of {ROW_BLOCK_TOKENS}, got {block_tokens}')


def _check_formats(block_tokens: int, fp4, e4m3_sf, packed_ue8m0) -> None:
    """FP4 data and E4M3 scales come from per_token_cast: per-token scales only; one scale format at a time."""
    for name, value in (('fp4', fp4), ('e4m3_sf', e4m3_sf), ('packed_ue8m0', packed_ue8m0)):
        if not isinstance(value, bool):
            raise TypeError(f'{name} must be a bool, got {type(value).__name__}')
    if e4m3_sf and packed_ue8m0:
        raise ValueError('e4m3_sf and packed_ue8m0 exclude each other (E4M3 or UE8M0 scale bytes)')
    if (fp4 or e4m3_sf) and block_tokens != 1:
        raise ValueError(
            f'FP4 data and E4M3 scales take per-token scales only (block_tokens 1), got block_tokens {block_tokens}'
        )


def _check_hidden(hidden, block_channels: int, fp4: bool = False) -> None:
    if isinstance(hidden, bool) or not isinstance(hidden, int):
        raise TypeError(f'hidden must be an int, got {type(hidden).__name__}')
    if hidden <= 0 or hidden % HIDDEN_UNIT != 0:
        raise ValueError(
            f'hidden must be a positive multiple of {HIDDEN_UNIT} (block_channels {block_channels}'
            f'{", FP4 data" if fp4 else ""}), got {hidden}'
        )


def _check_col_major(col_major_sf, block_channels: int) -> None:
    """Column-major scales: scales of row blocks, per token (per_token_cast's) or per token block
    (per_block_cast's); TileKernels 2.1.0 refuses them for per-channel scales."""
    if not isinstance(col_major_sf, bool):
        raise TypeError(f'col_major_sf must be a bool, got {type(col_major_sf).__name__}')
    if col_major_sf and block_channels == 1:
        raise ValueError('column-major scales are not supported with per-channel scales (block_channels 1)')


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclasses.dataclass(frozen=True)
class CastBackConfig:
    backend: Backend
    hidden: int
    out_dtype: str  # 'bfloat16' or 'float32'
    block_tokens: int  # tokens per scale factor (bt)
    block_channels: int  # channels per scale factor (bc); 1: per-channel scales
    packed_ue8m0: bool  # scales as UE8M0 bytes (uint8) instead of fp32
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the tile count)
    block_m: int  # rows per task (Ascend) / thread block (CUDA)
    block_k: int  # columns per task / thread block; divides hidden
    threads: int  # CUDA threads per block (0 on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (1 on CUDA)
    fp4: bool = False  # FP4 (e2m1) data, two codes a byte (element 2 i in the low nibble), instead of e4m3
    e4m3_sf: bool = False  # scales as float8_e4m3fn bytes instead of fp32
    # Column-major scales (TileKernels' use_tma_aligned_col_major_sf, per_token_cast's and per_block_cast's): the
    # kernels take the transposed view x_sf.T, (sf_cols, R) of a row stride S >= R that is a launch argument (R the
    # scale rows: T per token, ceil(T / block_tokens) token blocks); packed UE8M0 bytes as (sf_cols / 4, 4 R) of
    # row stride 4 S (word w of row r at bytes [w, 4 r : 4 r + 4]). Row blocks only (block_channels > 1).
    col_major_sf: bool = False

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.out_dtype not in _OUT_BYTES:
            raise ValueError(f'out_dtype must be "bfloat16" or "float32", got {self.out_dtype!r}')
        _check_block(self.block_tokens, self.block_channels)
        _check_formats(self.block_tokens, self.fp4, self.e4m3_sf, self.packed_ue8m0)
        _check_col_major(self.col_major_sf, self.block_channels)
        _check_hidden(self.hidden, self.block_channels, self.fp4)
        for name in ('num_cores', 'block_m', 'block_k', 'num_stages'):
            _check_int(name, getattr(self, name))
        _check_int('threads', self.threads, minimum=0)
        unit = _tile_unit(self.hidden, self.block_channels, self.fp4)
        if self.block_k % unit != 0 or self.hidden % self.block_k != 0:
            raise ValueError(f'block_k {self.block_k} must be a multiple of {unit} dividing hidden {self.hidden}')
        if self.backend == 'ascend':
            self._check_ascend()
        else:
            self._check_cuda()

    def _check_ascend(self) -> None:
        if self.threads != 0:
            raise ValueError(f'Ascend kernels take no thread count: threads must be 0, got {self.threads}')
        if not _is_pow2(self.block_m):
            raise ValueError(f'Ascend: block_m must be a power of two, got {self.block_m}')
        if self.short_block and self.block_k != self.hidden:
            raise ValueError(
                f'Ascend: a short last channel block is read by a task of the whole row: block_k {self.block_k} must '
                f'be hidden {self.hidden}'
            )
        if self.block_tokens > 1 and self.block_m > self.block_tokens:
            raise ValueError(
                f'Ascend: a task holds at most one token block: block_m {self.block_m} > block_tokens '
                f'{self.block_tokens}'
            )
        if self.col_major_sf and self.packed_ue8m0 and self.num_col_tiles > 1 and self.task_blocks % UE8M0_PACK:
            raise ValueError(
                f'Ascend: column-major UE8M0 scales are read in whole int32 words: block_k {self.block_k} must hold '
                f'a multiple of {UE8M0_PACK} blocks of {self.block_channels}, or be the whole row'
            )
        if self.ascend_ub_bytes > _ASCEND_UB_BYTES:
            raise ValueError(
                f'Ascend: the buffers of block_m {self.block_m} x block_k {self.block_k} need '
                f'{self.ascend_ub_bytes} B of UB, more than {_ASCEND_UB_BYTES} B'
            )

    def _check_cuda(self) -> None:
        if self.num_stages != 1:
            raise ValueError(f'CUDA: num_stages must be 1 (no pipeline), got {self.num_stages}')
        tk = self.threads_k
        if not 1 <= self.threads <= 1024 or self.threads % tk != 0:
            raise ValueError(
                f'CUDA: threads {self.threads} must be a multiple of block_k / {VEC_ELEMS} = {tk}, at most 1024'
            )
        rows_of_threads = self.threads // tk
        if self.block_m % rows_of_threads != 0 or not 1 <= self.block_m // rows_of_threads <= 16:
            raise ValueError(
                f'CUDA: block_m {self.block_m} must be 1..16 rows per thread times the {rows_of_threads} rows of '
                'threads'
            )
        if self.block_tokens > 1 and self.block_tokens % self.rows_per_thread != 0:
            raise ValueError(
                f'CUDA: rows_per_thread {self.rows_per_thread} must divide block_tokens {self.block_tokens} (a '
                "thread's rows share one token block)"
            )

    @property
    def channel_blocks(self) -> bool:
        """Per-channel scales (block_channels 1): one scale row of H per token block."""
        return self.block_channels == 1

    @property
    def num_blocks(self) -> int:
        """Scale factors per scale row (channel blocks: one per channel); a short last block has one too."""
        return -(-self.hidden // self.block_channels)

    @property
    def short_block(self) -> bool:
        """Whether a row's last scale block is short: H = 64 * odd with 128-channel blocks (per_token_cast's rows of
        that H); its scale multiplies the row's last 64 channels."""
        return self.hidden % self.block_channels != 0

    @property
    def sf_cols(self) -> int:
        """Elements of one x_sf row: fp32 scales, or UE8M0 bytes (row layout padded to a multiple of 4;
        col-packed: 4 per channel)."""
        if not self.packed_ue8m0:
            return self.num_blocks
        if self.channel_blocks:
            return UE8M0_PACK * self.hidden
        return -(-self.num_blocks // UE8M0_PACK) * UE8M0_PACK

    @property
    def sf_dtype(self) -> str:
        if self.e4m3_sf:
            return 'float8_e4m3fn'
        return 'uint8' if self.packed_ue8m0 else 'float32'

    @property
    def widens_sf(self) -> bool:
        """Scale bytes (UE8M0 or E4M3) that the Ascend kernel widens to fp32 in UB before use."""
        return self.packed_ue8m0 or self.e4m3_sf

    @property
    def data_cols(self) -> int:
        """Columns of x: hidden, or hidden / 2 bytes of FP4 data."""
        return self.hidden // 2 if self.fp4 else self.hidden

    def num_token_blocks(self, num_tokens: int) -> int:
        """Token blocks of T tokens: ceil(T / block_tokens)."""
        return -(-num_tokens // self.block_tokens)

    def sf_shape(self, num_tokens: int) -> tuple[int, int]:
        """The shape of x_sf for T tokens (the kernel's view; the interface may view UE8M0 as int32)."""
        blocks = self.num_token_blocks(num_tokens)
        if self.packed_ue8m0 and self.channel_blocks:
            return -(-blocks // UE8M0_PACK), self.sf_cols
        return blocks, self.sf_cols

    @property
    def ascend_data_cols(self) -> int:
        """Ascend: columns of a task's data tile in UB, block_k (FP4: bytes rounded up to whole 64-byte loads; a task
        of block_k = 64 * odd ends in half a load, whose other 32 bytes of UB are never decoded into the output)."""
        if not self.fp4:
            return self.block_k
        return -(-self.block_k // FP4_LANES) * LANES

    @property
    def num_col_tiles(self) -> int:
        return self.hidden // self.block_k

    @property
    def task_blocks(self) -> int:
        """Scale blocks along a row of one task / thread block (row layouts), a short last block included."""
        return -(-self.block_k // self.block_channels)

    @property
    def ascend_col_major_tile(self) -> tuple[int, int]:
        """Ascend, column-major scales: the (rows, row elements) of a task's transposed scale tile in UB, as one
        DMA lands it: a row per scale (UE8M0: per int32 word, of the task's blocks rounded up to whole words), each
        the task's scale rows (scale_rows_per_task: its block_m tokens, or its one token block; UE8M0: 4 bytes
        each), rounded up to 32 bytes so the bursts' UB stride is 32-byte aligned."""
        sm = self.scale_rows_per_task
        if self.packed_ue8m0:
            rows, width, itemsize = -(-self.task_blocks // UE8M0_PACK), UE8M0_PACK * sm, 1
        else:
            rows, width, itemsize = self.task_blocks, sm, 1 if self.e4m3_sf else 4
        per = 32 // itemsize
        return rows, -(-width // per) * per

    @property
    def scale_rows_per_task(self) -> int:
        """Ascend: scale rows one task reads (one per token with per-token scales, else its one token block)."""
        return self.block_m if self.block_tokens == 1 else 1

    @property
    def ascend_ub_bytes(self) -> int:
        """UB the Ascend kernel allocates (each buffer rounded up to 32 bytes, as the allocator aligns)."""

        def aligned(n: int) -> int:
            return -(-n // 32) * 32

        tile = self.block_m * self.block_k
        data = aligned(self.block_m * self.ascend_data_cols) + aligned(tile * _OUT_BYTES[self.out_dtype])
        rows = self.scale_rows_per_task
        if self.col_major_sf:
            tile_rows, width = self.ascend_col_major_tile
            if self.widens_sf:  # whole rows past the last register of the flat widening
                tile_rows = -(-(-(-tile_rows * width // LANES) * LANES) // width)
            raw = aligned(tile_rows * width * (1 if self.widens_sf else 4))
            widened = aligned(tile_rows * width * 4) if self.widens_sf else 0
        elif self.channel_blocks:
            raw = aligned(self.block_k * (UE8M0_PACK if self.packed_ue8m0 else 4))
            widened = aligned(self.block_k * 4) if self.packed_ue8m0 else 0
        else:
            width = self.task_blocks
            if self.widens_sf:
                padded_rows = -(-(-(-rows * width // LANES) * LANES) // width)
                raw, widened = aligned(padded_rows * width), aligned(padded_rows * width * 4)
            else:
                raw, widened = aligned(rows * width * 4), 0
        # FP4: the 16-bit codes in element order (two per data byte), one version
        codes = aligned(self.block_m * self.ascend_data_cols * 4) if self.fp4 else 0
        return self.num_stages * (data + raw) + widened + codes

    @property
    def threads_k(self) -> int:
        """CUDA: threads along a row of the tile, 16 columns each."""
        return self.block_k // VEC_ELEMS

    @property
    def rows_per_thread(self) -> int:
        """CUDA: rows each thread handles (its 16-byte loads in flight)."""
        return self.block_m // max(1, self.threads // self.threads_k)


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def choose_cast_back_config(
    *,
    backend: Backend,
    num_cores: int,
    hidden: int,
    out_dtype: torch.dtype | str,
    block_tokens: int,
    block_channels: int,
    packed_ue8m0: bool,
    fp4: bool = False,
    e4m3_sf: bool = False,
    col_major_sf: bool = False,
) -> CastBackConfig:
    """Pure choice of the compile-time parameters (no device query). `out_dtype`: torch.bfloat16 / torch.float32
    (or their names); (block_tokens, block_channels) one of the supported blocks; `packed_ue8m0`: UE8M0 bytes
    instead of fp32 scales; `fp4`: FP4 (e2m1) data; `e4m3_sf`: float8_e4m3fn scales (both with block_tokens 1).
    `col_major_sf`: column-major scales (row blocks only, not per-channel; on Ascend a task's UE8M0 scales are
    whole int32 words, the row where it fits one task). Invalid combinations raise ValueError (TypeError for
    arguments of the wrong type)."""
    if not isinstance(out_dtype, torch.dtype | str) or out_dtype not in FLOAT_DTYPE_NAMES:
        raise ValueError(f'out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype!r}')
    dtype = FLOAT_DTYPE_NAMES[out_dtype]
    _check_block(block_tokens, block_channels)
    _check_formats(block_tokens, fp4, e4m3_sf, packed_ue8m0)
    _check_col_major(col_major_sf, block_channels)
    _check_hidden(hidden, block_channels, fp4)
    _check_int('num_cores', num_cores)
    channel = block_channels == 1
    unit = _tile_unit(hidden, block_channels, fp4)
    make = functools.partial(
        CastBackConfig, backend, hidden, dtype, block_tokens, block_channels, packed_ue8m0, num_cores,
        fp4=fp4, e4m3_sf=e4m3_sf, col_major_sf=col_major_sf,
    )  # fmt: skip
    if backend == 'ascend':
        # Whole rows where they fit (one DMA burst per row); channel blocks: tasks of 32 rows, so that the
        # scale row of a task (4 bytes a column) is amortised over 32 rows of data.
        limit = _ASCEND_TASK_ELEMS // _ASCEND_CHANNEL_ROWS if channel else _ASCEND_TASK_ELEMS
        # A short last block: a task of the whole row, whose static tile holds the short block's 64 columns (no
        # task starts inside a block or runs past the row).
        short = hidden % block_channels != 0
        if short and hidden > limit:
            raise ValueError(
                f'Ascend: a short last channel block (hidden {hidden} = 64 * odd, blocks of {block_channels}) is read '
                f'by a task of the whole row: hidden must be at most {limit}'
            )
        block_k = hidden if short else divisors(hidden, unit, limit)[0]
        if col_major_sf and packed_ue8m0 and block_k != hidden and (block_k // block_channels) % UE8M0_PACK:
            words = math.lcm(unit, UE8M0_PACK * block_channels)  # a task of whole int32 words
            if hidden % words:
                raise ValueError(
                    f'Ascend: column-major UE8M0 scales of hidden {hidden} (past one task of {limit} channels) need '
                    f'a task of whole int32 words dividing the row: hidden must be a multiple of {words}'
                )
            block_k = divisors(hidden, words, limit)[0]
        block_m = _pow2_floor(_ASCEND_TASK_ELEMS // block_k)
        if block_tokens > 1:
            block_m = min(block_m, block_tokens)  # one token block (one scale row) per task
        return make(block_m=block_m, block_k=block_k, threads=0, num_stages=2)
    if backend == 'cuda':
        if block_tokens == 1:
            # Per-token scales: one row per thread block (a whole row up to 4096 columns, else at most 2048), one
            # 16-byte vector per thread: faster on the H200 than several rows per thread (docs/quant.md).
            limit = hidden if hidden <= _CUDA_WHOLE_ROW else _CUDA_TOKEN_THREADS_K * VEC_ELEMS
            block_k = divisors(hidden, unit, limit)[0]
            return make(block_m=1, block_k=block_k, threads=block_k // VEC_ELEMS, num_stages=1)
        threads_k = _CUDA_CHANNEL_THREADS_K if channel else _CUDA_ROW_THREADS_K
        block_k = divisors(hidden, unit, threads_k * VEC_ELEMS)[0]
        rows_of_threads = max(1, _CUDA_THREADS // (block_k // VEC_ELEMS))
        return make(
            block_m=rows_of_threads * _CUDA_ROWS_PER_THREAD,
            block_k=block_k,
            threads=rows_of_threads * (block_k // VEC_ELEMS),
            num_stages=1,
        )
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_cast_back_kernel(cfg: CastBackConfig):
    """The TileLang prim_func `cast_back_kernel(x, x_sf, out)` for `cfg.backend` (no compile).

    x: (T, hidden) float8_e4m3fn, or (T, hidden / 2) int8 with cfg.fp4; x_sf: cfg.sf_shape(T) of cfg.sf_dtype, or
    with cfg.col_major_sf its transpose of a row stride S >= R, R the scale rows (T, or ceil(T / block_tokens))
    (packed UE8M0: (sf_cols / 4, 4 R) bytes of row stride 4 S); out: (T, hidden) cfg.out_dtype. T is dynamic and
    must be >= 1.
    """
    if cfg.backend == 'ascend':
        return ascend_cast_back_kernel(cfg)
    return cuda_cast_back_kernel(cfg)


@functools.cache
def get_cast_back_kernel(cfg: CastBackConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_cast_back_kernel(cfg), cfg.backend)
