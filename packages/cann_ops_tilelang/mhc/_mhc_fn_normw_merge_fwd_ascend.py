"""Ascend 950 kernel of mhc_fn_normw_merge_fwd (math and config: mhc_fn_normw_merge_fwd_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
from ._norm_fn_common import LANES


def ascend_mhc_fn_normw_merge_fwd_kernel(cfg):
    """A task is a column tile (rows, block_cols): fn's tile and normw's slice land in UB, each 64-lane column
    chunk of normw is loaded once and multiplies that chunk of every row, the product tile goes back to GM."""
    import tilelang.ascend.language as T

    rows, hidden, cols, cores, stages = cfg.rows, cfg.hidden, cfg.block_cols, cfg.num_cores, cfg.num_stages
    f32 = T.float32

    @T.prim_func
    def mhc_fn_normw_merge_fwd_kernel(
        fn: T.Tensor((rows, hidden), f32),
        normw: T.Tensor((hidden,), f32),
        out_fn: T.Tensor((rows, hidden), f32),
    ):
        with T.Kernel(cores) as cid:
            fn_ub = T.alloc_shared((rows, cols), f32)  # fn's tile, then the product in place
            w_ub = T.alloc_shared((cols,), f32)
            T.annotate_buffer_versions({fn_ub: stages, w_ub: stages})
            for task in T.Persistent([hidden // cols], cores, cid, group_size=1, num_stages=stages):
                c0 = task * cols
                T.copy(fn[:, c0 : c0 + cols], fn_ub)
                T.copy(normw[c0 : c0 + cols], w_ub)
                with T.SimdVF():
                    for c in T.serial(cols // LANES):
                        w = T.simd.vld(w_ub[c * LANES])
                        for r in T.serial(rows):
                            T.simd.vsts(fn_ub[r, c * LANES], T.simd.vmul(T.simd.vld(fn_ub[r, c * LANES]), w))
                T.copy(fn_ub, out_fn[:, c0 : c0 + cols])

    return mhc_fn_normw_merge_fwd_kernel
