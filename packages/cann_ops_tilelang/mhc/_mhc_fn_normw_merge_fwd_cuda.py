"""CUDA kernel of mhc_fn_normw_merge_fwd (math and config: mhc_fn_normw_merge_fwd_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.


def cuda_mhc_fn_normw_merge_fwd_kernel(cfg):
    """One thread block per (block_rows, block_cols) tile, no tails (both divide fn's shape); TileLang
    vectorises the contiguous columns to 16-byte accesses."""
    import tilelang.language as T

    rows, hidden, br, bc = cfg.rows, cfg.hidden, cfg.block_rows, cfg.block_cols
    f32 = T.float32

    @T.prim_func
    def mhc_fn_normw_merge_fwd_kernel(
        fn: T.Tensor((rows, hidden), f32),
        normw: T.Tensor((hidden,), f32),
        out_fn: T.Tensor((rows, hidden), f32),
    ):
        with T.Kernel(hidden // bc, rows // br, threads=cfg.threads) as (bx, by):
            for r, c in T.Parallel(br, bc):
                out_fn[by * br + r, bx * bc + c] = fn[by * br + r, bx * bc + c] * normw[bx * bc + c]

    return mhc_fn_normw_merge_fwd_kernel
