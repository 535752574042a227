"""Shape limits shared by the Engram operators (shared/docs/engram.md, "Shapes to support")."""

from __future__ import annotations

MAX_HC = 8
HIDDEN_ALIGN = 64
MAX_HIDDEN = 16384


def check_hc_hidden(name: str, hc: int, hidden: int) -> None:
    """hc in 1..8 and hidden a multiple of 64 in 64..16384, else ValueError naming the constraint."""
    if not 1 <= hc <= MAX_HC:
        raise ValueError(f'{name}: hc (number of hyper-connection branches) must be in 1..{MAX_HC}, got {hc}')
    if hidden <= 0 or hidden % HIDDEN_ALIGN != 0 or hidden > MAX_HIDDEN:
        raise ValueError(
            f'{name}: hidden size must be a positive multiple of {HIDDEN_ALIGN} up to {MAX_HIDDEN}, got {hidden}'
        )
