"""Kernels of moe_swiglu_forward and moe_swiglu_forward_and_per_token_cast (one family: the fused cast is this
kernel with per_token_cast's passes on the fp32 result).

Per row t of x (T, 2 I) = [gate | up] (math and expert layout: _swiglu.py): y = silu(gate) * up (clamped first
with a clamp value), times the row's weight w = fp32(topk_weights[t] * routed_scaling_factor) where weights are
given; padding rows of the expert layout give y = 0 without reading x. The output is y as bf16 (to nearest even)
or fp32, or ('e4m3') per_token_cast's cast of the fp32 y (its scale rules, _scale_rules.py, and its data
narrowing), so that the fused result equals per_token_cast(moe_swiglu_forward(x, 'fp32')) bit for bit.

Clamp counts (deterministic, no atomics): the kernel writes integer partial counts that the interface sums into
clamped_count (int64) with one torch reduction: on Ascend, per vector core and lane, four int32 rows of 64 lanes
(gate > c, up > c, up < -c, 64 elements of a non-padding row per register); on CUDA, one int32 per (row, block of
`block_size` channels) whose four bytes are those four counts of the block (each <= 128; with a short last block
per block of the tiles, the one wholly past I a zero).

Supported: T >= 1 per launch (the interface skips empty inputs; T is dynamic), I a positive multiple of 64 for
every block (per_token_cast's rows: with 128-channel blocks an odd multiple, e.g. 2880, ends in its short last block
of 64 channels, a scale of its own, ceil(I / 128) scales, nothing written past I; its tiles, short_block_k: Ascend
the row in one task, I <= 8128; CUDA whole blocks, the last tile reaching past I; packed UE8M0 rows of 4 n + r
blocks past I = 8192: per_token_cast's Ascend tasks, ascend_row_block_k, column-major refused), T * 2 I < 2**31
(int32 element offsets), E >= 1 experts (dynamic). One generator builds the Ascend 950 kernel
(_moe_swiglu_forward_ascend.py) or the CUDA kernel (_moe_swiglu_forward_cuda.py), chosen by `cfg.backend`.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel
from cann_ops_tilelang.quant._scale_rules import LANES, check_col_major_words
from cann_ops_tilelang.quant._tiling import FLOAT_DTYPE_NAMES, RowScales, divisors
from cann_ops_tilelang.quant.per_token_cast_kernel import (
    CAST_BLOCK_SIZES,
    CAST_HIDDEN_UNIT,
    ascend_row_block_k,
    check_row_tiles,
    hidden_multiple,
    short_block_k,
)

# The backend kernels (they do not import this module: no import circle).
from ._moe_swiglu_forward_ascend import ascend_moe_swiglu_forward_kernel
from ._moe_swiglu_forward_cuda import cuda_moe_swiglu_forward_kernel
from ._swiglu import CLAMP_COUNTERS, TOKEN_ALIGNMENT

OUT_FORMATS = {'bf16': 'bfloat16', 'fp32': 'float32', 'e4m3': 'float8_e4m3fn'}  # fmt -> the output's dtype name
PLAIN_BLOCK = LANES  # the tile grain of bf16 / fp32 output: one fp32 register
_ASCEND_MAX_BLOCK_K = 4096  # output channels per task: gate and up tiles of 16 KiB in fp32, two buffer versions
_CUDA_MAX_BLOCK_K = 2048  # output channels per thread block
_CUDA_THREADS = (128, 64, 32)  # per block, the widest first
_CUDA_RUN = 8  # elements per thread and load: 16 bytes of bf16


@dataclasses.dataclass(frozen=True)
class MoeSwigluForwardConfig(RowScales):
    backend: Backend
    hidden: int  # I: output channels per row (x has 2 I)
    in_dtype: str  # 'bfloat16' or 'float32'
    fmt: str  # 'bf16', 'fp32' or 'e4m3' (OUT_FORMATS)
    block_size: int  # channels per scale factor ('e4m3'); PLAIN_BLOCK otherwise (the tile grain)
    round_sf: bool  # power-of-two scales ('e4m3')
    packed_ue8m0: bool  # scales as UE8M0 bytes (needs round_sf)
    with_layout: bool  # psum_num_tokens_per_expert given: padding rows give 0 and are not counted
    with_weight: bool  # topk_weights given (times the routed scaling factor, 1.0 when None)
    clamp: bool  # clamp_value given
    count_clamp: bool  # clamped_count given (needs clamp)
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is the tile count)
    block_k: int  # output channels per task (Ascend) / per thread block (CUDA); divides hidden
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)
    alignment: int = TOKEN_ALIGNMENT  # rows per expert block of the layout
    # The scales written column-major (TileKernels' use_tma_aligned_col_major_sf, per_token_cast's layout; fmt
    # 'e4m3' only): the kernel's out_sf is the transposed view (sf_cols, T) of a row stride that is a launch
    # argument; packed UE8M0 bytes (sf_cols / 4, 4 T), row t's word w at [w, 4 t : 4 t + 4].
    col_major_sf: bool = False

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.in_dtype not in ('bfloat16', 'float32'):
            raise ValueError(f'in_dtype must be "bfloat16" or "float32", got {self.in_dtype!r}')
        if self.fmt not in OUT_FORMATS:
            raise ValueError(f'fmt must be one of {tuple(OUT_FORMATS)}, got {self.fmt!r}')
        blocks = CAST_BLOCK_SIZES if self.fp8 else (PLAIN_BLOCK,)
        if self.block_size not in blocks:
            raise ValueError(f'block_size must be one of {blocks} with fmt {self.fmt!r}, got {self.block_size}')
        if (self.round_sf or self.packed_ue8m0) and not self.fp8:
            raise ValueError('round_sf and packed_ue8m0 apply to fmt "e4m3" only')
        if self.packed_ue8m0 and not self.round_sf:
            raise ValueError('packed_ue8m0 needs round_sf (UE8M0 holds powers of two only)')
        if self.count_clamp and not self.clamp:
            raise ValueError('count_clamp needs clamp')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.alignment < 1:
            raise ValueError(f'alignment must be >= 1, got {self.alignment}')
        # per_token_cast's rows: whole 64-lane registers for every block; with 128-channel blocks an odd multiple
        # of 64 ends in its short last block, and the tiles are its (check_row_tiles).
        if self.hidden <= 0 or self.hidden % CAST_HIDDEN_UNIT:
            raise ValueError(f'hidden must be a positive multiple of {CAST_HIDDEN_UNIT}, got {self.hidden}')
        check_row_tiles(self)
        if not isinstance(self.col_major_sf, bool):
            raise TypeError(f'col_major_sf must be a bool, got {type(self.col_major_sf).__name__}')
        if self.col_major_sf and not self.fp8:
            raise ValueError('col_major_sf applies to fmt "e4m3" only (the scales of the fused cast)')
        check_col_major_words(self)
        if self.backend == 'cuda' and self.block_size > 255:
            raise ValueError('CUDA: a block count must fit its byte of the packed clamp counts')

    @property
    def fp8(self) -> bool:
        return self.fmt == 'e4m3'

    @property
    def block_channels(self) -> int:
        """Channels per scale (RowScales)."""
        return self.block_size

    @property
    def out_dtype(self) -> str:
        return OUT_FORMATS[self.fmt]

    def count_slots(self, num_tokens: int) -> int:
        """int32 partial counts the kernel writes for `num_tokens` rows (fold_counts sums them)."""
        if self.backend == 'ascend':
            return self.num_cores * CLAMP_COUNTERS * LANES
        return num_tokens * self.num_col_tiles * self.groups_per_tile  # a block past I (short: the tiles' overhang) 0


def fold_counts(cfg: MoeSwigluForwardConfig, partial: torch.Tensor) -> torch.Tensor:
    """The four int64 clamp counts of the kernel's int32 partial counts (cfg.count_slots of them)."""
    if cfg.backend == 'ascend':
        return partial.view(-1, CLAMP_COUNTERS, LANES).sum((0, 2), dtype=torch.int64)
    return partial.view(torch.uint8).view(-1, CLAMP_COUNTERS).sum(0, dtype=torch.int64)  # little-endian bytes


