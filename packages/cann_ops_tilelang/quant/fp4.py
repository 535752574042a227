"""FP4 (e2m1) helpers: decoding the packed bytes that TileKernels' FP4 casts write (the domain's own FP4 casts are
not written yet)."""

from __future__ import annotations

import torch

# The 16 e2m1 codes s|ee|m: exponent bias 1, one mantissa bit, no inf or NaN (OCP MX: 0, 0.5, 1, 1.5, 2, 3, 4, 6)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_PACKED_DTYPES = (torch.int8, torch.uint8)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed FP4: each byte of x (..., K) holds two e2m1 values, the low nibble first, giving (..., 2 K) of
    `out_dtype` (TileKernels 2.1.0's helper, for checking FP4 data). Plain PyTorch on x's device, exact: every
    e2m1 value is a bf16 / fp16 / fp32 value; -0.0 keeps its sign."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f'x must be a torch.Tensor, got {type(x).__name__}')
    if x.dtype not in _PACKED_DTYPES:
        raise TypeError(f'x must have dtype torch.int8 or torch.uint8 (two e2m1 codes a byte), got {x.dtype}')
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(f'out_dtype must be a floating-point torch.dtype, got {out_dtype!r}')
    if x.dim() == 0:
        raise ValueError('x must have at least 1 dimension (its last one doubles), got a 0-d tensor')
    table = torch.tensor(E2M1_VALUES, dtype=out_dtype, device=x.device)
    codes = x.view(torch.uint8).to(torch.int64) if x.dtype == torch.int8 else x.to(torch.int64)
    pairs = torch.stack((table[codes & 0x0F], table[codes >> 4]), dim=-1)
    return pairs.reshape(*x.shape[:-1], 2 * x.shape[-1])
