"""Kernels of per_channel_cast: x (T, H) bf16 / fp32 -> float8_e4m3fn, one scale factor per channel and block of
tokens (the cast of a weight gradient's operand, whose GEMM reduces over tokens).

Semantics (those of TileKernels 2.1.0's `per_channel_cast(x, 'e4m3', num_per_tokens)`, i.e. its reference
`cast(x, 'e4m3', (num_per_tokens, 1))`): the tokens are cut into blocks of `block_tokens` (32 or 128) consecutive
rows, the last one partial when T is not a multiple. For channel h and token block b, a is the maximum of
|x[t, h]| over the block's existing tokens, and with the scale rule every cast of the domain shares
(_scale_rules.py):

    c = max(a, 1e-4)
    fp32 scales:  sf = c / 448,  inverse = 448 / c                      (two IEEE divisions)
    round_sf:     sf = 2 ** ceil(log2(c * fp32(1/448))), inverse = 1 / sf  (exact: a power of two)
    out[t, h] = e4m3(float(x[t, h]) * inverse)                          (nearest even, saturating at +-448)

Scales: fp32 (ceil(T / block_tokens), H), row b for token block b; or, with `packed_ue8m0` (needs round_sf), the
rounded scale's biased exponent byte (UE8M0) packed along the tokens ("column-packed", TileKernels' CUDA
layout): uint8 (ceil(ceil(T / block_tokens) / 4), 4 * H), byte [r, 4 * h + j] the scale of token block 4 r + j
for channel h, the bytes of token blocks past the last zero. The interface views it as int32
(ceil(ceil(T / block_tokens) / 4), H), one word per channel and four token blocks, little-endian.

Pre-quantised input (`in_block_channels`, TileKernels' rescaling path): x is float8_e4m3fn (T, H) with one
scale per token and block of `in_block_channels` (32 or 128) channels, fp32 (T, H / in_block_channels), or with
`in_e4m3_sf` E4M3 bytes of that shape (per_token_cast's use_e4m3_sf; the peer takes them on CUDA only), or, with
`in_packed_ue8m0`, UE8M0 bytes in TileKernels' row layout, uint8 (T, 4 * ceil(H / in_block_channels / 4)) (byte
k of row t the scale of channel block k, zero padding). Each element is decoded as fp32(x) * fp32(scale) (one
fp32 product, nearest even; exact for UE8M0 scales) and the decoded tensor is cast as above, as TileKernels'
CUDA kernel does.

Special values: -0.0 stays -0.0; bf16 / fp32 subnormals are ordinary values (IEEE, no flushing); an inf in a
block gives sf inf (UE8M0 0xff), inverse 0, so the block's finite values become +-0 and the inf NaN; NaN in a
block is unspecified (the max reductions of the backends may drop it), as in the peer.

Supported: x contiguous (T, H), T >= 1 per launch (the interface skips empty inputs; T is dynamic, any value,
not only multiples of the token block), H a positive multiple of 64 (of max(64, in_block_channels) for
pre-quantised input). The peer needs T and H multiples of 128 (and its Ascend kernel block_tokens 32, bf16 input
and in_block_channels 32, no E4M3 input scales); it also takes column-major input scales, which these kernels do
not. Only e4m3 output, as the peer: an FP4 operand packs two elements of a byte along the GEMM's reduction
dimension, which for this cast's consumer (a weight gradient's GEMM) is the tokens, not the channels that a row
of x packs, and the peer's contract refuses it too.

One generator builds the Ascend 950 kernel (vector cores, SIMD: _per_channel_cast_ascend.py) or the CUDA kernel
(_per_channel_cast_cuda.py), chosen by `cfg.backend`; both take (x, out, out_sf), or (x, x_sf, out, out_sf)
for a pre-quantised x, and are bit-exact against tests/quant/per_channel_cast_ref.py where divisions are IEEE
(the emulator, CUDA without fast math).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import CUDA_MAX_THREADS_PER_SM, compile_kernel

# The backend kernels (they do not import this module: no import circle).
from ._per_channel_cast_ascend import ascend_per_channel_cast_kernel
from ._per_channel_cast_cuda import cuda_per_channel_cast_kernel
from ._scale_rules import LANES, UE8M0_PACK
from ._tiling import divisors

BLOCK_TOKENS = (32, 128)  # tokens per scale factor (TileKernels' num_per_tokens)
IN_BLOCK_CHANNELS = (32, 128)  # channels per input scale of a pre-quantised x (TileKernels' num_per_channels)
HIDDEN_MULTIPLE = LANES  # H is a multiple of one vector register of fp32 channels
_FP8 = 'float8_e4m3fn'
_IN_DTYPES = {
    torch.bfloat16: 'bfloat16',
    torch.float32: 'float32',
    torch.float8_e4m3fn: _FP8,
    'bfloat16': 'bfloat16',
    'float32': 'float32',
    _FP8: _FP8,
}
_IN_BYTES = {'bfloat16': 2, 'float32': 4, _FP8: 1}
_ASCEND_MAX_TILE_BYTES = 96 * 1024  # x and out tiles of one token block per buffer version (two versions in UB)
_ASCEND_MAX_BLOCK_K = 1024  # channels per task: the scale buffers stay small
_CUDA_VECTOR_BYTES = 16  # one 128-bit global load per thread and row
_CUDA_VECTOR_CHOICES = (8, 16)
_CUDA_MAX_THREADS = 256  # the chooser's blocks
_CUDA_MAX_BLOCK_THREADS = 1024  # what a config may ask for (the hardware's limit): the tiling experiments
# Where the CUDA kernel keeps its tile of x between the column maxima and the cast (the schedule only; the
# arithmetic and the bytes written are the same): 'registers' (read once, the chooser's), 'shared' (read once,
# staged through shared memory, so that no thread holds its rows in registers across the scale step) or 'reread'
# (read twice from global memory, the second read largely from L2: neither holds the tile).
CUDA_X_STAGINGS = ('registers', 'shared', 'reread')
_CUDA_MAX_VALUES = 128  # channels x rows one thread holds: 64 registers of raw bf16 / fp8, no spills


def hidden_multiple(in_block_channels: int | None = None) -> int:
    """What H must be a positive multiple of: whole vector registers (and whole input scale blocks)."""
    return max(HIDDEN_MULTIPLE, in_block_channels or 0)


def num_token_blocks(num_tokens: int, block_tokens: int) -> int:
    """Scale rows of T tokens before packing: ceil(T / block_tokens)."""
    return -(-num_tokens // block_tokens)


@dataclasses.dataclass(frozen=True)
class PerChannelCastConfig:
    backend: Backend
    hidden: int
    in_dtype: str  # 'bfloat16', 'float32', or 'float8_e4m3fn' (pre-quantised, with in_block_channels)
    block_tokens: int  # tokens per scale factor
    round_sf: bool  # power-of-two scales
    packed_ue8m0: bool  # scales as UE8M0 bytes packed four token blocks per word (needs round_sf)
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the tile count)
    block_k: int  # channels handled per task (Ascend) / per thread block (CUDA); a multiple of 64 dividing hidden
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)
    in_block_channels: int | None = None  # pre-quantised x: channels per input scale; None for bf16 / fp32 x
    in_packed_ue8m0: bool = False  # pre-quantised x: its scales are UE8M0 bytes (row layout) instead of fp32
    in_e4m3_sf: bool = False  # pre-quantised x: its scales are E4M3 bytes instead of fp32
    vector_bytes: int = _CUDA_VECTOR_BYTES  # CUDA: bytes of x one thread loads per row (16, or 8: half the registers)
    x_staging: str = 'registers'  # CUDA: where the tile of x waits for its scales (CUDA_X_STAGINGS; unused on Ascend)
    # CUDA: thread blocks each SM must be able to hold (__launch_bounds__' minimum, which caps the registers a
    # thread and so how many loads ptxas hoists); 0: no cap.
    min_blocks: int = 0

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.in_block_channels is None:
            if self.in_dtype not in ('bfloat16', 'float32'):
                raise ValueError(f'in_dtype must be "bfloat16" or "float32", got {self.in_dtype!r}')
            if self.in_packed_ue8m0 or self.in_e4m3_sf:
                raise ValueError(
                    'in_packed_ue8m0 / in_e4m3_sf describe the scales of a pre-quantised x: set in_block_channels'
                )
        else:
            if self.in_block_channels not in IN_BLOCK_CHANNELS:
                raise ValueError(f'in_block_channels must be one of {IN_BLOCK_CHANNELS}, got {self.in_block_channels}')
            if self.in_dtype != _FP8:
                raise ValueError(f'a pre-quantised x (in_block_channels) must be {_FP8!r}, got {self.in_dtype!r}')
            if self.in_packed_ue8m0 and self.in_e4m3_sf:
                raise ValueError('in_packed_ue8m0 and in_e4m3_sf exclude each other (one input scale format)')
        if self.block_tokens not in BLOCK_TOKENS:
            raise ValueError(f'block_tokens must be one of {BLOCK_TOKENS}, got {self.block_tokens}')
        if self.packed_ue8m0 and not self.round_sf:
            raise ValueError('packed_ue8m0 needs round_sf (UE8M0 holds powers of two only)')
        unit = hidden_multiple(self.in_block_channels)
        if self.hidden <= 0 or self.hidden % unit != 0:
            raise ValueError(f'hidden must be a positive multiple of {unit}, got {self.hidden}')
        if self.block_k <= 0 or self.block_k % unit != 0 or self.hidden % self.block_k != 0:
            raise ValueError(f'block_k {self.block_k} must be a multiple of {unit} dividing hidden {self.hidden}')
        if self.num_cores <= 0:
            raise ValueError(f'num_cores must be positive, got {self.num_cores}')
        if self.backend == 'ascend':
            if self.block_k > _ASCEND_MAX_BLOCK_K or self.block_tokens * self.block_k * (self.in_bytes + 1) > (
                _ASCEND_MAX_TILE_BYTES
            ):
                raise ValueError(
                    f'Ascend: a task of {self.block_tokens} x {self.block_k} {self.in_dtype} exceeds the UB budget '
                    f'({_ASCEND_MAX_TILE_BYTES} bytes, at most {_ASCEND_MAX_BLOCK_K} channels)'
                )
            if self.num_stages not in (1, 2):
                raise ValueError(f'num_stages must be 1 or 2, got {self.num_stages}')
        else:
            if self.vector_bytes not in _CUDA_VECTOR_CHOICES:
                raise ValueError(f'CUDA: vector_bytes must be one of {_CUDA_VECTOR_CHOICES}, got {self.vector_bytes}')
            lanes = self.block_k // self.vector
            if self.block_k % self.vector or lanes > 32 or lanes & (lanes - 1):
                raise ValueError(
                    f'CUDA: block_k {self.block_k} must be a power of two times {self.vector} channels, at most 32 '
                    f'of them (one {self.vector_bytes}-byte load per thread and row)'
                )
            if self.threads % 32 or self.threads % lanes or not 0 < self.threads <= _CUDA_MAX_BLOCK_THREADS:
                raise ValueError(
                    f'CUDA: threads must be whole warps, at most {_CUDA_MAX_BLOCK_THREADS}, got {self.threads}'
                )
            if self.x_staging not in CUDA_X_STAGINGS:
                raise ValueError(f'CUDA: x_staging must be one of {CUDA_X_STAGINGS}, got {self.x_staging!r}')
            if self.min_blocks < 0 or self.min_blocks * self.threads > CUDA_MAX_THREADS_PER_SM:
                raise ValueError(
                    f'CUDA: min_blocks * threads must be in 0..{CUDA_MAX_THREADS_PER_SM}, got {self.min_blocks} * '
                    f'{self.threads}'
                )
            groups = self.threads // lanes
            if groups > self.block_tokens or self.block_tokens % groups:
                raise ValueError(
                    f'CUDA: {groups} row groups ({self.threads} threads / {lanes} per row) must divide the '
                    f'{self.block_tokens} tokens of a block'
                )

    @property
    def in_bytes(self) -> int:
        return _IN_BYTES[self.in_dtype]

    @property
    def num_col_tiles(self) -> int:
        return self.hidden // self.block_k

    @property
    def sf_pack(self) -> int:
        """Token blocks per scale row: 4 packed UE8M0 bytes per channel, else 1."""
        return UE8M0_PACK if self.packed_ue8m0 else 1

    @property
    def sf_cols(self) -> int:
        """Elements of one out_sf row: H fp32 scales, or 4 H UE8M0 bytes."""
        return self.hidden * self.sf_pack

    @property
    def sf_dtype(self) -> str:
        return 'uint8' if self.packed_ue8m0 else 'float32'

    def sf_rows(self, num_tokens: int) -> int:
        """Rows of out_sf for T tokens: ceil(T / block_tokens), over 4 (rounded up) when packed."""
        return -(-num_token_blocks(num_tokens, self.block_tokens) // self.sf_pack)

    def sf_shape(self, num_tokens: int) -> tuple[int, int]:
        """(rows, cols) of the out_sf argument for T tokens (cfg.sf_dtype elements)."""
        return self.sf_rows(num_tokens), self.sf_cols

    @property
    def in_sf_cols(self) -> int:
        """Elements of one x_sf row of a pre-quantised x: fp32 per channel block, or UE8M0 bytes padded to 4."""
        if self.in_block_channels is None:
            raise ValueError('in_sf_cols: x is not pre-quantised (in_block_channels is None)')
        blocks = self.hidden // self.in_block_channels
        return -(-blocks // UE8M0_PACK) * UE8M0_PACK if self.in_packed_ue8m0 else blocks

    @property
    def in_sf_dtype(self) -> str:
        if self.in_e4m3_sf:
            return _FP8
        return 'uint8' if self.in_packed_ue8m0 else 'float32'

    # CUDA thread layout: `lanes_per_row` threads cover one row of the tile with `vector_bytes` loads, `row_groups`
    # such rows are read at once, and each thread keeps `rows_per_thread` rows of its `vector` channels in registers.
    @property
    def vector(self) -> int:
        return self.vector_bytes // self.in_bytes

    @property
    def lanes_per_row(self) -> int:
        return self.block_k // self.vector

    @property
    def row_groups(self) -> int:
        return self.threads // self.lanes_per_row

    @property
    def rows_per_thread(self) -> int:
        return self.block_tokens // self.row_groups


def _pow2_tiles(hidden: int, unit: int, limit: int) -> list[int]:
    """unit * 2**k that divide `hidden` and do not exceed `limit`, largest first (never empty: unit)."""
    tiles, tile = [], unit
    while tile <= limit and hidden % tile == 0:
        tiles.append(tile)
        tile *= 2
    return tiles[::-1] or [unit]


def choose_per_channel_cast_config(
    *,
    backend: Backend,
    num_cores: int,
    hidden: int,
    in_dtype: torch.dtype | str,
    block_tokens: int,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    in_block_channels: int | None = None,
    in_packed_ue8m0: bool = False,
    in_e4m3_sf: bool = False,
) -> PerChannelCastConfig:
    """Pure choice of the compile-time parameters (no device query). `in_dtype`: torch.bfloat16 / torch.float32,
    or torch.float8_e4m3fn with `in_block_channels` (its scales fp32, UE8M0 with `in_packed_ue8m0` or E4M3 with
    `in_e4m3_sf`) (or their names). Invalid combinations raise ValueError."""
    if in_dtype not in _IN_DTYPES:
        raise ValueError(f'in_dtype must be torch.bfloat16, torch.float32 or torch.float8_e4m3fn, got {in_dtype!r}')
    dtype = _IN_DTYPES[in_dtype]
    if block_tokens not in BLOCK_TOKENS:
        raise ValueError(f'block_tokens must be one of {BLOCK_TOKENS}, got {block_tokens}')
    if in_block_channels is not None and in_block_channels not in IN_BLOCK_CHANNELS:
        raise ValueError(f'in_block_channels must be None or one of {IN_BLOCK_CHANNELS}, got {in_block_channels}')
    unit = hidden_multiple(in_block_channels)
    if not isinstance(hidden, int) or hidden <= 0 or hidden % unit != 0:
        raise ValueError(f'hidden must be a positive multiple of {unit}, got {hidden}')
    make = functools.partial(
        PerChannelCastConfig,
        backend,
        hidden,
        dtype,
        block_tokens,
        round_sf,
        packed_ue8m0,
        num_cores,
        in_block_channels=in_block_channels,
        in_packed_ue8m0=in_packed_ue8m0,
        in_e4m3_sf=in_e4m3_sf,
    )
    in_bytes = _IN_BYTES[dtype]
    if backend == 'ascend':
        # The widest task that fits the buffers: the op streams x once, so fewer, longer DMA rows per core.
        limit = min(_ASCEND_MAX_BLOCK_K, _ASCEND_MAX_TILE_BYTES // (block_tokens * (in_bytes + 1)))
        return make(block_k=divisors(hidden, unit, limit)[0], threads=0, num_stages=2)
    if backend == 'cuda':
        # One thread block per (token block, column tile): one 16-byte load per thread and row, up to a warp per
        # row, 256 threads, each holding at most _CUDA_MAX_VALUES values of its rows.
        vector = _CUDA_VECTOR_BYTES // in_bytes
        max_lanes = min(32, _CUDA_MAX_THREADS * _CUDA_MAX_VALUES // (block_tokens * vector))
        block_k = _pow2_tiles(hidden, unit, max_lanes * vector)[0]
        lanes = block_k // vector
        threads = lanes * min(block_tokens, _CUDA_MAX_THREADS // lanes)
        return make(block_k=block_k, threads=threads, num_stages=1)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_per_channel_cast_kernel(cfg: PerChannelCastConfig):
    """The TileLang prim_func `per_channel_cast_kernel(x, out, out_sf)` for `cfg.backend` (no compile);
    `per_channel_cast_kernel(x, x_sf, out, out_sf)` for a pre-quantised x (cfg.in_block_channels): the inputs,
    then the outputs.

    x: (T, hidden) cfg.in_dtype; x_sf: (T, cfg.in_sf_cols) cfg.in_sf_dtype; out: (T, hidden) float8_e4m3fn;
    out_sf: cfg.sf_shape(T) cfg.sf_dtype. T is dynamic and must be >= 1.
    """
    if cfg.backend == 'ascend':
        return ascend_per_channel_cast_kernel(cfg)
    return cuda_per_channel_cast_kernel(cfg)


@functools.cache
def get_per_channel_cast_kernel(cfg: PerChannelCastConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_per_channel_cast_kernel(cfg), cfg.backend)
