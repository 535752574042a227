"""Kernels of per_token_cast: x (T, H) bf16 / fp32 -> float8_e4m3fn or FP4 (e2m1), one scale factor per token and
block.

Semantics (those of TileKernels 2.1.0's `per_token_cast(x, fmt, block_size)`): each row of x is cut into
blocks of `block_size` (16, 32, 64 or 128) consecutive elements. For a block with absolute maximum a, and m the
format's largest value (448 for e4m3, 6 for e2m1):

    c = max(a, floor)                                  (the peer's amax floors, _scale_rules.AMAX_FLOORS)
    fp32 scales:  sf = c / m,  inverse = m / c         (two IEEE divisions)
    round_sf:     sf = 2 ** ceil(log2(c * fp32(1/m))), inverse = 1 / sf (exact: a power of two)
    e4m3_sf:      sf = e4m3(c / m) (nearest even, saturating at 448), inverse = IEEE 1 / fp32(sf)
    out = e4m3(float(x) * inverse), to nearest even, saturating at +-448
    FP4: out = e2m1(float(x) * inverse), to nearest even on {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at +-6
         (+-inf and NaN -> +-6), two codes per byte, element 2 i in the low nibble of byte i: (T, H / 2) int8
    stochastic (TileKernels' stochastic_cast): out = SR_e4m3(float(x) * inverse), quant.cast's stochastic
         rounding to e4m3 (cast_kernel.py: a counter hash h of (key, element index), integer and exact fp32
         operations) with element index t * H + h, the logical element of x (so the bits depend on neither the
         tiling nor the backend); the scales are the plain cast's
    stochastic FP4: out = SR_e2m1(v), v = float(x) * inverse, with the same hash h of the same element index:
         a = |v|; a >= 6, +-inf and NaN give code 7 (+-6, as the nearest-even rounding); otherwise lo is the
         largest e2m1 magnitude <= a (code k), hi the next one, frac = (a - lo) / (hi - lo) (exact in fp32: a - lo
         is, and the spacing 0.5, 1 or 2 is a power of two), u = (h >> 8) * 2**-24 (24 bits, exact), and the
         code is k + 1 iff u < frac, else k; the sign bit is v's (-0.0 and negatives rounded to 0: code 8).
         E[|out|] = a for a <= 6 (unbiased); fp4.py's cuda_e2m1_stochastic_code / ascend_e2m1_stochastic_macro

The rounded scale is stored as an fp32 power of two, or (`packed_ue8m0`) as its biased exponent byte
(UE8M0): byte k of a row is block k, and the row is padded with zero bytes to a multiple of 4, which the
interface views as int32 (TileKernels' CUDA layout). Both backends write this layout, so the same input gives
the same scale bytes on either (TileKernels' Ascend kernel packs two per int16).
Special values: -0.0 stays -0.0; bf16 / fp32 subnormals are ordinary values (IEEE, no flushing); an inf in a
block gives sf inf (UE8M0 0xff), inverse 0, so finite values become +-0 and the inf NaN (FP4: +-6); with E4M3
scales the inf block's scale saturates at 448, its finite values are x / 448 and the inf saturates (+-448 / +-6);
NaN in a block is unspecified (the max reductions of the backends may drop it), as in the peer.

Supported: x (T, H), contiguous or (`strided_rows`) rows a runtime stride apart, each starting on 16 bytes, T >= 1
per launch (the interface skips empty inputs), H a positive multiple of 64; with 128-channel blocks an odd multiple
(e.g. 2880) leaves a short last block of 64 channels: its scale is that of its 64 channels (the missing ones count as
zeros in the maximum), the scale row has ceil(H / 128) entries, and nothing past H is written (Ascend: the row is
one task then, H <= 8128; CUDA: tiles of whole blocks, the last one guarded). The scales are written
row-major, or (`col_major_sf`, TileKernels' use_tma_aligned_col_major_sf) straight into a column-major buffer: the
same values, token t's scale k at element k * S + t for a row stride S >= T of the launch (packed UE8M0: word k).
Pre-quantised inputs
(PerTokenRecastConfig below) are, on CUDA for e4m3 data with row-block scales, this kernel in mode 'recast' (x_data,
x_sf, out, out_sf), its tile loads forming cast_back's fp32 products; otherwise a composition: cast_back's kernel to
fp32 rows, then this kernel. The peer's
Ascend kernel takes only 32-channel blocks and no E4M3 scales; these take every block and scale format on both
backends.

One generator builds the Ascend 950 kernel (vector cores, SIMD: _per_token_cast_ascend.py) or the CUDA kernel
(_per_token_cast_cuda.py), chosen by `cfg.backend`; both take (x, out, out_sf) and are bit-exact against
tests/quant/cast_ref.py where divisions are IEEE (the emulator, CUDA without fast math).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle).
from ._per_token_cast_ascend import ascend_per_token_cast_kernel
from ._per_token_cast_cuda import cuda_per_token_cast_kernel
from ._scale_rules import LANES, UE8M0_PACK, check_col_major_words
from ._tiling import FLOAT_DTYPE_NAMES, MODES, CastFormats, CastModes, RowScales, divisors
from .cast_back_kernel import CastBackConfig, choose_cast_back_config
from .cast_kernel import RECIPE

BLOCK_SIZES = (32, 64, 128)  # the SwiGLU backward's fused cast's; 32 first: the only block the peer's Ascend takes
CAST_BLOCK_SIZES = (16, *BLOCK_SIZES)  # per_token_cast's (and the peer's CUDA kernel's)
FORMATS = ('e4m3', 'e2m1')  # fp8 data, FP4 data (two e2m1 codes a byte)
_ASCEND_MAX_BLOCK_K = 4096  # elements per task: fp32 input tile 16 KiB, two buffer versions
# A whole row in one task up to this H: short last blocks, and packed UE8M0 rows whose zero padding then ends the
# task's bytes (wider such rows: tasks of block_k, the row's last storing the padding after its scales).
_ASCEND_MAX_ROW = 8192
_CUDA_MAX_BLOCK_K = 2048
# Up to this many tokens the CUDA kernel tiles a row wider than one tile finer: a few rows of 1792-2048-column tiles
# leave most SMs idle and each thread's serial work is the time (docs/quant.md, measured at 1 and 16 tokens).
FEW_TOKENS = 16
_CUDA_FEW_TOKENS_BLOCK_K = 1024  # columns per thread block for few tokens (64 threads, 16 columns each)
_CUDA_THREADS = 64
_CODES_PER_LOAD = 16  # e4m3 codes of one 16-byte load


def few_tokens(num_tokens: int) -> bool:
    """Whether a call of `num_tokens` rows takes the few-tokens tiling (part of the choice and the fast path's key)."""
    return 0 < num_tokens <= FEW_TOKENS


def hidden_multiple(block_size: int) -> int:
    """What H must be a positive multiple of for whole scale blocks and whole vector registers (tiles of whole
    blocks; per_token_cast, norm_forward_and_per_token_cast and moe_swiglu_forward_and_per_token_cast take
    CAST_HIDDEN_UNIT, a short last block included, and the SwiGLU backward's cast too, a block across its halves
    included)."""
    return max(LANES, block_size)


# What per_token_cast's H must be a positive multiple of: whole 64-lane registers; with 128-channel blocks an odd
# multiple leaves the last block short (64 channels), as the peer's CUDA kernel allows (e.g. H = 2880).
CAST_HIDDEN_UNIT = LANES


def short_block_k(backend: Backend, hidden: int, block_size: int) -> int:
    """The columns of a task (Ascend) / thread block (CUDA) for rows whose last block is short (H = 64 * odd with
    128-channel blocks), per_token_cast's and the SwiGLU fused cast's: on Ascend the row rounded up to whole blocks,
    one task (its copies then have static lengths: H in, H out; H <= _ASCEND_MAX_ROW - 64), on CUDA even tiles of
    whole blocks up to _CUDA_MAX_BLOCK_K, the last reaching past H (guarded)."""
    blocked = -(-hidden // block_size) * block_size
    if backend == 'ascend':
        if blocked > _ASCEND_MAX_ROW:
            raise ValueError(
                f'Ascend: a short last block (hidden {hidden}, not a multiple of {block_size}) needs the row in one '
                f'task: hidden <= {_ASCEND_MAX_ROW - CAST_HIDDEN_UNIT}'
            )
        return blocked
    tiles = -(-blocked // _CUDA_MAX_BLOCK_K)
    unit = hidden_multiple(block_size)
    return -(-blocked // tiles // unit) * unit


def ascend_row_block_k(
    hidden: int, block_size: int, max_block_k: int, *, packed_ue8m0: bool, col_major_sf: bool
) -> int:
    """The Ascend task width of a row of whole blocks, per_token_cast's rule (the SwiGLU forward's fused cast takes
    it with its own `max_block_k`): the widest multiple of hidden_multiple(block_size) dividing H up to
    `max_block_k`; column-major packed UE8M0 scales keep whole int32 words per task (the row up to _ASCEND_MAX_ROW);
    a packed row of 4 n + r blocks, ending in zero padding, is one task up to _ASCEND_MAX_ROW, wider the widest
    tasks (the row's last storing the padding after its scales), column-major there a ValueError."""
    # The largest task that fits the buffers: the op streams x once, so fewer, longer DMAs per core.
    block_k = divisors(hidden, hidden_multiple(block_size), max_block_k)[0]
    padded = packed_ue8m0 and (hidden // block_size) % UE8M0_PACK != 0
    if col_major_sf and packed_ue8m0 and not padded and (block_k // block_size) % UE8M0_PACK:
        # Column-major UE8M0 words go out one burst each: a task holds whole words, the row if it fits.
        whole = hidden <= _ASCEND_MAX_ROW
        block_k = hidden if whole else divisors(hidden, UE8M0_PACK * block_size, max_block_k)[0]
    if padded and block_k != hidden and hidden <= _ASCEND_MAX_ROW:
        block_k = hidden  # the row one task, its scale bytes ending in the row's zero padding
    elif padded and block_k != hidden and col_major_sf:
        # Column-major words go out one burst each, but equal tasks of a row of 4 n + r blocks cannot all hold
        # whole words. (Row-major: tasks of block_k, the last storing the padding after its scales.)
        raise ValueError(
            f'Ascend: column-major packed UE8M0 scales of a number of blocks that is not a multiple of '
            f'{UE8M0_PACK} need hidden <= {_ASCEND_MAX_ROW}, got {hidden // block_size} blocks of {block_size} '
            f'(hidden {hidden})'
        )
    return block_k


def check_row_tiles(cfg: RowScales) -> None:
    """The tile width of a RowScales configuration with a `backend` (ValueError): a multiple of whole blocks and
    registers dividing H, or with a short last block per_token_cast's tiles (short_block_k's rule: Ascend the
    blocked row, CUDA whole blocks, the last tile reaching past H)."""
    unit = hidden_multiple(cfg.block_channels)
    if cfg.short_block:
        if cfg.block_k % unit != 0 or (cfg.backend == 'ascend' and cfg.block_k != cfg.blocked_hidden):
            raise ValueError(f'block_k {cfg.block_k}: a multiple of {unit} (Ascend: the blocked row) for a '
                             f'short last block of hidden {cfg.hidden}')  # fmt: skip
    elif cfg.block_k % unit != 0 or cfg.hidden % cfg.block_k != 0:
        raise ValueError(f'block_k {cfg.block_k} must be a multiple of {unit} dividing hidden {cfg.hidden}')


RECAST = 'recast'  # the fused kernel of a quantised x (PerTokenRecastConfig), CUDA only
CAST_MODES = (*MODES, RECAST)


@dataclasses.dataclass(frozen=True)
class PerTokenCastConfig(CastModes, CastFormats, RowScales):
    backend: Backend
    hidden: int
    in_dtype: str  # 'bfloat16' or 'float32'
    block_size: int  # elements per scale factor along H
    round_sf: bool  # power-of-two scales
    packed_ue8m0: bool  # scales as UE8M0 bytes (needs round_sf)
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the tile count)
    block_k: int  # columns of one row handled per task (Ascend) / per thread block (CUDA); divides hidden
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)
    mode: str = 'cast'  # 'cast', 'sf_only' or 'precomputed' (MODES)
    fmt: str = 'e4m3'  # output format (FORMATS)
    e4m3_sf: bool = False  # scales as e4m3 bytes (not with round_sf)
    # The scales written column-major (TileKernels' use_tma_aligned_col_major_sf): scale k of token t at
    # out_sf[k, t] of a (sf_cols, T) view whose row stride is a launch argument (T rounded up, or T itself);
    # packed UE8M0: the bytes of word w of token t at out_sf[w, 4 t : 4 t + 4] of a (sf_cols / 4, 4 T) uint8 view.
    col_major_sf: bool = False
    # x's rows a runtime stride apart (TileKernels takes strided rows), each starting on 16 bytes; False: contiguous
    # x, the kernel that has no stride argument.
    strided_rows: bool = False
    # The narrowing of x * inverse by stochastic rounding (TileKernels' stochastic_cast; mode 'cast'): e4m3 by
    # quant.cast's rule (cast_kernel.py), e2m1 by fp4.py's, for element t * hidden + h of x, the key a launch argument.
    stochastic: bool = False
    # Mode 'recast' (CUDA): x is a quantised tensor's e4m3 data, its scales laid out as this cast_back configuration
    # reads them (scale format, blocks, layout); the tile holds cast_back's fp32 products (in_dtype float32).
    quantised_x: CastBackConfig | None = None

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.in_dtype not in ('bfloat16', 'float32'):
            raise ValueError(f'in_dtype must be "bfloat16" or "float32", got {self.in_dtype!r}')
        if self.block_size not in CAST_BLOCK_SIZES:
            raise ValueError(f'block_size must be one of {CAST_BLOCK_SIZES}, got {self.block_size}')
        if self.packed_ue8m0 and not self.round_sf:
            raise ValueError('packed_ue8m0 needs round_sf (UE8M0 holds powers of two only)')
        if self.fmt not in FORMATS:
            raise ValueError(f'fmt must be one of {FORMATS}, got {self.fmt!r}')
        if self.e4m3_sf and self.round_sf:
            raise ValueError('e4m3_sf excludes round_sf (E4M3 or power-of-two scales)')
        if self.hidden <= 0 or self.hidden % CAST_HIDDEN_UNIT != 0:
            raise ValueError(f'hidden must be a positive multiple of {CAST_HIDDEN_UNIT}, got {self.hidden}')
        check_row_tiles(self)
        if self.mode not in CAST_MODES:
            raise ValueError(f'mode must be one of {CAST_MODES}, got {self.mode!r}')
        if (self.mode == RECAST) != (self.quantised_x is not None):
            raise ValueError(f'quantised_x (the layout of a quantised x) goes with mode {RECAST!r} only')
        if self.quantised_x is not None and (why := recast_refusal(self.quantised_x, self)):
            raise ValueError(f'mode {RECAST!r}: {why}')
        if self.mode == 'precomputed' and self.round_sf:
            raise ValueError('mode "precomputed" reads fp32 scales: round_sf and packed_ue8m0 do not apply there')
        if self.col_major_sf and not self.computes_sf:
            raise ValueError('col_major_sf: mode "precomputed" reads row-major scales (as TileKernels)')
        check_col_major_words(self)
        if self.stochastic and self.mode != 'cast':
            raise ValueError(f'stochastic: mode "cast" only, got mode {self.mode!r}')

    @property
    def data_storage(self) -> str:
        """The dtype of the kernel's data argument: data_dtype, or the e4m3 bits (uint8: the interface passes a
        view) where the kernel writes the stochastic rounding's e4m3 bits (FP4: its int8 bytes either way)."""
        return 'uint8' if self.stochastic and not self.fp4 else self.data_dtype

    @property
    def block_channels(self) -> int:
        """Channels per scale (RowScales)."""
        return self.block_size


def choose_per_token_cast_config(
    *,
    backend: Backend,
    num_cores: int,
    hidden: int,
    in_dtype: torch.dtype | str,
    block_size: int = 32,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    mode: str = 'cast',
    fmt: str = 'e4m3',
    e4m3_sf: bool = False,
    col_major_sf: bool = False,
    strided_rows: bool = False,
    stochastic: bool = False,
    few_tokens: bool = False,
    quantised_x: CastBackConfig | None = None,
) -> PerTokenCastConfig:
    """Pure choice of the compile-time parameters (no device query). `in_dtype`: torch.bfloat16 / torch.float32
    (or their names). In mode 'precomputed' round_sf is dropped (the inverse is 1 / sf either way). Invalid
    combinations raise ValueError. `col_major_sf` changes only where the scales are stored (and, on Ascend with
    packed UE8M0 scales, keeps a task's scale bytes to whole int32 words). `few_tokens` (at most FEW_TOKENS rows):
    CUDA's finer tiles for rows wider than _CUDA_MAX_BLOCK_K; the Ascend kernel does not depend on it. Mode 'recast'
    (CUDA, with `quantised_x`, in_dtype float32): the fused kernel of a quantised x (choose_per_token_recast_config)."""
    if in_dtype not in FLOAT_DTYPE_NAMES:
        raise ValueError(f'in_dtype must be torch.bfloat16 or torch.float32, got {in_dtype!r}')
    dtype = FLOAT_DTYPE_NAMES[in_dtype]
    if block_size not in CAST_BLOCK_SIZES:
        raise ValueError(f'block_size must be one of {CAST_BLOCK_SIZES}, got {block_size}')
    if hidden <= 0 or hidden % CAST_HIDDEN_UNIT != 0:
        raise ValueError(f'hidden must be a positive multiple of {CAST_HIDDEN_UNIT}, got {hidden}')
    unit = hidden_multiple(block_size)
    blocked = -(-hidden // block_size) * block_size  # H rounded up to whole blocks
    if mode not in CAST_MODES:
        raise ValueError(f'mode must be one of {CAST_MODES}, got {mode!r}')
    if mode == 'precomputed':
        if packed_ue8m0:
            raise ValueError('mode "precomputed" reads fp32 scales: packed_ue8m0 is not supported there')
        round_sf = False
    make = functools.partial(PerTokenCastConfig, backend, hidden, dtype, block_size, round_sf, packed_ue8m0, num_cores,
                             mode=mode, fmt=fmt, e4m3_sf=e4m3_sf, col_major_sf=col_major_sf,
                             strided_rows=strided_rows, stochastic=stochastic, quantised_x=quantised_x)  # fmt: skip
    if backend == 'ascend' and blocked != hidden:
        return make(block_k=short_block_k(backend, hidden, block_size), threads=0, num_stages=2)
    if backend == 'ascend':
        block_k = ascend_row_block_k(
            hidden, block_size, _ASCEND_MAX_BLOCK_K, packed_ue8m0=packed_ue8m0, col_major_sf=col_major_sf
        )
        return make(block_k=block_k, threads=0, num_stages=2)
    if backend == 'cuda':
        # One small thread block per (token, column tile), many per SM: each thread has block_k / 64 elements of
        # 16-byte loads in flight (see docs/quant.md, "per_token_cast on CUDA").
        if blocked == hidden and few_tokens and hidden > _CUDA_MAX_BLOCK_K:  # rows of several tiles (measured: 7168)
            block_k = divisors(hidden, unit, _CUDA_FEW_TOKENS_BLOCK_K)[0]
            return make(block_k=block_k, threads=32 * max(1, block_k // 512), num_stages=1)
        if blocked == hidden:
            widths = divisors(hidden, unit, _CUDA_MAX_BLOCK_K)
            if mode == RECAST:
                # e4m3 codes: a tile whose threads hold a multiple of 16 codes each, where one divides H, so that
                # TileLang's layout gives each thread runs of 16 (one 16-byte load; 56 a thread gave runs of 8).
                widths = [b for b in widths if b // _cuda_threads(b) % _CODES_PER_LOAD == 0] or widths
            block_k = widths[0]
        else:
            block_k = short_block_k(backend, hidden, block_size)
        return make(block_k=block_k, threads=_cuda_threads(block_k), num_stages=1)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def _cuda_threads(block_k: int) -> int:
    """CUDA threads of a thread block of block_k columns: one warp, two from 2048 columns."""
    return 32 * max(1, min(_CUDA_THREADS // 32, block_k // 1024))


def make_per_token_cast_kernel(cfg: PerTokenCastConfig):
    """The TileLang prim_func `per_token_cast_kernel(x, out, out_sf)` for `cfg.backend` (no compile).

    x: (T, hidden) cfg.in_dtype (with cfg.strided_rows, rows of a runtime stride); out: (T, cfg.data_cols)
    cfg.data_storage (float8_e4m3fn, FP4 bytes int8, or with cfg.stochastic the e4m3 bits uint8); out_sf:
    (T, cfg.sf_cols) cfg.sf_dtype, or with cfg.col_major_sf a view (cfg.sf_cols, T) of row stride S >= T (the
    interface's column-major scales transposed: sf.T), packed UE8M0 bytes (cfg.sf_cols / 4, 4 T) of row stride 4 S
    (sf.T.view(torch.uint8)). T is dynamic and must be >= 1. With cfg.stochastic a fourth argument, the int32 key
    (cast_kernel.key_argument(seed_key(seed))).
    """
    if cfg.backend == 'ascend':
        return ascend_per_token_cast_kernel(cfg, RECIPE)
    return cuda_per_token_cast_kernel(cfg, RECIPE)


@functools.cache
def get_per_token_cast_kernel(cfg: PerTokenCastConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_per_token_cast_kernel(cfg), cfg.backend)


@dataclasses.dataclass(frozen=True)
class PerTokenRecastConfig:
    """per_token_cast of a quantised x (data, sf): per_token_cast of cast_back(x, 'fp32', x_block_size), bit for bit.
    Fused (`dequantise` None, CUDA where recast_refusal finds nothing): one kernel, the cast stage in mode 'recast'
    whose tile loads compute cast_back's fp32 products in registers. Otherwise two stages launched in order, each
    chosen by its own operator's chooser: cast_back to fp32 (the stage 'dequantise'), then per_token_cast of the
    fp32 rows (the stage 'cast'); what a call launches then is exactly what the chain of the two public operators
    launches."""

    backend: Backend
    dequantise: CastBackConfig | None  # out_dtype float32; None where fused
    cast: PerTokenCastConfig  # in_dtype float32; mode 'recast' where fused

    def __post_init__(self):
        if self.fused != (self.cast.mode == RECAST):
            raise ValueError(f'the cast stage is in mode {RECAST!r} exactly where there is no dequantising stage')
        stages = (self.cast,) if self.fused else (self.dequantise, self.cast)
        for stage in stages:
            if stage.backend != self.backend:
                raise ValueError(f'a stage is configured for {stage.backend}, not {self.backend}')
        source = self.cast.quantised_x if self.fused else self.dequantise
        if source.out_dtype != 'float32' or self.cast.in_dtype != 'float32':
            raise ValueError('the stages meet in fp32: cast_back to float32, per_token_cast from float32')
        if source.hidden != self.cast.hidden:
            raise ValueError(f'one hidden size for both stages, got {source.hidden} and {self.cast.hidden}')

    @property
    def fused(self) -> bool:
        """One launch, the fused kernel (`cast`), instead of the two stages."""
        return self.dequantise is None


def recast_refusal(quantised_x: CastBackConfig, cast: PerTokenCastConfig) -> str | None:
    """Why per_token_cast of the quantised x that `quantised_x` reads cannot be the fused kernel of `cast`'s
    output (None where it can): CUDA only (the Ascend kernel of the fp32 rows stays the second stage), e4m3 data with
    scales in row blocks (FP4 data and per-channel scales keep the composition), the plain rounding (stochastic
    rounding keeps it too). The chooser fuses exactly where this finds nothing; the config refuses the rest."""
    if cast.backend != 'cuda':
        return f'CUDA only, got backend {cast.backend!r}'
    if quantised_x.fp4 or quantised_x.channel_blocks:
        return 'e4m3 data with scales in row blocks only (not FP4 data, not per-channel scales)'
    if cast.stochastic or cast.strided_rows or cast.in_dtype != 'float32':
        return 'the plain rounding of fp32 products, contiguous rows'
    if (quantised_x.backend, quantised_x.hidden) != (cast.backend, cast.hidden):
        return f'one backend and hidden size, got {quantised_x.backend} {quantised_x.hidden} for x, {cast.hidden} out'
    return None


def choose_per_token_recast_config(
    *, backend: Backend, num_cores: int, dequantise: tuple, cast: tuple, fuse: bool = True
):
    """Pure choice (no device query): `dequantise` and `cast` are the (name, value) items of choose_cast_back_config's
    and choose_per_token_cast_config's keyword arguments (tuples, so that a launcher key can hold them). Fused where
    recast_refusal allows (the fp32 cast's configuration in mode 'recast', its tiles of 16-code loads where H allows)
    and `fuse` asks for it; otherwise the two stages."""
    common = {'backend': backend, 'num_cores': num_cores, **dict(cast), 'in_dtype': torch.float32}
    source = choose_cast_back_config(backend=backend, num_cores=num_cores, **dict(dequantise), out_dtype=torch.float32)
    stage = choose_per_token_cast_config(**common)
    if fuse and recast_refusal(source, stage) is None:
        return PerTokenRecastConfig(
            backend, None, choose_per_token_cast_config(**common | {'mode': RECAST, 'quantised_x': source})
        )
    return PerTokenRecastConfig(backend, source, stage)


def get_per_token_recast_kernel(cfg: PerTokenRecastConfig):
    """The compiled kernel of a fused configuration (cached by get_per_token_cast_kernel). A composition has none of
    its own: its stages launch through their public operators, which find their kernels (ValueError)."""
    if not cfg.fused:
        raise ValueError('a composition of two stages launches through cast_back and per_token_cast, not one kernel')
    return get_per_token_cast_kernel(cfg.cast)
