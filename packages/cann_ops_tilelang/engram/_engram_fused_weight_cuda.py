"""CUDA kernel of engram_fused_weight (math and config: engram_fused_weight_kernel.py).

One thread block per (branch, column block) task; each element is widened and multiplied once.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_fused_weight_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`.


def cuda_engram_fused_weight_kernel(cfg):
    """`cfg` is an EngramFusedWeightConfig (backend "cuda")."""
    import tilelang.language as T

    hc, hidden, blk = cfg.hc, cfg.hidden, cfg.block
    n_d = hidden // blk

    @T.prim_func
    def engram_fused_weight_kernel(
        weight_hidden: T.Tensor((hc, hidden), T.bfloat16),
        weight_embed: T.Tensor((hc, hidden), T.bfloat16),
        out: T.Tensor((hc, hidden), T.float32),
    ):
        with T.Kernel(cfg.num_tasks, threads=cfg.threads) as bx:
            h = bx // n_d
            d0 = (bx % n_d) * blk
            for i in T.Parallel(blk):
                out[h, d0 + i] = T.cast(weight_hidden[h, d0 + i], T.float32) * T.cast(
                    weight_embed[h, d0 + i], T.float32
                )

    return engram_fused_weight_kernel
