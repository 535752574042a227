"""Pure-PyTorch oracle of engram_hash (docs/engram.md). Tests only; never imported at run time."""

from __future__ import annotations

import torch


def engram_hash_ref(
    ngram_token_ids: torch.Tensor,
    multipliers: torch.Tensor,
    vocab_sizes: torch.Tensor,
    offsets: torch.Tensor,
    image_token_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """(L, T, (N-1)*E) int32. int64 products wrap (two's complement); `%` takes the sign of the divisor.
    Every row of an image token (image_token_mask True) is -1."""
    max_ngram = multipliers.shape[1]
    ids = ngram_token_ids.long()  # (T, N)
    products = ids.unsqueeze(0) * multipliers.unsqueeze(1)  # (L, T, N), wrapping int64 multiply
    rows = []
    h = products[..., 0]
    for n in range(2, max_ngram + 1):
        h = h ^ products[..., n - 1]  # (L, T): hash of order n
        vocab = vocab_sizes[:, n - 2, :].long().unsqueeze(1)  # (L, 1, E)
        rows.append(h.unsqueeze(-1) % vocab)  # (L, T, E)
    rows = torch.cat(rows, dim=-1) + offsets.long().unsqueeze(1)  # (L, T, (N-1)*E) int64
    rows = rows.to(torch.int32)  # wraps modulo 2**32, like the kernels
    if image_token_mask is not None:
        rows = rows.masked_fill(image_token_mask.to(rows.device).view(1, -1, 1), -1)
    return rows