def choose_moe_swiglu_forward_config(
    *,
    backend: Backend,
    num_cores: int,
    hidden: int,
    in_dtype: torch.dtype | str,
    fmt: str = 'bf16',
    block_size: int | None = None,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    with_layout: bool = False,
    with_weight: bool = False,
    clamp: bool = False,
    count_clamp: bool = False,
    col_major_sf: bool = False,
) -> MoeSwigluForwardConfig:
    """Pure choice of the compile-time parameters (no device query). `hidden`: I, the output width. `block_size`:
    channels per scale with fmt 'e4m3' (None: PLAIN_BLOCK for bf16 / fp32 output). `col_major_sf`: the scales
    column-major (only where they are stored; on Ascend with packed UE8M0, tasks of whole words). Invalid
    combinations raise ValueError."""
    if in_dtype not in FLOAT_DTYPE_NAMES:
        raise ValueError(f'in_dtype must be torch.bfloat16 or torch.float32, got {in_dtype!r}')
    if fmt not in OUT_FORMATS:
        raise ValueError(f'fmt must be one of {tuple(OUT_FORMATS)}, got {fmt!r}')
    block = PLAIN_BLOCK if block_size is None else block_size
    unit = hidden_multiple(block)
    if hidden <= 0 or hidden % CAST_HIDDEN_UNIT:
        raise ValueError(f'hidden must be a positive multiple of {CAST_HIDDEN_UNIT}, got {hidden}')
    make = functools.partial(
        MoeSwigluForwardConfig, backend, hidden, FLOAT_DTYPE_NAMES[in_dtype], fmt, block, round_sf, packed_ue8m0,
        with_layout, with_weight, clamp, count_clamp, num_cores, col_major_sf=col_major_sf,
    )  # fmt: skip
    if backend in ('ascend', 'cuda') and hidden % unit:
        # A short last block (I = 64 * odd, 128-channel blocks): per_token_cast's tiles (Ascend: the row).
        block_k = short_block_k(backend, hidden, block)
        if backend == 'ascend':
            return make(block_k=block_k, threads=0, num_stages=2)
        return make(block_k=block_k, threads=_cuda_threads(block_k), num_stages=1)
    if backend == 'ascend':
        # per_token_cast's tasks (packed UE8M0 rows too), up to this kernel's widest.
        block_k = ascend_row_block_k(
            hidden, block, _ASCEND_MAX_BLOCK_K, packed_ue8m0=packed_ue8m0, col_major_sf=col_major_sf
        )
        return make(block_k=block_k, threads=0, num_stages=2)
    if backend == 'cuda':
        # One thread block per (row, column tile), many per SM: each thread loads runs of 8 gate and 8 up elements
        # (16-byte bf16 loads) before any arithmetic. The widest block whose tile splits into such runs evenly,
        # else 32 threads on any tile (shorter vectors).
        for threads in _CUDA_THREADS:
            tiles = (
                divisors(hidden, threads * _CUDA_RUN, _CUDA_MAX_BLOCK_K) if hidden % (threads * _CUDA_RUN) == 0 else []
            )
            if tiles:
                return make(block_k=tiles[0], threads=threads, num_stages=1)
        return make(block_k=divisors(hidden, unit, _CUDA_MAX_BLOCK_K)[0], threads=_CUDA_THREADS[-1], num_stages=1)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def _cuda_threads(block_k: int) -> int:
    """The widest thread block whose threads split a tile of block_k columns into runs of _CUDA_RUN, else the
    narrowest (shorter vectors)."""
    return next((threads for threads in _CUDA_THREADS if block_k % (threads * _CUDA_RUN) == 0), _CUDA_THREADS[-1])


def make_moe_swiglu_forward_kernel(cfg: MoeSwigluForwardConfig):
    """The TileLang prim_func `moe_swiglu_forward_kernel` for `cfg.backend` (no compile), with the arguments

    x (T, 2 I) cfg.in_dtype; out (T, I) cfg.out_dtype; out_sf (T, cfg.sf_cols) fp32 / uint8 with fmt 'e4m3' (with
    cfg.col_major_sf the transposed view (cfg.sf_cols, T) of row stride S >= T, packed UE8M0 bytes (sf_cols / 4,
    4 T) of row stride 4 S), else (1, 1) fp32 (unused); psum (E,) int32; topk_weights (T,) fp32, or (1,) unused
    without weights; counts (cfg.count_slots(T),) int32, or (1,) unused without counting; routed_scaling_factor,
    clamp_value: fp32 scalars. T and E are dynamic, T >= 1.
    """
    if cfg.backend == 'ascend':
        return ascend_moe_swiglu_forward_kernel(cfg)
    return cuda_moe_swiglu_forward_kernel(cfg)


@functools.cache
def get_moe_swiglu_forward_kernel(cfg: MoeSwigluForwardConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_moe_swiglu_forward_kernel(cfg), cfg.backend)
