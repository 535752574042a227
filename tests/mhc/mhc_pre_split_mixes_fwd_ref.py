"""PyTorch reference of mhc_pre_split_mixes_fwd (the oracle of its tests; never imported by runtime code)."""

import torch


def mhc_pre_split_mixes_fwd_ref(
    input_mixes: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    mhc_mult: int,
    mhc_post_mult_value: float,
    mhc_pre_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre (T, M), post (T, M), comb (T, M * M)) in float64 from input_mixes (T, M * (M + 2)): each column
    scaled by its segment's entry of mhc_scale (3,) and shifted by mhc_base. Differentiable."""
    m = mhc_mult
    scale = torch.cat([mhc_scale[0:1].double().expand(m), mhc_scale[1:2].double().expand(m),
                       mhc_scale[2:3].double().expand(m * m)])  # fmt: skip
    z = input_mixes.double() * scale + mhc_base.double()
    pre = torch.sigmoid(z[:, :m]) + mhc_pre_eps
    post = torch.sigmoid(z[:, m : 2 * m]) * mhc_post_mult_value
    return pre, post, z[:, 2 * m :]
