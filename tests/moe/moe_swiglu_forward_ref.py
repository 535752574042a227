"""PyTorch reference of moe_swiglu_forward (and of moe_swiglu_forward_and_per_token_cast's values): the correctness
oracle of their tests, in float64 (bf16 / fp32 inputs are exact there), never imported by runtime code. The fused
cast's bytes are checked against per_token_cast of moe_swiglu_forward's fp32 result
(test_moe_swiglu_forward_and_per_token_cast.py)."""

import torch

# The kernels' rows per expert block (TileKernels' default token alignment), written here again: the oracle does not
# import the package.
TOKEN_ALIGNMENT = 128


def expert_rows_ref(num_tokens: int, psum: torch.Tensor | None, alignment: int = TOKEN_ALIGNMENT) -> torch.Tensor:
    """(T,) bool: the rows that belong to an expert; expert e owns [align(psum[e - 1]), psum[e]), psum[-1] = 0."""
    rows = torch.zeros(num_tokens, dtype=torch.bool)
    if psum is None:
        rows[:] = True
        return rows
    begin = 0
    for end in psum.cpu().tolist():
        start = -(-begin // alignment) * alignment
        if end > start:
            rows[start:end] = True
        begin = end
    return rows


def moe_swiglu_forward_ref(
    x: torch.Tensor,
    psum: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    routed_scaling_factor: float | None = None,
    clamp_value: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y (T, I) float64, counts (4,) int64) of x (T, 2 I): y = silu(gate) * up * w on the expert rows (gate, up
    clamped first with clamp_value), 0 on padding rows; w = fp32(topk_weights * routed_scaling_factor) (the
    kernels' product); counts: gate > c, up > c, up < -c on the expert rows, and their element count."""
    num_tokens, width = x.shape
    hidden = width // 2
    rows = expert_rows_ref(num_tokens, psum)
    x64 = x.cpu().double()
    gate, up = x64[:, :hidden], x64[:, hidden:]
    counts = torch.zeros(4, dtype=torch.int64)
    if clamp_value is not None:
        counts[0] = (gate > clamp_value)[rows].sum()
        counts[1] = (up > clamp_value)[rows].sum()
        counts[2] = (up < -clamp_value)[rows].sum()
        gate = gate.clamp(max=clamp_value)
        up = up.clamp(min=-clamp_value, max=clamp_value)
    counts[3] = int(rows.sum()) * hidden
    y = gate / (1.0 + torch.exp(-gate)) * up
    if topk_weights is not None:
        weights = topk_weights.cpu().float()
        if routed_scaling_factor is not None:
            weights = weights * torch.tensor(routed_scaling_factor, dtype=torch.float32)
        y = y * weights.double().unsqueeze(1)
    return torch.where(rows.unsqueeze(1), y, torch.zeros_like(y)), counts
