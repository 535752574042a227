"""Ascend 950 kernel of mhc_fn_normw_merge_bwd (math, summation order and config: mhc_fn_normw_merge_bwd_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
from ._norm_fn_common import LANES


def ascend_mhc_fn_normw_merge_bwd_kernel(cfg):
    """A task is a column tile (rows, block_cols): the tiles of fn, out_fn_grad and fn_grad and the slices of
    normw and normw_grad land in UB; per 64-lane column chunk, normw_grad's chunk is one register that
    accumulates row after row while fn_grad's rows are updated in place; both go back to GM."""
    import tilelang.ascend.language as T

    rows, hidden, cols, cores, stages = cfg.rows, cfg.hidden, cfg.block_cols, cfg.num_cores, cfg.num_stages
    f32 = T.float32

    @T.prim_func
    def mhc_fn_normw_merge_bwd_kernel(
        fn: T.Tensor((rows, hidden), f32),
        normw: T.Tensor((hidden,), f32),
        out_fn_grad: T.Tensor((rows, hidden), f32),
        fn_grad: T.Tensor((rows, hidden), f32),
        normw_grad: T.Tensor((hidden,), f32),
    ):
        with T.Kernel(cores) as cid:
            fn_ub = T.alloc_shared((rows, cols), f32)
            g_ub = T.alloc_shared((rows, cols), f32)
            fg_ub = T.alloc_shared((rows, cols), f32)  # fn_grad's tile, updated in place
            w_ub = T.alloc_shared((cols,), f32)
            wg_ub = T.alloc_shared((cols,), f32)  # normw_grad's slice, updated in place
            T.annotate_buffer_versions({fn_ub: stages, g_ub: stages, fg_ub: stages, w_ub: stages, wg_ub: stages})
            for task in T.Persistent([hidden // cols], cores, cid, group_size=1, num_stages=stages):
                c0 = task * cols
                T.copy(fn[:, c0 : c0 + cols], fn_ub)
                T.copy(out_fn_grad[:, c0 : c0 + cols], g_ub)
                T.copy(fn_grad[:, c0 : c0 + cols], fg_ub)
                T.copy(normw[c0 : c0 + cols], w_ub)
                T.copy(normw_grad[c0 : c0 + cols], wg_ub)
                with T.SimdVF():
                    for c in T.serial(cols // LANES):
                        w = T.simd.vld(w_ub[c * LANES])
                        acc = T.simd.alloc_var(f32)
                        acc = T.simd.vld(wg_ub[c * LANES])
                        for r in T.serial(rows):  # row order: the summation order of the contract
                            g = T.simd.vld(g_ub[r, c * LANES])
                            fg = T.simd.alloc_var(f32)
                            fg = T.simd.vld(fg_ub[r, c * LANES])
                            T.simd.vmula(fg, g, w)
                            T.simd.vsts(fg_ub[r, c * LANES], fg)
                            T.simd.vmula(acc, g, T.simd.vld(fn_ub[r, c * LANES]))
                        T.simd.vsts(wg_ub[c * LANES], acc)
                T.copy(fg_ub, fn_grad[:, c0 : c0 + cols])
                T.copy(wg_ub, normw_grad[c0 : c0 + cols])

    return mhc_fn_normw_merge_bwd_kernel
