"""Kernels of norm_backward: the gradients of norm_forward's RMSNorm, two kernels per backend.

Per token t (fp32, TileKernels 2.1.0's grouping; x is norm_forward's norm_input, rstd its saved rstd):

    xhat = x * rstd, g = out_grad * out_scale, gw = g * w (g without weight)
    x_grad = (gw - xhat * sum(xhat * gw) / H) * rstd (+ residual_out_grad), rounded to x's dtype
    weight_grad (+)= sum over t of xhat * g

Stage 'rows' (`norm_backward_kernel`) writes x_grad and, with a weight, one fp32 partial weight gradient per
persistent worker (an Ascend vector core or a CUDA thread block), summed over the rows that worker owns in row
order. Stage 'reduce' (`norm_weight_grad_reduce_kernel`) sums the partials of each column in worker order and adds
the sum to weight_grad (or writes it). No atomics: the same call gives the same bits on every run.

Rows: contiguous, or (`strided_rows`, TileKernels takes strided rows) x, out_grad and residual_out_grad each rows
of a runtime stride (launch arguments, each row starting on 16 bytes: the interface checks it); x_grad, which the
interface allocates, stays contiguous.

Ascend in _norm_backward_ascend.py, CUDA in _norm_backward_cuda.py.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel
from cann_ops_tilelang.quant._tiling import FLOAT_DTYPE_NAMES, divisors

# The backend bodies (they do not import this module: no import circle).
from ._norm_backward_ascend import ascend_norm_backward_kernel
from ._norm_backward_cuda import REDUCE_THREADS, cuda_norm_backward_kernel
from ._norm_common import (
    ASCEND_UB_BUDGET,
    DTYPE_BYTES,
    HIDDEN_MULTIPLE,
    LANES,
    MAX_HIDDEN,
    ascend_stages,
    cuda_row_layout,
    row_strides,
    row_tensor,
)
from ._norm_forward_ascend import WEIGHT_TILE

STAGES = ('rows', 'reduce')
_CUDA_MAX_CHUNKS = 4  # 16-byte chunks per thread and input
_CUDA_THREADS_PER_SM = 512  # persistent blocks per SM = this / (threads * rows_in_flight): rows in flight, few partials
# rows_in_flight 2 holds two rows, the weight and the partial in up to 255 registers a thread: an SM's registers
# hold that for blocks of up to this many threads (wider blocks would spill).
_CUDA_TWO_ROWS_MAX_THREADS = 256
_CUDA_ROWS_IN_FLIGHT = 2  # the default where two rows fit (measured faster, docs/norm.md)


@dataclasses.dataclass(frozen=True)
class NormBackwardConfig:
    backend: Backend
    hidden: int
    dtype: str  # x, out_grad, weight, residual_out_grad, x_grad: 'bfloat16' or 'float32'
    num_cores: int  # Ascend: vector cores; CUDA: SMs
    with_weight: bool
    with_residual_out_grad: bool
    stage: str = 'rows'  # STAGES
    weight_grad_dtype: str = 'float32'  # stage 'reduce': the dtype of weight_grad
    accumulate: bool = False  # stage 'reduce': add to weight_grad (else write it)
    num_partials: int = 1  # persistent workers of stage 'rows', rows of the partial weight gradients
    threads: int = 0  # CUDA threads per block (a row)
    chunks: int = 0  # CUDA 16-byte chunks per thread
    num_stages: int = 1  # Ascend buffer versions of the row loop
    rows_in_flight: int = 1  # CUDA stage 'rows': 2 loads the next row while this one is reduced and written
    pieces: int = 1  # Ascend stage 'rows': column pieces a row's buffers hold at a time (more where a row overflows UB)
    # Stage 'rows': x, out_grad and residual_out_grad (`row_tensors`) rows of runtime strides, one a tensor, each
    # starting on 16 bytes (TileKernels takes strided rows); False: contiguous rows, no stride arguments.
    strided_rows: bool = False
    # CUDA schedule fields, off in every chosen configuration (docs/norm.md, "norm_backward at H 4096"):
    # stage 'rows': row groups per block, each `threads` threads on its own rows, one partial per block (the
    # groups' sum in group order), so half the partials for the same threads per SM; a different grouping of the
    # weight gradient's sum (x_grad's bits unchanged).
    row_groups: int = 1
    # stage 'reduce': partial rows whose loads a thread issues at once (a divisor of num_partials; 0: the largest
    # of 1, 2, 4, 8 that divides it); the adds stay in block order, so the same bits.
    reduce_loads: int = 0
    # stage 'rows' with a weight: after a grid barrier (a cooperative launch: every block resident, which the
    # chooser's blocks are), the blocks sum the partials into weight_grad as the stage 'reduce' does (same order,
    # same bits; weight_grad_dtype, accumulate and reduce_loads as there), so no second kernel. The kernel takes
    # weight_grad after out_scale.
    fused_reduce: bool = False

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.dtype not in DTYPE_BYTES or self.weight_grad_dtype not in DTYPE_BYTES:
            raise ValueError(f'dtypes must be among {sorted(DTYPE_BYTES)}, got {self.dtype}, {self.weight_grad_dtype}')
        if self.hidden <= 0 or self.hidden % HIDDEN_MULTIPLE or self.hidden > MAX_HIDDEN:
            raise ValueError(f'hidden must be a positive multiple of {HIDDEN_MULTIPLE} up to {MAX_HIDDEN}')
        if self.stage not in STAGES:
            raise ValueError(f'stage must be one of {STAGES}, got {self.stage!r}')
        if self.stage == 'reduce' and not self.with_weight:
            raise ValueError('stage "reduce" sums weight gradients: it needs with_weight')
        if self.num_partials < 1 or self.num_stages not in (1, 2):
            raise ValueError(f'num_partials {self.num_partials} must be >= 1, num_stages 1 or 2')
        if self.backend == 'cuda' and (self.threads % 32 or not 32 <= self.threads <= 1024 or self.chunks < 1):
            raise ValueError(f'CUDA: threads {self.threads} must be whole warps up to 1024, chunks >= 1')
        if self.pieces < 1 or self.hidden % (self.pieces * LANES) or (self.pieces > 1 and (
                self.backend != 'ascend' or self.stage != 'rows')):  # fmt: skip
            raise ValueError(
                f'pieces {self.pieces} must divide the row into multiples of {LANES} columns, and more than '
                f'one is for the Ascend stage "rows"'
            )
        if self.rows_in_flight not in (1, 2):
            raise ValueError(f'rows_in_flight must be 1 or 2, got {self.rows_in_flight}')
        if self.rows_in_flight == 2 and (
            self.backend != 'cuda' or self.stage != 'rows' or self.threads > _CUDA_TWO_ROWS_MAX_THREADS
        ):
            raise ValueError(
                f'rows_in_flight 2 is for the CUDA stage "rows" with up to {_CUDA_TWO_ROWS_MAX_THREADS} threads, '
                f'got backend {self.backend!r}, stage {self.stage!r}, threads {self.threads}'
            )
        wide_groups = 2 * self.threads > _CUDA_TWO_ROWS_MAX_THREADS  # two groups' registers exceed an SM's
        if self.row_groups not in (1, 2) or (
            self.row_groups == 2 and (self.backend != 'cuda' or self.stage != 'rows' or wide_groups)
        ):
            raise ValueError(
                f'row_groups must be 1, or 2 for the CUDA stage "rows" with up to '
                f'{_CUDA_TWO_ROWS_MAX_THREADS // 2} threads a group, got {self.row_groups} ({self.backend!r}, '
                f'stage {self.stage!r}, threads {self.threads})'
            )
        if self.fused_reduce and (self.backend != 'cuda' or self.stage != 'rows' or not self.with_weight):
            raise ValueError('fused_reduce is for the CUDA stage "rows" with a weight')
        if self.reduce_loads and (self.backend != 'cuda' or not (self.stage == 'reduce' or self.fused_reduce)
                                  or self.reduce_loads < 0 or self.num_partials % self.reduce_loads):  # fmt: skip
            raise ValueError(
                f'reduce_loads {self.reduce_loads} must divide num_partials {self.num_partials} (the CUDA stage '
                f'"reduce" or fused_reduce), or be 0'
            )
        if self.strided_rows and self.stage != 'rows':
            raise ValueError('strided_rows is an option of the stage "rows" (the partials are contiguous)')

    @property
    def row_tensors(self) -> tuple[str, ...]:
        """Stage 'rows': the row tensors the call gives, strided with `strided_rows` (x_grad stays contiguous)."""
        return ('x', 'out_grad', *(('residual_out_grad',) if self.with_residual_out_grad else ()))


def ascend_ub_bytes(
    *, hidden: int, dtype: str, with_weight: bool, with_residual_out_grad: bool, pieces: int = 1
) -> tuple[int, int]:
    """(bytes per buffer version, resident bytes) of the Ascend row kernel: a piece (hidden / pieces columns) of
    x, out_grad (then x_grad) and residual_out_grad, rstd; the fp32 weight, its staging tile and the partial weight
    gradient (whole rows), and with pieces the sum of a row's first pass (one register)."""
    piece = hidden // pieces * DTYPE_BYTES[dtype]
    per_stage = piece * (3 if with_residual_out_grad else 2) + 32
    resident = (2 * hidden * 4 + WEIGHT_TILE * DTYPE_BYTES[dtype]) if with_weight else 0
    return per_stage, resident + (LANES * 4 if pieces > 1 else 0)


