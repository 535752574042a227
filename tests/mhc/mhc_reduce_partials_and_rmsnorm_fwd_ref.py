"""PyTorch reference of mhc_reduce_partials_and_rmsnorm_fwd and of the split-K prenorm GEMM whose partials it
reduces: the correctness oracle of its tests (never imported by runtime code)."""

import torch


def rms_normalised_mixes(out_mul: torch.Tensor, sqrsum: torch.Tensor, rms_group_size: int, rms_eps: float):
    """out[t, j] = sum over g of out_mul[t, g, j] / sqrt(sqrsum[t, g] / rms_group_size + rms_eps), in the
    dtype of its inputs (the backward's reference takes its autograd in float64)."""
    return (out_mul * (sqrsum / rms_group_size + rms_eps).rsqrt().unsqueeze(-1)).sum(-2)


def mhc_reduce_partials_and_rmsnorm_fwd_ref(
    out_mul_splitted: torch.Tensor, sqrsum_splitted: torch.Tensor, rms_group_size: int, rms_eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out_mul, sqrsum, out) in float64: the partials summed over the splits, then the RMS step."""
    out_mul = out_mul_splitted.double().sum(0)
    sqrsum = sqrsum_splitted.double().sum(0)
    return out_mul, sqrsum, rms_normalised_mixes(out_mul, sqrsum, rms_group_size, rms_eps)


def prenorm_gemm_partials(x: torch.Tensor, fn: torch.Tensor, n_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K GEMM's partials for x (T, K) and fn (M3, K) with one RMS group: split s covers the columns
    [s * K / n_splits, (s + 1) * K / n_splits). Returns (out_mul_splitted (S, T, 1, M3), sqrsum_splitted
    (S, T, 1)), computed in float64 and rounded to fp32."""
    xs = x.double().unflatten(1, (n_splits, -1)).transpose(0, 1)  # (S, T, K / S)
    fs = fn.double().unflatten(1, (n_splits, -1)).transpose(0, 1)  # (S, M3, K / S)
    out_mul = torch.matmul(xs, fs.transpose(1, 2)).unsqueeze(2)
    sqrsum = xs.square().sum(-1, keepdim=True)
    return out_mul.float(), sqrsum.float()


def prenorm_mixes(x: torch.Tensor, fn: torch.Tensor, rms_eps: float) -> torch.Tensor:
    """The prenorm GEMM end to end in float64: (x @ fn^T) / sqrt(mean(x**2) + rms_eps) per token."""
    x64 = x.double()
    return (x64 @ fn.double().T) * (x64.square().mean(-1, keepdim=True) + rms_eps).rsqrt()
