"""What the norm domain's operators and kernels share: the hidden-size contract, the Ascend UB budget, the CUDA
row layout, the placeholders the kernels take for an absent optional tensor, and strided rows (the rule the
interfaces check is validation.check_row_starts; the kernels' stride symbols).

Imported by the kernel modules and the backend bodies alike (it imports neither: no import circle).
"""

from __future__ import annotations

import torch

from cann_ops_tilelang.kernel_target import placeholder
from cann_ops_tilelang.quant._contract import check_numel
from cann_ops_tilelang.validation import is_strided

HIDDEN_MULTIPLE = 64  # one 64-lane fp32 Ascend register; CUDA 16-byte chunks never straddle a row
MAX_HIDDEN = 16384  # a whole row stays on chip (Ascend UB, CUDA registers)
LANES = 64  # fp32 lanes of one 256-byte Ascend vector register
ASCEND_UB_BUDGET = 240 * 1024  # of the 248 KiB UB: a margin for the small buffers and their 32-byte padding
CUDA_CHUNK_BYTES = 16  # one vectorised global access per thread and chunk
DTYPE_BYTES = {'bfloat16': 2, 'float32': 4}


def check_hidden(name: str, T: int, H: int) -> None:
    """The kernels take whole 64-element registers of a row that fits on chip, and int32 element indices."""
    if H <= 0 or H % HIDDEN_MULTIPLE or H > MAX_HIDDEN:
        raise ValueError(
            f'{name}: hidden size must be a positive multiple of {HIDDEN_MULTIPLE} up to {MAX_HIDDEN}, got {H}'
        )
    check_numel(name, T, H)


def any_strided(*tensors) -> bool:
    """Whether a call takes the kernels of strided rows: some row tensor it reads or writes is strided."""
    return any(is_strided(t) for t in tensors)


def row_strides(T, cfg, names) -> dict:
    """The kernels' row-stride symbols, `<name>_stride` for each present row tensor `names` of a config with
    `strided_rows` (launch arguments: one kernel for every stride); {} for contiguous rows."""
    return {n: T.dynamic(f'{n}_stride') for n in names} if cfg.strided_rows else {}


def row_tensor(T, shape, dtype, strides: dict, name: str):
    """The annotation of row tensor `name`: strided by its symbol where `strides` has one, else contiguous."""
    if name in strides:
        return T.StridedTensor(shape, (strides[name], 1), dtype)
    return T.Tensor(shape, dtype)


def cuda_assume_strides(T, strides: dict, vec: int) -> None:
    """Inside a CUDA kernel: each row stride a multiple of `vec` elements (16 bytes, which the interfaces check), so
    that the row accesses keep their 16-byte vectors."""
    for stride in strides.values():
        T.evaluate(T.assume(stride % vec == 0))


def ascend_stages(name: str, per_stage: int, resident: int) -> int:
    """Buffer versions of an Ascend kernel whose task buffers take `per_stage` bytes and whose resident buffers
    `resident`: 2 (the next row's DMA overlaps this row's vector work) where they fit ASCEND_UB_BUDGET, else 1."""
    for stages in (2, 1):
        if stages * per_stage + resident <= ASCEND_UB_BUDGET:
            return stages
    raise ValueError(
        f'{name}: on Ascend a row of this size and these options needs {per_stage + resident} bytes of UB, '
        f'more than the {ASCEND_UB_BUDGET} the kernel may use'
    )


def cuda_row_layout(hidden: int, dtype: str, max_chunks: int) -> tuple[int, int, int]:
    """(threads, chunks per thread, elements per chunk) of a row handled by one CUDA thread block: 16-byte
    chunks, chunk k of the row with thread k % threads, at most `max_chunks` per thread, threads a multiple of
    32 (whole warps) up to 1024."""
    vec = CUDA_CHUNK_BYTES // DTYPE_BYTES[dtype]
    total = hidden // vec
    fewest = -(-total // max_chunks)  # threads that keep every thread at or under max_chunks
    threads = min(1024, max(32, -(-fewest // 32) * 32))
    return threads, -(-total // threads), vec


def forward_launch_args(x, weight, residual, residual_out, out, rstd, data, sf, out_bf16, eps, out_scale) -> tuple:
    """The arguments of norm_forward_kernel (norm_forward_kernel.forward_prim_func), placeholders for None."""
    device, dtype = x.device, x.dtype
    return (
        x,
        placeholder(device, dtype) if weight is None else weight,
        placeholder(device, dtype) if residual is None else residual,
        placeholder(device, dtype) if residual is None else residual_out,
        placeholder(device, dtype) if out is None else out,
        placeholder(device, torch.float32) if rstd is None else rstd,
        placeholder(device, torch.float8_e4m3fn) if data is None else data,
        placeholder(device, torch.float32) if sf is None else sf,
        placeholder(device, torch.bfloat16) if out_bf16 is None else out_bf16,
        float(eps),
        float(out_scale),
    )


def check_same_dtype(name: str, x: torch.Tensor, **tensors) -> None:
    """TileKernels' rule: weight, residual and their buffers have x's dtype."""
    for what, tensor in tensors.items():
        if tensor is not None and tensor.dtype != x.dtype:
            raise TypeError(f'{name}: {what} must have the dtype of x ({x.dtype}), got {tensor.dtype}')
