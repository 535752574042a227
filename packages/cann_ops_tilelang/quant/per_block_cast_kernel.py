"""Kernels of per_block_cast: x (T, H) bf16 / fp32 -> float8_e4m3fn or FP4 (e2m1), one scale factor per 2-D block.

Semantics (those of TileKernels 2.1.0's `per_block_cast(x, fmt, (bt, bc))` and its `_with_sf_only` /
`_with_precomputed_sf` forms): x is cut into blocks of `block_tokens` (bt) consecutive tokens by
`block_channels` (bc) consecutive channels, bt and bc each 16, 32, 64 or 128. The last token block may be partial
(T need not be a multiple of bt): its maximum is over the rows that exist. For a block with absolute maximum a,
and m the output format's largest value (448 for e4m3, 6 for e2m1), the scale rule is the domain's
(_scale_rules.py), as in per_token_cast:

    c = max(a, floor)                                  (the peer's amax floors, _scale_rules.AMAX_FLOORS)
    fp32 scales:  sf = c / m,  inverse = m / c         (two IEEE divisions)
    round_sf:     sf = 2 ** ceil(log2(c * fp32(1/m))), inverse = 1 / sf (exact: a power of two)
    e4m3_sf:      sf = e4m3(c / m) (nearest even, saturating at 448), inverse = IEEE 1 / fp32(sf)
    out = e4m3(float(x) * inverse), to nearest even, saturating at +-448
    FP4: out = e2m1(float(x) * inverse), to nearest even on {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at +-6
         (+-inf and NaN -> +-6), two codes per byte, element 2 i in the low nibble of byte i: (T, H / 2) int8

sf has one row per token block and one column per channel block: (ceil(T / bt), H / bc) fp32 (or e4m3 bytes with
`e4m3_sf`), or with `packed_ue8m0` the biased exponent bytes, (ceil(T / bt), H / bc rounded up to 4) uint8 with
zero padding bytes (byte k of a row is channel block k; the interface views the row as int32, TileKernels' CUDA
layout).

Three modes (`mode`), one kernel each:

- 'cast' (per_block_cast): writes out and sf. Arguments (x, out, out_sf).
- 'sf_only' (per_block_cast_with_sf_only): writes only sf. Arguments (x, out_sf).
- 'precomputed' (per_block_cast_with_precomputed_sf): reads an fp32 (or e4m3) sf of the shape above and writes
  only out, with inverse = 1 / fp32(sf) (IEEE). Arguments (x, sf, out). As in the peer, not with packed UE8M0
  scales; `round_sf` does not apply there (the peer's reference and CUDA kernel take 1 / sf whatever it says,
  which for the powers of two that round_sf makes is exact), so the chooser drops it and the configuration
  refuses it.

Special values: -0.0 stays -0.0 (FP4: code 8); bf16 / fp32 subnormals are ordinary values; an inf in a block gives
sf inf (UE8M0 0xff), inverse 0, so the block's finite values become +-0 and the inf NaN (FP4: +-6); with E4M3
scales the inf block's scale saturates at 448 and the inf saturates (+-448 / +-6); NaN in a block is unspecified
(the max reductions of the backends may drop it), as in the peer. In 'precomputed' mode a scale of 0 gives
inverse inf (values +-448 / +-6, zeros NaN / +-6), a scale of inf inverse 0.

Column-major scales (`col_major_sf`, TileKernels' use_tma_aligned_col_major_sf): the same values written
straight into a column-major buffer, token block b's scale k at element k * S + b for a row stride S >= ceil(T /
bt) of the launch (packed UE8M0: word k // 4, byte 4 b + k % 4 of a byte row of stride 4 S).

Supported: x contiguous (T, H), T >= 1 per launch (the interface skips empty inputs), H a positive multiple of
max(64, bc). The peer takes e2m1 output with fp32 / UE8M0 scales, on CUDA bt, bc in (32, 128) and on Ascend only
(32, 32); it also takes strided scale rows, which these kernels do not. These take every (bt, bc) above (16 x 16
with E4M3 scales is NVFP4's 2-D weight format), both output formats and fp32, power-of-two, UE8M0 and E4M3 scales
on both backends.

One generator builds the Ascend 950 kernel (vector cores, SIMD: _per_block_cast_ascend.py) or the CUDA kernel
(_per_block_cast_cuda.py), chosen by `cfg.backend`; both are bit-exact against
tests/quant/per_block_cast_ref.py where divisions are IEEE (the emulator, CUDA without fast math).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle).
from ._per_block_cast_ascend import ascend_per_block_cast_kernel
from ._per_block_cast_cuda import cuda_per_block_cast_kernel
from ._scale_rules import FORMAT_MAX, LANES, UE8M0_PACK
from ._tiling import FLOAT_DTYPE_NAMES, MODES, CastFormats, CastModes, RowScales, divisors

BLOCK_TOKENS = (16, 32, 64, 128)  # 16: NVFP4's 16 x 16 weight blocks
BLOCK_CHANNELS = (16, 32, 64, 128)
FORMATS = tuple(FORMAT_MAX)  # 'e4m3' (fp8 data), 'e2m1' (FP4 data, two codes a byte)
_IN_BYTES = {'bfloat16': 2, 'float32': 4}
_ASCEND_TILE_BYTES = 64 * 1024  # x bytes of one task (bt rows of block_k channels), two buffer versions
CUDA_VECTOR = 16  # CUDA: consecutive channels of one row per thread (one 16-byte fp8 store)
_CUDA_TILE_BYTES = 32 * 1024  # x bytes one CUDA thread block aims at
_CUDA_MAX_BLOCK_K = 32 * CUDA_VECTOR  # a warp's lanes across one row at most
_CUDA_MAX_THREADS = 256


def hidden_multiple(block_channels: int) -> int:
    """What H must be a positive multiple of: whole channel blocks and whole vector registers."""
    return max(LANES, block_channels)


@dataclasses.dataclass(frozen=True)
class PerBlockCastConfig(CastModes, CastFormats, RowScales):
    backend: Backend
    hidden: int
    in_dtype: str  # 'bfloat16' or 'float32'
    block_tokens: int  # tokens per scale factor (bt)
    block_channels: int  # channels per scale factor (bc)
    round_sf: bool  # power-of-two scales
    packed_ue8m0: bool  # scales as UE8M0 bytes (needs round_sf)
    mode: str  # 'cast', 'sf_only' or 'precomputed'
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the tile count)
    block_k: int  # channels of one token block per task (Ascend) / thread block (CUDA); divides hidden
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)
    fmt: str = 'e4m3'  # output format (FORMATS)
    e4m3_sf: bool = False  # scales as e4m3 bytes (not with round_sf)
    # The scales written column-major (TileKernels' use_tma_aligned_col_major_sf): scale k of token block b at
    # out_sf[k, b] of a (sf_cols, ceil(T / bt)) view whose row stride is a launch argument; packed UE8M0: the bytes
    # of word w of block b at out_sf[w, 4 b : 4 b + 4] of a (sf_cols / 4, 4 ceil(T / bt)) uint8 view.
    col_major_sf: bool = False

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.in_dtype not in _IN_BYTES:
            raise ValueError(f'in_dtype must be "bfloat16" or "float32", got {self.in_dtype!r}')
        if self.block_tokens not in BLOCK_TOKENS:
            raise ValueError(f'block_tokens must be one of {BLOCK_TOKENS}, got {self.block_tokens}')
        if self.block_channels not in BLOCK_CHANNELS:
            raise ValueError(f'block_channels must be one of {BLOCK_CHANNELS}, got {self.block_channels}')
        if self.mode not in MODES:
            raise ValueError(f'mode must be one of {MODES}, got {self.mode!r}')
        if self.packed_ue8m0 and not self.round_sf:
            raise ValueError('packed_ue8m0 needs round_sf (UE8M0 holds powers of two only)')
        if self.fmt not in FORMATS:
            raise ValueError(f'fmt must be one of {FORMATS}, got {self.fmt!r}')
        if self.e4m3_sf and self.round_sf:
            raise ValueError('e4m3_sf excludes round_sf (E4M3 or power-of-two scales)')
        if self.mode == 'precomputed' and self.packed_ue8m0:
            raise ValueError('mode "precomputed" reads fp32 scales: packed_ue8m0 is not supported there')
        if self.mode == 'precomputed' and self.round_sf:
            raise ValueError(
                'mode "precomputed" takes inverse = 1 / sf: round_sf does not apply (the chooser drops it)'
            )
        if self.col_major_sf and not self.computes_sf:
            raise ValueError('col_major_sf: mode "precomputed" reads row-major scales (as TileKernels)')
        unit = hidden_multiple(self.block_channels)
        if self.hidden <= 0 or self.hidden % unit != 0:
            raise ValueError(
                f'hidden must be a positive multiple of {unit} (block_channels {self.block_channels}), '
                f'got {self.hidden}'
            )
        if self.block_k <= 0 or self.block_k % unit != 0 or self.hidden % self.block_k != 0:
            raise ValueError(f'block_k {self.block_k} must be a multiple of {unit} dividing hidden {self.hidden}')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.backend == 'ascend':
            if self.num_stages < 1:
                raise ValueError(f'num_stages must be >= 1, got {self.num_stages}')
            if self.block_tokens * self.block_k * _IN_BYTES[self.in_dtype] > _ASCEND_TILE_BYTES:
                raise ValueError(
                    f'Ascend: a task of {self.block_tokens} x {self.block_k} {self.in_dtype} exceeds '
                    f'{_ASCEND_TILE_BYTES} bytes of x'
                )
        else:
            tpr = self.threads_per_row
            if tpr & (tpr - 1) or tpr > 32:
                raise ValueError(
                    f'CUDA: block_k / {CUDA_VECTOR} must be a power of two <= 32, got block_k {self.block_k}'
                )
            if self.threads % 32 or not 32 <= self.threads <= 1024 or self.threads % tpr:
                raise ValueError(
                    f'CUDA: threads must be a multiple of 32 in [32, 1024] and of block_k / {CUDA_VECTOR}, '
                    f'got {self.threads}'
                )
            if self.block_tokens % self.rows_per_pass:
                raise ValueError(
                    f'CUDA: threads {self.threads} cover {self.rows_per_pass} rows per pass, which must divide '
                    f'block_tokens {self.block_tokens}'
                )

    @property
    def threads_per_row(self) -> int:
        """CUDA: threads sharing one row of a tile, CUDA_VECTOR channels each."""
        return self.block_k // CUDA_VECTOR

    @property
    def rows_per_pass(self) -> int:
        """CUDA: rows a thread block covers at once."""
        return self.threads // self.threads_per_row

    @property
    def rows_per_thread(self) -> int:
        """CUDA: rows of the token block each thread holds."""
        return self.block_tokens // self.rows_per_pass

    def num_token_blocks(self, num_tokens: int) -> int:
        """Rows of sf for T = num_tokens."""
        return -(-num_tokens // self.block_tokens)

    def sf_shape(self, num_tokens: int) -> tuple[int, int]:
        """Shape of the kernel's sf argument (out_sf, or the precomputed sf) for T = num_tokens."""
        return self.num_token_blocks(num_tokens), self.sf_cols


