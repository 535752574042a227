"""Quantisation operators (FP8 casts with per-block scale factors). Kernel layer only so far: no exports yet."""
