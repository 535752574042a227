"""Float64 reference of apply_rotary: the rotation as a complex multiplication (tests only; the package never
imports it)."""

from __future__ import annotations

import torch


def cache_rows(
    tokens: tuple[int, ...], seqlen_ro: int, positions: torch.Tensor | None, seqlen_offset: int
) -> torch.Tensor:
    """The cos_sin_cache row of every token (shape `tokens`, int64): positions + seqlen_offset clamped into the
    cache, or, without positions, seqlen_offset + the token's index in its sequence (the last token dimension)."""
    if positions is None:
        return (torch.arange(tokens[-1], dtype=torch.int64) + seqlen_offset).expand(tokens)
    return (positions.cpu().to(torch.int64) + seqlen_offset).clamp(0, seqlen_ro - 1)


def apply_rotary_ref(
    x: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor | None = None,
    seqlen_offset: int = 0,
    interleaved: bool = False,
    conjugate: bool = False,
) -> torch.Tensor:
    """x (..., heads, rot_dim) rotated, in float64 on the CPU: each pair (x1, x2) as the complex number x1 + i x2,
    multiplied by cos + i sin of its token's cache row (cos - i sin with conjugate). NeoX pairs (x[j],
    x[j + rot_dim / 2]), or interleaved GPT-J pairs (x[2j], x[2j + 1])."""
    xd = x.detach().cpu().to(torch.float64)
    half = cos_sin_cache.shape[1] // 2
    rows = cache_rows(tuple(x.shape[:-2]), cos_sin_cache.shape[0], positions, seqlen_offset)
    cs = cos_sin_cache.detach().cpu().to(torch.float64)[rows]  # (..., rot_dim)
    angle = torch.complex(cs[..., :half], cs[..., half:]).unsqueeze(-2)  # one per token, for every head
    if conjugate:
        angle = angle.conj()
    if interleaved:
        z = torch.complex(xd[..., 0::2], xd[..., 1::2]) * angle
        return torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    z = torch.complex(xd[..., :half], xd[..., half:]) * angle
    return torch.cat((z.real, z.imag), dim=-1)


def rotation_tolerance(x: torch.Tensor, dtype: torch.dtype, interleaved: bool) -> torch.Tensor:
    """Per element of x's rotated value, the error the kernels may have against the float64 result: fp32 products
    and a fused multiply-add (a few fp32 ulps of |x1| + |x2|), then one rounding to `dtype` (half an ulp of the
    result, at most |x1| + |x2| for |cos|, |sin| <= 1): eps(dtype) * (|x1| + |x2|) covers both, and a wrong pair,
    angle or sign is off by the size of x itself."""
    xd = x.detach().cpu().to(torch.float64).abs()
    half = x.shape[-1] // 2
    if interleaved:
        pair = xd[..., 0::2] + xd[..., 1::2]
        magnitude = torch.stack((pair, pair), dim=-1).flatten(-2)
    else:
        pair = xd[..., :half] + xd[..., half:]
        magnitude = torch.cat((pair, pair), dim=-1)
    eps = torch.finfo(dtype).eps
    return eps * magnitude + torch.finfo(dtype).tiny


def make_cos_sin_cache(seqlen_ro: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The usual cache: row p holds cos(p * theta_j) then sin(p * theta_j), theta_j = base ** (-2j / rot_dim)."""
    theta = base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    angles = torch.arange(seqlen_ro, dtype=torch.float64)[:, None] * theta[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(torch.float32)