def _tile_widths(hidden: int, unit: int, limit: int) -> list[int]:
    """unit * 2**m that divide `hidden` and do not exceed max(unit, limit), largest first (never empty: unit)."""
    widths = []
    width = unit
    while hidden % width == 0 and width <= max(unit, limit):
        widths.append(width)
        width *= 2
    return widths[::-1]


def choose_per_block_cast_config(
    *,
    backend: Backend,
    num_cores: int,
    hidden: int,
    in_dtype: torch.dtype | str,
    block_tokens: int = 32,
    block_channels: int = 32,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    mode: str = 'cast',
    fmt: str = 'e4m3',
    e4m3_sf: bool = False,
    col_major_sf: bool = False,
) -> PerBlockCastConfig:
    """Pure choice of the compile-time parameters (no device query). `in_dtype`: torch.bfloat16 / torch.float32
    (or their names). In mode 'precomputed' round_sf is dropped (the inverse is 1 / sf either way). Invalid
    combinations raise ValueError. `col_major_sf` changes where the scales are stored (and, on Ascend with packed
    UE8M0 scales, prefers tasks of whole int32 words, which go out in one DMA)."""
    if in_dtype not in FLOAT_DTYPE_NAMES:
        raise ValueError(f'in_dtype must be torch.bfloat16 or torch.float32, got {in_dtype!r}')
    dtype = FLOAT_DTYPE_NAMES[in_dtype]
    if block_tokens not in BLOCK_TOKENS:
        raise ValueError(f'block_tokens must be one of {BLOCK_TOKENS}, got {block_tokens}')
    if block_channels not in BLOCK_CHANNELS:
        raise ValueError(f'block_channels must be one of {BLOCK_CHANNELS}, got {block_channels}')
    if mode not in MODES:
        raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
    if packed_ue8m0 and not round_sf:
        raise ValueError('packed_ue8m0 needs round_sf (UE8M0 holds powers of two only)')
    if mode == 'precomputed':
        if packed_ue8m0:
            raise ValueError('mode "precomputed" reads fp32 scales: packed_ue8m0 is not supported there')
        round_sf = False
    unit = hidden_multiple(block_channels)
    if hidden <= 0 or hidden % unit != 0:
        raise ValueError(
            f'hidden must be a positive multiple of {unit} (block_channels {block_channels}), got {hidden}'
        )
    make = functools.partial(
        PerBlockCastConfig, backend, hidden, dtype, block_tokens, block_channels, round_sf, packed_ue8m0, mode,
        num_cores, fmt=fmt, e4m3_sf=e4m3_sf, col_major_sf=col_major_sf,
    )  # fmt: skip
    if backend == 'ascend':
        # The widest task whose x tile fits its buffer: the op streams x once, so fewer, longer DMAs per core.
        limit = _ASCEND_TILE_BYTES // (block_tokens * _IN_BYTES[dtype])
        block_k = divisors(hidden, unit, limit)[0]
        word = UE8M0_PACK * block_channels  # channels of one int32 word of UE8M0 scales
        whole = block_k == hidden or (block_k // block_channels) % UE8M0_PACK == 0
        if col_major_sf and packed_ue8m0 and not whole and hidden % word == 0 and word <= limit:
            # Column-major UE8M0 words go out one burst each: the widest task of whole words, when one fits.
            block_k = divisors(hidden, word, limit)[0]
        return make(block_k=block_k, threads=0, num_stages=2)
    if backend == 'cuda':
        # About 32 KiB of x per thread block, 16 channels of a row per thread: see _per_block_cast_cuda.py.
        limit = min(_CUDA_TILE_BYTES // (block_tokens * _IN_BYTES[dtype]), _CUDA_MAX_BLOCK_K)
        block_k = _tile_widths(hidden, unit, limit)[0]
        threads = min(_CUDA_MAX_THREADS, block_tokens * block_k // CUDA_VECTOR)
        return make(block_k=block_k, threads=threads, num_stages=1)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_per_block_cast_kernel(cfg: PerBlockCastConfig):
    """The TileLang prim_func `per_block_cast_kernel` for `cfg.backend` (no compile).

    x: (T, hidden) cfg.in_dtype; out: (T, cfg.data_cols) cfg.data_dtype (float8_e4m3fn, or FP4 bytes int8);
    out_sf: cfg.sf_shape(T) cfg.sf_dtype, or with cfg.col_major_sf a view (cfg.sf_cols, ceil(T / bt)) of row stride
    S >= ceil(T / bt) (the interface's column-major scales transposed: sf.T), packed UE8M0 bytes (cfg.sf_cols / 4,
    4 ceil(T / bt)) of row stride 4 S (sf.T.view(torch.uint8)); sf (mode 'precomputed'): cfg.sf_shape(T)
    cfg.sf_dtype. Arguments:
    (x, out, out_sf) in mode 'cast', (x, out_sf) in 'sf_only', (x, sf, out) in 'precomputed'. T is dynamic and
    must be >= 1.
    """
    if cfg.backend == 'ascend':
        return ascend_per_block_cast_kernel(cfg)
    return cuda_per_block_cast_kernel(cfg)


@functools.cache
def get_per_block_cast_kernel(cfg: PerBlockCastConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_per_block_cast_kernel(cfg), cfg.backend)
