"""Kernels of moe_swiglu_backward and moe_swiglu_backward_and_per_token_cast: the SwiGLU backward over the MoE
expert layout, recomputing the activation, with an optional per-token FP8 cast of the input gradient.

Semantics (TileKernels 2.1.0's `swiglu_backward_and_per_token_cast_impl`). Row t of x holds the gate half a =
x[t, :H] and the value half b = x[t, H:] (fp8 x: data * its scale per block of `block_size` channels, in fp32);
g = act_x_grad[t], w = topk_weights[t] * routed_scaling_factor (1 without weights), c the clamp value. In fp32:

    a' = min(a, c), b' = min(max(b, -c), c)               (no clamp: a' = a, b' = b)
    s = 1 / (1 + exp(-a')), silu = a' * s, act = silu * b'
    x_grad[t, :H] = g * w * s * b' * (1 + a' * (1 - s)), 0 where a > c
    x_grad[t, H:] = g * w * s * a',                       0 where |b| > c
    act_out[t] = act * w                                   (do_recompute)
    weight_grad[t] = routed_scaling_factor * sum_h g * act (with weights: lanes accumulated in a fixed order)

Padding slots of the expert layout (_swiglu_backward_common.py) get zeros in every output, scales included. With
the cast, the fp32 x_grad row is cast per block of `block_size` channels as per_token_cast casts a (T, 2 H) tensor
(the same scale rules and SIMD / CUDA code, quant/_scale_rules.py), and x_grad itself is returned in bf16.

Straddling blocks (cfg.straddles: H = 64 * odd with 128-channel blocks, e.g. gpt-oss's 2880): 2 H is whole blocks
but block H / 128 holds the gate half's last 64 channels and the up half's first 64, for x's scales and the cast's
alike. Those configurations tile the 2 H row, never a half: on Ascend one task is the token's row (the gate and up
gradients side by side in UB, the cast's passes over both), on CUDA a tile is whole blocks of the 2 H row and each
position computes its own column's gradient (the gate's or the up's, the column's values loaded for either). With
packed UE8M0 the scale row ends in zero bytes up to a whole word (per_token_cast's padding).

One generator builds the Ascend 950 kernel (vector cores, SIMD: _moe_swiglu_backward_ascend.py) or the CUDA kernel
(_moe_swiglu_backward_cuda.py), chosen by `cfg.backend`. Both take every argument of the prim_func below; those a
configuration does not use (psum, weights, act_out, the cast's) are placeholders of one element that it never
touches. The token count is dynamic: one compiled kernel per configuration serves every batch.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools
import math

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

from ..quant._scale_rules import UE8M0_PACK
from ..quant._tiling import divisors
from ..quant.per_token_cast_kernel import BLOCK_SIZES, CAST_HIDDEN_UNIT, hidden_multiple

# The backend kernels (they do not import this module: no import circle).
from ._moe_swiglu_backward_ascend import ascend_moe_swiglu_backward_kernel
from ._moe_swiglu_backward_cuda import cuda_moe_swiglu_backward_kernel
from ._swiglu import TOKEN_ALIGNMENT

# torch dtype -> TileLang name, of x (fp8 only with the cast), act_x_grad and the outputs
DTYPE_NAMES = {torch.bfloat16: 'bfloat16', torch.float32: 'float32', torch.float8_e4m3fn: 'float8_e4m3fn'}
FLOAT_NAMES = ('bfloat16', 'float32')
OUT_FORMATS = {'bf16': torch.bfloat16, 'fp32': torch.float32}  # moe_swiglu_backward's fmt -> x_grad's dtype
CAST_FORMAT = 'e4m3'  # moe_swiglu_backward_and_per_token_cast's fmt
CAST_BLOCK_SIZES = BLOCK_SIZES  # channels per scale: 32, 64 or 128 (both backends)
HIDDEN_UNIT = hidden_multiple(0)  # H, without the cast: whole 64-lane registers
_ASCEND_MAX_BLOCK_K = 2048  # channels of each half per tile: <= 96 KiB of UB in fp32, two buffer versions
# Straddling blocks: the row is one task, H channels of each half in UB (about 37 bytes a channel: x_grad and act_out
# bf16, the cast's fp32 row, two buffer versions); at 6720 the worst configuration (fp32 act_x_grad, every option)
# lowers to at most 240 KiB of the 248 KiB.
_ASCEND_MAX_STRADDLING_HIDDEN = 6720
_CUDA_MAX_BLOCK_K = 1024  # channels of each half per tile: 8 per thread, 16-byte loads of bf16
_CUDA_THREADS = 128  # the most threads per block
_WARP = 32


def blocks_straddle(hidden: int, block_size: int) -> bool:
    """Whether a scale block of the cast's 2 H row holds channels of both halves (block_size 0: no cast): H not whole
    blocks, the configurations then check H = 64 * odd with 128-channel blocks (2 H whole blocks)."""
    return block_size > 0 and hidden > 0 and hidden % block_size != 0


@dataclasses.dataclass(frozen=True)
class MoeSwigluBackwardConfig:
    backend: Backend
    hidden: int  # H: x is (T, 2 H)
    x_dtype: str  # 'bfloat16', 'float32', or 'float8_e4m3fn' (with the cast)
    grad_dtype: str  # act_x_grad's: 'bfloat16' or 'float32'
    out_dtype: str  # x_grad's and act_out's: 'bfloat16' or 'float32' ('bfloat16' with the cast)
    num_experts: int  # E of psum_num_tokens_per_expert; 0: no expert layout (every slot a token)
    with_weight: bool  # topk_weights given: the weight scaling and weight_grad
    use_clamp: bool
    do_recompute: bool  # write act_out
    block_size: int  # channels per scale of x and of the cast; 0: no cast
    round_sf: bool  # the cast's power-of-two scales
    packed_ue8m0: bool  # the cast's scales as UE8M0 bytes (needs round_sf)
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational: one block per token)
    block_k: int  # channels of each half per tile; divides hidden (straddling blocks: CUDA positions of the 2 H row)
    threads: int  # CUDA threads per block (unused on Ascend)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)
    alignment: int = TOKEN_ALIGNMENT  # of the expert layout's starts
    # The cast's scales written column-major (TileKernels' use_tma_aligned_col_major_sf, per_token_cast's layout):
    # x_grad_sf is the transposed view (sf_cols, T) of a row stride that is a launch argument; packed UE8M0 bytes
    # (sf_cols / 4, 4 T), token t's word w at [w, 4 t : 4 t + 4].
    col_major_sf: bool = False

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.cast:
            if self.block_size not in CAST_BLOCK_SIZES:
                raise ValueError(f'block_size must be 0 or one of {CAST_BLOCK_SIZES}, got {self.block_size}')
            if self.x_dtype != 'float8_e4m3fn' or self.out_dtype != 'bfloat16':
                raise ValueError('the cast takes float8_e4m3fn x and writes a bfloat16 x_grad')
        elif self.x_dtype not in FLOAT_NAMES or self.out_dtype not in FLOAT_NAMES:
            raise ValueError(f'x_dtype and out_dtype must be one of {FLOAT_NAMES} without the cast')
        if self.grad_dtype not in FLOAT_NAMES:
            raise ValueError(f'grad_dtype must be one of {FLOAT_NAMES}, got {self.grad_dtype!r}')
        if self.packed_ue8m0 and not self.round_sf:
            raise ValueError('packed_ue8m0 needs round_sf (UE8M0 holds powers of two only)')
        if (self.round_sf or self.packed_ue8m0) and not self.cast:
            raise ValueError('round_sf and packed_ue8m0 are options of the cast (block_size > 0)')
        if self.packed_ue8m0 and not self.straddles and self.row_blocks % UE8M0_PACK:
            raise ValueError(f'packed_ue8m0 needs whole int32 words of scales: 2 * hidden / block_size a multiple of '
                             f'{UE8M0_PACK}, got {self.row_blocks}')  # fmt: skip
        unit = self.hidden_unit
        if self.straddles:
            check_straddling_tiles(self)
        elif self.hidden <= 0 or self.hidden % unit:
            raise ValueError(f'hidden must be a positive multiple of {unit}, got {self.hidden}')
        elif self.block_k % unit or self.hidden % self.block_k:
            raise ValueError(f'block_k {self.block_k} must be a multiple of {unit} dividing hidden {self.hidden}')
        if self.num_experts < 0 or self.alignment < 1:
            raise ValueError(f'num_experts must be >= 0 and alignment >= 1, got {self.num_experts}, {self.alignment}')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if not isinstance(self.col_major_sf, bool):
            raise TypeError(f'col_major_sf must be a bool, got {type(self.col_major_sf).__name__}')
        if self.col_major_sf and not self.cast:
            raise ValueError('col_major_sf is an option of the cast (block_size > 0)')
        if (
            self.col_major_sf
            and self.packed_ue8m0
            and self.backend == 'ascend'
            and not self.straddles
            and (self.num_blocks % UE8M0_PACK or self.groups_per_tile % UE8M0_PACK)
        ):
            raise ValueError(
                f'Ascend: column-major UE8M0 scales need whole int32 words per half tile: hidden / block_size and '
                f'block_k / block_size multiples of {UE8M0_PACK}, got {self.num_blocks} and {self.groups_per_tile}'
            )

    @property
    def cast(self) -> bool:
        return self.block_size > 0

    @property
    def hidden_unit(self) -> int:
        """What hidden and block_k are multiples of: whole registers, and whole scale blocks with the cast (but
        for straddling blocks)."""
        return hidden_multiple(self.block_size)

    @property
    def straddles(self) -> bool:
        """Whether a scale block holds channels of both halves: H = 64 * odd with 128-channel blocks (2 H whole
        blocks, H not)."""
        return blocks_straddle(self.hidden, self.block_size)

    @property
    def num_col_tiles(self) -> int:
        """Tiles of a row: of each half, or with straddling blocks of the 2 H row (Ascend: the row, one)."""
        if self.straddles and self.backend == 'cuda':
            return 2 * self.hidden // self.block_k
        return self.hidden // self.block_k

    @property
    def num_blocks(self) -> int:
        """Scale blocks of one half row (0 without the cast; whole blocks only, see `straddles`)."""
        return self.hidden // self.block_size if self.cast else 0

    @property
    def row_blocks(self) -> int:
        """Scale blocks of the 2 H row (0 without the cast)."""
        return 2 * self.hidden // self.block_size if self.cast else 0

    @property
    def groups_per_tile(self) -> int:
        """Scale blocks of one half tile (straddling blocks, CUDA: of a tile of the 2 H row)."""
        return self.block_k // self.block_size if self.cast else 0

    @property
    def sf_dtype(self) -> str:
        """The cast's scales as the kernels write them: fp32, or UE8M0 bytes."""
        return 'uint8' if self.packed_ue8m0 else 'float32'

    @property
    def sf_cols(self) -> int:
        """Scale elements of one row of x_grad (fp32 scales, or UE8M0 bytes to a whole word: straddling blocks,
        an odd number of them, end in zero bytes)."""
        pack = UE8M0_PACK if self.packed_ue8m0 else 1
        return -(-self.row_blocks // pack) * pack

    @property
    def sf_padding(self) -> int:
        """Zero UE8M0 bytes after the last scale of a row."""
        return self.sf_cols - self.row_blocks


def check_straddling_tiles(cfg: MoeSwigluBackwardConfig) -> None:
    """The tiles of a configuration with straddling blocks (ValueError): H a multiple of 64; Ascend the row, one task
    (H <= _ASCEND_MAX_STRADDLING_HIDDEN); CUDA whole blocks of the 2 H row dividing it."""
    if cfg.hidden <= 0 or cfg.hidden % CAST_HIDDEN_UNIT:
        raise ValueError(f'hidden must be a positive multiple of {CAST_HIDDEN_UNIT}, got {cfg.hidden}')
    if cfg.backend == 'ascend':
        if cfg.hidden > _ASCEND_MAX_STRADDLING_HIDDEN:
            raise ValueError(
                f'Ascend: a scale block across the two halves (hidden {cfg.hidden}, not a multiple of '
                f'{cfg.block_size}) needs the row in one task: hidden <= {_ASCEND_MAX_STRADDLING_HIDDEN}'
            )
        if cfg.block_k != cfg.hidden:
            raise ValueError(f'block_k {cfg.block_k}: the row (hidden {cfg.hidden}) for blocks across the halves')
    elif cfg.block_k % cfg.block_size or 2 * cfg.hidden % cfg.block_k:
        raise ValueError(f'block_k {cfg.block_k}: whole blocks of {cfg.block_size} dividing 2 * hidden '
                         f'{2 * cfg.hidden} for blocks across the halves')  # fmt: skip


def choose_moe_swiglu_backward_config(
    *,
    backend: Backend,
    num_cores: int,
    hidden: int,
    x_dtype: torch.dtype | str,
    grad_dtype: torch.dtype | str,
    out_dtype: torch.dtype | str,
    num_experts: int = 0,
    with_weight: bool = False,
    use_clamp: bool = False,
    do_recompute: bool = False,
    block_size: int = 0,
    round_sf: bool = False,
    packed_ue8m0: bool = False,
    col_major_sf: bool = False,
) -> MoeSwigluBackwardConfig:
    """Pure choice of the compile-time parameters (no device query); dtypes as torch dtypes or TileLang names.
    `col_major_sf`: the cast's scales column-major (on Ascend with packed UE8M0: tiles of whole words). Invalid
    combinations raise ValueError."""
    names = []
    for what, dtype in (('x_dtype', x_dtype), ('grad_dtype', grad_dtype), ('out_dtype', out_dtype)):
        name = DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, torch.dtype) else dtype
        if name not in DTYPE_NAMES.values():
            raise ValueError(f'{what} must be one of {list(DTYPE_NAMES)}, got {dtype!r}')
        names.append(name)
    straddles = blocks_straddle(hidden, block_size)
    unit = CAST_HIDDEN_UNIT if straddles else hidden_multiple(block_size)  # a block across the halves: 2 H whole blocks
    if hidden <= 0 or hidden % unit:
        raise ValueError(f'hidden must be a positive multiple of {unit}, got {hidden}')
    make = functools.partial(
        MoeSwigluBackwardConfig, backend, hidden, *names, num_experts, with_weight, use_clamp, do_recompute,
        block_size, round_sf, packed_ue8m0, num_cores, col_major_sf=col_major_sf,
    )  # fmt: skip
    if straddles and backend == 'ascend':
        return make(block_k=hidden, threads=0, num_stages=2)  # the row, one task (check_straddling_tiles)
    if straddles and backend == 'cuda':
        # Tiles of whole blocks of the 2 H row (every block's maximum within one tile), threads as below.
        block_k = divisors(2 * hidden, block_size, _CUDA_MAX_BLOCK_K)[0]
        threads = _WARP * math.gcd(block_k // HIDDEN_UNIT, _CUDA_THREADS // _WARP)
        return make(block_k=block_k, threads=threads, num_stages=1)
    if backend == 'ascend':
        # The longest tile that fits the UB: each task streams whole rows, fewer and longer DMAs per core.
        # Column-major UE8M0 words go out one burst each: tiles of whole words where the half row holds whole words.
        words = col_major_sf and packed_ue8m0 and block_size and (hidden // block_size) % UE8M0_PACK == 0
        tile = UE8M0_PACK * block_size if words else unit
        return make(block_k=divisors(hidden, tile, _ASCEND_MAX_BLOCK_K)[0], threads=0, num_stages=2)
    if backend == 'cuda':
        # One block per token; each thread owns block_k / threads channels of each half per tile (8 with 128
        # threads and 1024-channel tiles). A tile of 64 m channels takes 32 gcd(m, 4) threads: a whole number of
        # channels each.
        block_k = divisors(hidden, unit, _CUDA_MAX_BLOCK_K)[0]
        threads = _WARP * math.gcd(block_k // HIDDEN_UNIT, _CUDA_THREADS // _WARP)
        return make(block_k=block_k, threads=threads, num_stages=1)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_moe_swiglu_backward_kernel(cfg: MoeSwigluBackwardConfig):
    """The TileLang prim_func `moe_swiglu_backward_kernel` for `cfg.backend` (no compile), whose arguments are

        x (T, 2 H) cfg.x_dtype, x_sf (T, 2 H / block_size) fp32, act_x_grad (T, H) cfg.grad_dtype,
        topk_weights (T,) fp32, psum (E,) int32, x_grad (T, 2 H) cfg.out_dtype, weight_grad (T,) fp32,
        act_out (T, H) cfg.out_dtype, x_grad_fp8 (T, 2 H) float8_e4m3fn, x_grad_sf (T, cfg.sf_cols) cfg.sf_dtype
        (cfg.col_major_sf: the transposed view (cfg.sf_cols, T) of row stride S >= T; packed UE8M0 bytes
        (sf_cols / 4, 4 T) of row stride 4 S), routed_scaling_factor, clamp_value (fp32 scalars)

    where an argument the configuration does not use is any tensor of one element and that dtype. T >= 1.
    """
    if cfg.backend == 'ascend':
        return ascend_moe_swiglu_backward_kernel(cfg)
    return cuda_moe_swiglu_backward_kernel(cfg)


@functools.cache
def get_moe_swiglu_backward_kernel(cfg: MoeSwigluBackwardConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_moe_swiglu_backward_kernel(cfg), cfg.backend)
