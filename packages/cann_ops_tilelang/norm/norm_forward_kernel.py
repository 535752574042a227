"""Kernels of norm_forward and norm_forward_and_per_token_cast (one family): RMSNorm of each row, optionally after
a residual add, optionally cast to e4m3 with per-token block scales.

Per token t (vectors over the hidden size H, fp32 math, TileKernels 2.1.0's grouping):

    r = x[t] + residual[t], rounded to x's dtype (r = x[t] without residual); residual_out[t] = r
    rstd = 1 / sqrt(sum(r * r) / H + eps)
    y = (r * rstd) * (w * out_scale), rounded to x's dtype (w = 1 without weight)

norm_forward writes y (`out`); norm_forward_and_per_token_cast casts the rounded y exactly as per_token_cast does
(the quant domain's scale rules and row macros: _scale_rules.py, _per_token_cast_ascend.py), so its bytes are
per_token_cast(norm_forward(x)) bit for bit, and may also write y as bf16 (`out_bf16`). H is any multiple of 64
for every block size: with 128-channel blocks an odd multiple (e.g. 2880) ends the row in per_token_cast's short
last block (64 channels, a scale of its own, ceil(H / 128) scales, nothing written past H). With `with_rstd` the
kernels write rstd (fp32, one per token), which norm_backward takes.

One prim_func signature for every variant (`forward_prim_func`): an absent optional tensor is a (1,) placeholder
the kernel never touches (_norm_common.placeholder), eps and out_scale are runtime fp32 scalars (no compile per
value). The token count is dynamic; the interface launches nothing for T = 0. Rows: contiguous, or
(`strided_rows`, TileKernels takes strided rows) x, residual, residual_out, out and out_bf16 each rows of a
runtime stride (launch arguments, each row starting on 16 bytes: the interfaces check it); data and the scales
keep their layouts.

Ascend (_norm_forward_ascend.py): a persistent loop of whole rows over the vector cores, the row in UB, the
weight times out_scale resident in fp32 (streamed per row, tile by tile, where the row's buffers do not fit UB
beside it: NormForwardConfig.weight_streamed). CUDA (_norm_forward_cuda.py): one thread block per row, 16-byte
chunks per thread kept in registers between the reduction and the epilogue; the cast's block maxima by warp
shuffles.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import CUDA_MAX_THREADS_PER_SM, compile_kernel
from cann_ops_tilelang.quant._scale_rules import col_major_scales
from cann_ops_tilelang.quant._tiling import FLOAT_DTYPE_NAMES, RowScales
from cann_ops_tilelang.quant.per_token_cast_kernel import CAST_BLOCK_SIZES

# The backend bodies (they do not import this module: no import circle).
from ._norm_common import (
    DTYPE_BYTES,
    HIDDEN_MULTIPLE,
    LANES,
    MAX_HIDDEN,
    ascend_stages,
    cuda_row_layout,
    row_strides,
    row_tensor,
)
from ._norm_forward_ascend import WEIGHT_TILE, ascend_norm_forward_kernel
from ._norm_forward_cuda import cuda_norm_forward_kernel

CAST_FORMATS = ('e4m3',)  # the cast's output formats
_CUDA_MAX_CHUNKS = 4  # 16-byte chunks per thread: 64 bytes of each input in flight per thread


@dataclasses.dataclass(frozen=True)
class NormForwardConfig(RowScales):
    backend: Backend
    hidden: int
    dtype: str  # x, weight, residual, residual_out and out: 'bfloat16' or 'float32'
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational: one block per row)
    with_weight: bool
    with_residual: bool
    with_rstd: bool
    block_size: int = 0  # the cast's channels per scale (CAST_BLOCK_SIZES); 0: no cast, y goes to `out`
    round_sf: bool = False  # power-of-two scales
    packed_ue8m0: bool = False  # the scales as UE8M0 bytes (needs round_sf)
    with_out_bf16: bool = False  # the cast also writes y as bf16
    threads: int = 0  # CUDA threads per block (a row); 0 on Ascend
    chunks: int = 0  # CUDA 16-byte chunks per thread
    num_stages: int = 1  # Ascend buffer versions of the persistent loop (1 on CUDA)
    # The scales written column-major (TileKernels' use_tma_aligned_col_major_sf, per_token_cast's layout): the
    # kernel's sf is the transposed view (sf_cols, T) of a row stride that is a launch argument; packed UE8M0 bytes
    # (sf_cols / 4, 4 T), row r's word w at [w, 4 r : 4 r + 4].
    col_major_sf: bool = False
    # Ascend, with weight: no resident weight; each row reads w in staging tiles and computes its y tile by tile
    # (the same products and roundings, so the same bits; the weight read once per row). Chosen only where the
    # row's buffers do not fit UB beside the resident fp32 weight (fp32 x, residual, the cast's bf16 output).
    weight_streamed: bool = False
    # The row tensors (x, residual, residual_out, out, out_bf16; `row_tensors`) rows of runtime strides, one a
    # tensor, each starting on 16 bytes (TileKernels takes strided rows); False: contiguous rows, the kernels that
    # have no stride argument.
    strided_rows: bool = False
    # CUDA schedule fields, for more row blocks per SM through fewer registers a thread (off in every chosen
    # configuration; docs/norm.md: what ptxas says of each, what is measured). `late_weight`: the weight's chunks
    # loaded in the epilogue (every row reads the same H values: L1 / L2 hits), not held across the reduction;
    # `narrow_row`: the row (r, then y) held in x's dtype between the phases and widened where used, instead of
    # a second fp32 copy (widening is exact: the same bits); `min_blocks`: __launch_bounds__' minimum blocks per
    # SM (a register cap; 0: none).
    late_weight: bool = False
    narrow_row: bool = False
    min_blocks: int = 0

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f'dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}')
        if self.hidden <= 0 or self.hidden % HIDDEN_MULTIPLE or self.hidden > MAX_HIDDEN:
            raise ValueError(f'hidden must be a positive multiple of {HIDDEN_MULTIPLE} up to {MAX_HIDDEN}')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.cast:
            # H is whole 64-lane registers (above), so every block size fits it; with 128-channel blocks an odd
            # multiple of 64 leaves per_token_cast's short last block.
            if self.block_size not in CAST_BLOCK_SIZES:
                raise ValueError(f'block_size {self.block_size} must be one of {CAST_BLOCK_SIZES}')
            if self.packed_ue8m0 and not self.round_sf:
                raise ValueError('packed_ue8m0 needs round_sf (UE8M0 holds powers of two only)')
        elif self.round_sf or self.packed_ue8m0 or self.with_out_bf16 or self.col_major_sf:
            raise ValueError(
                'round_sf, packed_ue8m0, with_out_bf16 and col_major_sf belong to the cast (block_size > 0)'
            )
        if not isinstance(self.col_major_sf, bool):
            raise TypeError(f'col_major_sf must be a bool, got {type(self.col_major_sf).__name__}')
        if self.backend == 'cuda' and (self.threads % 32 or not 32 <= self.threads <= 1024 or self.chunks < 1):
            raise ValueError(f'CUDA: threads {self.threads} must be whole warps up to 1024, chunks >= 1')
        if self.backend != 'cuda' and (self.late_weight or self.narrow_row or self.min_blocks):
            raise ValueError('late_weight, narrow_row and min_blocks are CUDA options')
        if self.late_weight and not self.with_weight:
            raise ValueError('late_weight needs with_weight')
        if self.min_blocks < 0 or self.min_blocks * self.threads > CUDA_MAX_THREADS_PER_SM:
            raise ValueError(
                f'CUDA: min_blocks * threads must be in 0..{CUDA_MAX_THREADS_PER_SM}, got {self.min_blocks} * '
                f'{self.threads}'
            )
        if self.num_stages not in (1, 2):
            raise ValueError(f'num_stages must be 1 or 2, got {self.num_stages}')
        if self.weight_streamed and (self.backend != 'ascend' or not self.with_weight):
            raise ValueError('weight_streamed is an Ascend option of a kernel with weight')

    @property
    def cast(self) -> bool:
        return self.block_size > 0

    # The scale row (sf_cols, sf_padding, sf_dtype) is per_token_cast's, RowScales', from these.
    @property
    def block_channels(self) -> int:
        return self.block_size

    @property
    def block_k(self) -> int:
        """Columns of one task (Ascend) / thread block (CUDA): the row."""
        return self.hidden

    @property
    def num_blocks(self) -> int:
        """Scale factors per row, ceil(H / block_size) (RowScales'; a short last block has one); 0 without the cast."""
        return super().num_blocks if self.cast else 0

    @property
    def short_block(self) -> bool:
        """Whether the cast's last block is short (H = 64 * odd with 128-channel blocks): its 64 channels' scale."""
        return self.cast and super().short_block

    @property
    def writes_y(self) -> bool:
        """y in x's dtype goes to `out`: without the cast, or with it as the bf16 output of bf16 x."""
        return not self.cast or (self.with_out_bf16 and self.dtype == 'bfloat16')

    @property
    def separate_bf16(self) -> bool:
        """The bf16 output needs its own buffer (fp32 x); for bf16 x it is y itself."""
        return self.with_out_bf16 and self.dtype == 'float32'

    @property
    def row_tensors(self) -> tuple[str, ...]:
        """The kernel's (T, H) row tensors of the variant, strided with `strided_rows` (data stays contiguous)."""
        names = ('x', *(('residual', 'residual_out') if self.with_residual else ()))
        return names + ('out',) * self.writes_y + ('out_bf16',) * self.separate_bf16


def ascend_ub_bytes(*, hidden: int, dtype: str, with_weight: bool, with_residual: bool, block_size: int,
                    packed_ue8m0: bool, with_out_bf16: bool,
                    weight_streamed: bool = False) -> tuple[int, int]:  # fmt: skip
    """(bytes per buffer version, resident bytes) of the Ascend kernel's UB buffers; `weight_streamed`: the
    weight's staging tile only, no resident fp32 weight."""
    row = hidden * DTYPE_BYTES[dtype]
    per_stage = row * (2 if with_residual else 1) + 32  # x (then r), residual (then y), rstd
    resident = (hidden * 4 * (not weight_streamed) + WEIGHT_TILE * DTYPE_BYTES[dtype]) if with_weight else 0
    if block_size:
        blocks = -(-hidden // block_size)  # a short last block has its scale
        groups = -(-blocks // LANES) * LANES
        per_stage += hidden + groups * (1 if packed_ue8m0 else 4)  # e4m3 data, scales
        per_stage += hidden * 2 if with_out_bf16 and dtype == 'float32' else 0
        resident += 2 * groups * 4  # block maxima, inverses
    return per_stage, resident


def choose_norm_forward_config(
    *,
    backend: Backend,
    num_cores: int,
    hidden: int,
    dtype: torch.dtype | str,
    with_weight: bool,
    with_residual: bool,
    with_rstd: bool,
    block_size: int = 0,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    with_out_bf16: bool = False,
    col_major_sf: bool = False,
    strided_rows: bool = False,
) -> NormForwardConfig:
    """Pure choice of the compile-time parameters (no device query); ValueError for what the kernels do not take.
    On Ascend the weight stays resident in UB where the row's buffers fit beside it, else it is streamed per row
    (`weight_streamed`; only fp32 x with residual and the cast's bf16 output, H past 15296..16000)."""
    if dtype not in FLOAT_DTYPE_NAMES:
        raise ValueError(f'dtype must be torch.bfloat16 or torch.float32, got {dtype!r}')
    name = FLOAT_DTYPE_NAMES[dtype]
    make = functools.partial(
        NormForwardConfig, backend, hidden, name, num_cores, with_weight, with_residual, with_rstd,
        block_size, round_sf, packed_ue8m0, with_out_bf16, col_major_sf=col_major_sf, strided_rows=strided_rows,
    )  # fmt: skip
    if backend == 'ascend':
        ub = functools.partial(
            ascend_ub_bytes, hidden=hidden, dtype=name, with_weight=with_weight, with_residual=with_residual,
            block_size=block_size, packed_ue8m0=packed_ue8m0, with_out_bf16=with_out_bf16,
        )  # fmt: skip
        try:
            stages, streamed = ascend_stages('norm_forward', *ub()), False
        except ValueError:  # the row's buffers do not fit beside the resident weight
            if not with_weight:
                raise
            stages, streamed = ascend_stages('norm_forward', *ub(weight_streamed=True)), True
        return make(num_stages=stages, weight_streamed=streamed)
    if backend == 'cuda':
        threads, chunks, _ = cuda_row_layout(hidden, name, _CUDA_MAX_CHUNKS)
        return make(threads=threads, chunks=chunks)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def forward_prim_func(T, cfg: NormForwardConfig, body, strides: dict | None = None):
    """The prim_func `norm_forward_kernel(x, weight, residual, residual_out, out, rstd, data, sf, out_bf16, eps,
    out_scale)` around a backend's body macro (same arguments, then num_tokens). Absent tensors of the variant
    are (1,) placeholders: weight without with_weight, residual and residual_out without with_residual, out
    where y is not written in x's dtype (`writes_y`), rstd without with_rstd, data and sf without the cast,
    out_bf16 without a separate bf16 output. `strides`: the row-stride symbols of the row tensors
    (`forward_row_strides`; the backend's body may assume on them), None: made here."""
    if strides is None:
        strides = forward_row_strides(T, cfg)
    rows = functools.partial(row_tensor, T, strides=strides)
    num_tokens = T.dynamic('num_tokens')
    row = (num_tokens, cfg.hidden)
    one = (1,)
    w_shape = (cfg.hidden,) if cfg.with_weight else one
    res_shape = row if cfg.with_residual else one
    out_shape = row if cfg.writes_y else one
    rstd_shape = (num_tokens,) if cfg.with_rstd else one
    data_shape = row if cfg.cast else one
    sf_shape = (num_tokens, cfg.sf_cols) if cfg.cast else one
    bf16_shape = row if cfg.separate_bf16 else one
    dtype, sf_dtype = cfg.dtype, cfg.sf_dtype
    sf_type = T.Tensor(sf_shape, sf_dtype)
    if cfg.col_major_sf:  # the transposed column-major scales: rows of stride sf_stride >= T
        sf_type = col_major_scales(T, num_tokens, cfg.sf_cols, sf_dtype, packed=cfg.packed_ue8m0)

    @T.prim_func
    def norm_forward_kernel(
        x: rows(row, dtype, name='x'),
        weight: T.Tensor(w_shape, dtype),
        residual: rows(res_shape, dtype, name='residual'),
        residual_out: rows(res_shape, dtype, name='residual_out'),
        out: rows(out_shape, dtype, name='out'),
        rstd: T.Tensor(rstd_shape, T.float32),
        data: T.Tensor(data_shape, T.float8_e4m3fn),
        sf: sf_type,
        out_bf16: rows(bf16_shape, T.bfloat16, name='out_bf16'),
        eps: T.float32,
        out_scale: T.float32,
    ):
        body(x, weight, residual, residual_out, out, rstd, data, sf, out_bf16, eps, out_scale, num_tokens)

    return norm_forward_kernel


def forward_row_strides(T, cfg: NormForwardConfig) -> dict:
    """The row-stride symbols of cfg's row tensors, by name ({} without strided_rows)."""
    return row_strides(T, cfg, cfg.row_tensors)


def make_norm_forward_kernel(cfg: NormForwardConfig):
    """The TileLang prim_func `norm_forward_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_norm_forward_kernel(cfg, forward_prim_func)
    return cuda_norm_forward_kernel(cfg, forward_prim_func)


@functools.cache
def get_norm_forward_kernel(cfg: NormForwardConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_norm_forward_kernel(cfg), cfg.backend)