def _ascend_pieces(name: str, hidden: int, dtype: str, with_weight: bool, with_rog: bool) -> tuple[int, int]:
    """(pieces, buffer versions) of the Ascend row kernel: whole rows where they fit UB, else the fewest pieces
    that do (a row is then read twice, once per pass); ValueError where none fits."""
    for pieces in (p for p in range(1, hidden // LANES + 1) if hidden % (p * LANES) == 0):
        per_stage, resident = ascend_ub_bytes(
            hidden=hidden, dtype=dtype, with_weight=with_weight, with_residual_out_grad=with_rog, pieces=pieces
        )
        if per_stage + resident <= ASCEND_UB_BUDGET:
            return pieces, ascend_stages(name, per_stage, resident)
    return 1, ascend_stages(name, *ascend_ub_bytes(hidden=hidden, dtype=dtype, with_weight=with_weight,
                                                    with_residual_out_grad=with_rog))  # fmt: skip


def choose_norm_backward_config(
    *,
    backend: Backend,
    num_cores: int,
    hidden: int,
    dtype: torch.dtype | str,
    with_weight: bool,
    with_residual_out_grad: bool,
    stage: str = 'rows',
    weight_grad_dtype: torch.dtype | str = torch.float32,
    accumulate: bool = False,
    rows_in_flight: int | None = None,
    strided_rows: bool = False,
) -> NormBackwardConfig:
    """Pure choice of the compile-time parameters (no device query); ValueError for what the kernels do not take
    (on Ascend: a row whose buffers do not fit UB). CUDA: `rows_in_flight` None takes the default where two rows
    fit, else 1; it sets the persistent blocks, so the stage 'reduce' of the same call takes the same value.
    `strided_rows` is the stage 'rows' option (the stage 'reduce' drops it)."""
    if dtype not in FLOAT_DTYPE_NAMES or weight_grad_dtype not in FLOAT_DTYPE_NAMES:
        raise ValueError(f'dtypes must be torch.bfloat16 or torch.float32, got {dtype!r}, {weight_grad_dtype!r}')
    name = FLOAT_DTYPE_NAMES[dtype]
    make = functools.partial(
        NormBackwardConfig, backend, hidden, name, num_cores, with_weight, with_residual_out_grad, stage,
        FLOAT_DTYPE_NAMES[weight_grad_dtype] if stage == 'reduce' else 'float32', accumulate and stage == 'reduce',
        strided_rows=strided_rows and stage == 'rows',
    )  # fmt: skip
    if backend == 'ascend':
        if stage == 'reduce':
            return make(num_partials=num_cores)
        pieces, num_stages = _ascend_pieces('norm_backward', hidden, name, with_weight, with_residual_out_grad)
        return make(num_partials=num_cores, num_stages=num_stages, rows_in_flight=rows_in_flight or 1, pieces=pieces)
    if backend == 'cuda':
        threads, chunks, _ = cuda_row_layout(hidden, name, _CUDA_MAX_CHUNKS)
        if rows_in_flight is None:
            rows_in_flight = _CUDA_ROWS_IN_FLIGHT if threads <= _CUDA_TWO_ROWS_MAX_THREADS else 1
        partials = num_cores * max(1, _CUDA_THREADS_PER_SM // (threads * rows_in_flight))
        if stage == 'reduce':
            # One column per thread; a block's columns divide the row.
            return make(num_partials=partials, threads=divisors(hidden, HIDDEN_MULTIPLE, REDUCE_THREADS)[0], chunks=1)
        return make(num_partials=partials, threads=threads, chunks=chunks, rows_in_flight=rows_in_flight)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def backward_prim_func(T, cfg: NormBackwardConfig, body, strides: dict | None = None):
    """Stage 'rows': `norm_backward_kernel(x, weight, out_grad, rstd, residual_out_grad, x_grad, partials,
    out_scale)`, weight and partials (num_partials, H) fp32 (1,) placeholders without with_weight,
    residual_out_grad one without it; with fused_reduce `norm_backward_fused_kernel(..., out_scale, weight_grad)`.
    Stage 'reduce': `norm_weight_grad_reduce_kernel(partials, weight_grad)`.
    `body` is the backend's macro of the same arguments (then num_tokens for 'rows'). `strides`: the row-stride
    symbols of the row tensors (`backward_row_strides`), None: made here."""
    hidden, dtype = cfg.hidden, cfg.dtype
    partial_shape = (cfg.num_partials, hidden) if cfg.with_weight else (1,)
    if cfg.stage == 'reduce':

        @T.prim_func
        def norm_weight_grad_reduce_kernel(
            partials: T.Tensor(partial_shape, T.float32),
            weight_grad: T.Tensor((hidden,), cfg.weight_grad_dtype),
        ):
            body(partials, weight_grad)

        return norm_weight_grad_reduce_kernel

    if strides is None:
        strides = backward_row_strides(T, cfg)
    rows = functools.partial(row_tensor, T, strides=strides)
    num_tokens = T.dynamic('num_tokens')
    row = (num_tokens, hidden)
    w_shape = (hidden,) if cfg.with_weight else (1,)
    rog_shape = row if cfg.with_residual_out_grad else (1,)

    if cfg.fused_reduce:  # (the builder runs a prim_func's body where it is defined)

        @T.prim_func
        def norm_backward_fused_kernel(
            x: rows(row, dtype, name='x'),
            weight: T.Tensor(w_shape, dtype),
            out_grad: rows(row, dtype, name='out_grad'),
            rstd: T.Tensor((num_tokens,), T.float32),
            residual_out_grad: rows(rog_shape, dtype, name='residual_out_grad'),
            x_grad: T.Tensor(row, dtype),
            partials: T.Tensor(partial_shape, T.float32),
            out_scale: T.float32,
            weight_grad: T.Tensor((hidden,), cfg.weight_grad_dtype),
        ):
            body(x, weight, out_grad, rstd, residual_out_grad, x_grad, partials, out_scale, num_tokens, weight_grad)

        return norm_backward_fused_kernel

    @T.prim_func
    def norm_backward_kernel(
        x: rows(row, dtype, name='x'),
        weight: T.Tensor(w_shape, dtype),
        out_grad: rows(row, dtype, name='out_grad'),
        rstd: T.Tensor((num_tokens,), T.float32),
        residual_out_grad: rows(rog_shape, dtype, name='residual_out_grad'),
        x_grad: T.Tensor(row, dtype),
        partials: T.Tensor(partial_shape, T.float32),
        out_scale: T.float32,
    ):
        body(x, weight, out_grad, rstd, residual_out_grad, x_grad, partials, out_scale, num_tokens)

    return norm_backward_kernel


def backward_row_strides(T, cfg: NormBackwardConfig) -> dict:
    """The row-stride symbols of cfg's row tensors, by name ({} without strided_rows)."""
    return row_strides(T, cfg, cfg.row_tensors)


def make_norm_backward_kernel(cfg: NormBackwardConfig):
    """The TileLang prim_func of `cfg.stage` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_norm_backward_kernel(cfg, backward_prim_func)
    return cuda_norm_backward_kernel(cfg, backward_prim_func)


@functools.cache
def get_norm_backward_kernel(cfg: NormBackwardConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_norm_backward_kernel(cfg), cfg.backend)
