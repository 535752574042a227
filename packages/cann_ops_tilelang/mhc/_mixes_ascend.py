"""Ascend 950 kernels of the mix operators (math, kinds and config: _mixes_kernel.py).

SIMD vector functions (T.SimdVF) over UB tiles of `token_block` tokens. A token's row of M * (M + 2) logits
(15, 35, 63 for odd M) is split by the DMA, not in registers: each segment's columns of a tile land in a tile
of their own whose rows are padded to a power of two C >= 8 lanes (one 32-byte block at least), so a 64-lane
register holds 64 / C whole rows and a segment's bases, loaded once per core into one register pattern, line up
with every register. Pad lanes compute on padding that never reaches GM (the backward's sums mask it and the
rows past the token count out with vsel).

Forward: a persistent loop over the vector cores, two buffer versions; per tile, per segment, z = x * scale +
base and sigmoid(z) = 1 / (1 + exp(-z)) register by register. Backward: one worker per partial row, its tiles in
order; per tile dL/dz, the input gradient and per-lane running sums of dL/dz and dL/dz * x (registers in chunk
order, kept in UB between tiles); at the end per column the lanes of its 64 / C rows in row order (the base
partial) and per segment every lane of the dL/dz * x sums by vcadd's fixed tree (the scale partial). The split
backward's second pass (one core, SIMT) adds the partial rows in row order.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.

import types

from ._mixes_entries import mixes_entry

LANES = 64  # fp32 lanes of one 256-byte vector register


def lanes_of(n: int) -> int:
    """UB row of a segment n columns wide: a power of two of at least 8 lanes (one 32-byte block), so that a
    register holds 64 / row whole rows and the bases repeat alike in every register."""
    return max(8, 1 << (n - 1).bit_length())


def mix_math(T, num_scales: int, token_block: int):
    """The forward's per-logit pieces, by name (one home: the mix kernels and the fused pre path's kernel, which
    must round alike): fill_base(mhc_base, base_ub, offset, n, C), the segment's bases in one register pattern;
    load_scales(mhc_scale, scale_ub), one 32-byte row per scale; segment_forward(in_ub, out_ub, base_ub,
    scale_ub, k, C, post_mult, eps), a segment's tile of `token_block` rows of C lanes: z = x * scale + base,
    then pre = sigmoid(z) + eps (k 0), post = sigmoid(z) * post_mult (k 1), comb = z (k 2)."""
    f32 = T.float32
    S, tb = num_scales, token_block

    @T.macro
    def fill_base(mhc_base, base_ub, offset, n, C):
        """base_ub (64,): the segment's n bases at lanes r * C .. r * C + n - 1 of each of its 64 / C rows."""
        for r in T.unroll(LANES // C):
            T.copy(mhc_base[offset : offset + n], base_ub[r * C : r * C + n])

    @T.macro
    def load_scales(mhc_scale, scale_ub):
        for k in T.unroll(S):  # one 32-byte row per scale: a broadcast load reads it
            T.copy(mhc_scale[k : k + 1], scale_ub[k, 0:1])

    @T.macro
    def segment_forward(in_ub, out_ub, base_ub, scale_ub, k, C, post_mult, eps):
        """A segment's tile, 64 lanes (64 / C tokens) per register; pad lanes compute on garbage never stored
        to GM. k: the scale index (0 pre, 1 post, 2 comb)."""
        scale = T.simd.vld(scale_ub[k, 0], dist='BRC_B32')
        base = T.simd.vld(base_ub[0])
        one = T.simd.vdup(1.0, f32)
        for c in T.serial(tb * C // LANES):
            z = T.simd.vadd(T.simd.vmul(T.simd.vld(in_ub[c * (LANES // C), 0]), scale), base)
            if k == 2:
                T.simd.vsts(out_ub[c * (LANES // C), 0], z)
            else:
                sig = T.simd.vdiv(one, T.simd.vadds(T.simd.vexp(T.simd.vneg(z)), 1.0))
                if k == 0:
                    T.simd.vsts(out_ub[c * (LANES // C), 0], T.simd.vadds(sig, eps))
                else:
                    T.simd.vsts(out_ub[c * (LANES // C), 0], T.simd.vmuls(sig, post_mult))

    return types.SimpleNamespace(fill_base=fill_base, load_scales=load_scales, segment_forward=segment_forward)


def ascend_mhc_mixes_kernel(cfg):
    """`cfg` is a MhcMixesConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    f32 = T.float32
    M, W, S, tb = cfg.mhc_mult, cfg.width, cfg.num_scales, cfg.token_block
    M2 = M * M
    P, threads, stages = cfg.num_partials, cfg.threads, cfg.num_stages
    Wp = -(-W // 8) * 8  # the reduce's UB row of per-column sums: whole 32-byte blocks
    num_tokens = T.dynamic('num_tokens')

    Cm = lanes_of(M)  # UB row of a pre / post tile
    Cc = lanes_of(M2)  # UB row of a comb tile
    mix = mix_math(T, S, tb)
    fill_base, load_scales, segment_forward = mix.fill_base, mix.load_scales, mix.segment_forward

    @T.macro
    def forward(x, mhc_scale, mhc_base, pre, post, comb, post_mult, eps):
        with T.Kernel(cfg.num_cores) as core_id:
            scale_ub = T.alloc_shared((3, 8), f32)
            pre_in = T.alloc_shared((tb, Cm), f32)
            pre_out = T.alloc_shared((tb, Cm), f32)
            pre_base = T.alloc_shared((LANES,), f32)
            post_in = T.alloc_shared((tb, Cm), f32)
            post_out = T.alloc_shared((tb, Cm), f32)
            post_base = T.alloc_shared((LANES,), f32)
            comb_in = T.alloc_shared((tb, Cc), f32)
            comb_out = T.alloc_shared((tb, Cc), f32)
            comb_base = T.alloc_shared((LANES,), f32)
            load_scales(mhc_scale, scale_ub)
            fill_base(mhc_base, pre_base, 0, M, Cm)
            if cfg.split:
                fill_base(mhc_base, post_base, M, M, Cm)
                fill_base(mhc_base, comb_base, 2 * M, M2, Cc)
            for task in T.Persistent(
                [T.ceildiv(num_tokens, tb)], cfg.num_cores, core_id, group_size=1, num_stages=stages
            ):
                start = task * tb
                count = T.min(tb, num_tokens - start)
                # Each segment's columns to a tile of its own, rows padded to whole 32-byte blocks.
                T.copy(x[start : start + count, 0:M], pre_in[0:count, 0:M])
                if cfg.split:
                    T.copy(x[start : start + count, M : 2 * M], post_in[0:count, 0:M])
                    T.copy(x[start : start + count, 2 * M : W], comb_in[0:count, 0:M2])
                with T.SimdVF():
                    segment_forward(pre_in, pre_out, pre_base, scale_ub, 0, Cm, post_mult, eps)
                    if cfg.split:
                        segment_forward(post_in, post_out, post_base, scale_ub, 1, Cm, post_mult, eps)
                        segment_forward(comb_in, comb_out, comb_base, scale_ub, 2, Cc, post_mult, eps)
                T.copy(pre_out[0:count, 0:M], pre[start : start + count, :])
                if cfg.split:
                    T.copy(post_out[0:count, 0:M], post[start : start + count, :])
                    T.copy(comb_out[0:count, 0:M2], comb[start : start + count, :])

    @T.macro
    def segment_backward(x_ub, g_ub, post_ub, x_grad_ub, sums_ub, base_ub, scale_ub, k, n, C, count, post_mult):
        """dL/dz of a segment's tile, its input gradient, and the running per-lane sums of dL/dz (sums_ub row 0)
        and dL/dz * x (row 1) over the worker's tokens; pad lanes and the rows past `count` add zeros. base_ub
        serves the pre segment (k 0, whose sigmoid is recomputed), post_ub the post segment (k 1)."""
        scale = T.simd.vld(scale_ub[k, 0], dist='BRC_B32')
        base = T.simd.vld(base_ub[0])
        one = T.simd.vdup(1.0, f32)
        zero = T.simd.vdup(0.0, f32)
        lane = T.simd.vci(T.int32(0), T.int32)
        column_ok = T.simd.vcmps(T.simd.vand(lane, T.simd.vdup(T.int32(C - 1), T.int32)), T.int32(n), op='lt')
        row_of_lane = T.simd.vshrs(lane, T.int32(C.bit_length() - 1))
        dz_sum = T.simd.alloc_var(f32)
        dzx_sum = T.simd.alloc_var(f32)
        dz_sum = T.simd.vld(sums_ub[0, 0])
        dzx_sum = T.simd.vld(sums_ub[1, 0])
        for c in T.serial(tb * C // LANES):
            row0 = c * (LANES // C)
            x = T.simd.vld(x_ub[row0, 0])
            dz = T.simd.alloc_var(f32)
            if k == 0:
                sig = T.simd.vdiv(
                    one,
                    T.simd.vadds(T.simd.vexp(T.simd.vneg(T.simd.vadd(T.simd.vmul(x, scale), base))), 1.0),
                )
                dz = T.simd.vmul(T.simd.vmul(T.simd.vld(g_ub[row0, 0]), sig), T.simd.vsub(one, sig))
            elif k == 1:
                p = T.simd.vld(post_ub[row0, 0])
                ratio = T.simd.vdiv(p, T.simd.vdup(post_mult, f32))
                dz = T.simd.vmul(T.simd.vmul(T.simd.vld(g_ub[row0, 0]), p), T.simd.vsub(one, ratio))
            else:
                dz = T.simd.vld(g_ub[row0, 0])
            T.simd.vsts(x_grad_ub[row0, 0], T.simd.vmul(dz, scale))
            valid = T.simd.vcmps(T.simd.vadds(row_of_lane, row0), count, op='lt')
            dz_sum = T.simd.vadd(dz_sum, T.simd.vsel(T.simd.vsel(dz, zero, column_ok), zero, valid))
            dzx = T.simd.vsel(T.simd.vsel(T.simd.vmul(dz, x), zero, column_ok), zero, valid)
            dzx_sum = T.simd.vadd(dzx_sum, dzx)
        T.simd.vsts(sums_ub[0, 0], dz_sum)
        T.simd.vsts(sums_ub[1, 0], dzx_sum)

    @T.macro
    def segment_finish(sums_ub, fold_ub, part_ub, k, C):
        """The worker's partials of a segment: per column, the lanes of its 64 / C token rows in row order
        (fold_ub); the scale's, every lane of the dL/dz * x sums (vcadd's fixed tree) into part_ub[k]."""
        column_sum = T.simd.alloc_var(f32)
        column_sum = T.simd.vld(sums_ub[0, 0])
        for r in T.unroll(1, LANES // C):
            column_sum = T.simd.vadd(column_sum, T.simd.vld(sums_ub[0, r * C]))
        T.simd.vsts(fold_ub[0], column_sum)
        T.simd.vsts(part_ub[k], T.simd.vcadd(T.simd.vld(sums_ub[1, 0])), dist='ONEPT_B32')

    @T.macro
    def backward(pre_g, post_g, comb_g, x, post, mhc_scale, mhc_base, x_grad, scale_partial, base_partial, post_mult):
        with T.Kernel(P) as worker:
            scale_ub = T.alloc_shared((3, 8), f32)
            part_ub = T.alloc_shared((8,), f32)
            pre_x = T.alloc_shared((tb, Cm), f32)
            pre_g_ub = T.alloc_shared((tb, Cm), f32)
            pre_x_grad = T.alloc_shared((tb, Cm), f32)
            pre_sums = T.alloc_shared((2, LANES), f32)
            pre_base = T.alloc_shared((LANES,), f32)
            pre_fold = T.alloc_shared((LANES,), f32)
            post_x = T.alloc_shared((tb, Cm), f32)
            post_g_ub = T.alloc_shared((tb, Cm), f32)
            post_ub = T.alloc_shared((tb, Cm), f32)
            post_x_grad = T.alloc_shared((tb, Cm), f32)
            post_sums = T.alloc_shared((2, LANES), f32)
            post_fold = T.alloc_shared((LANES,), f32)
            comb_x = T.alloc_shared((tb, Cc), f32)
            comb_g_ub = T.alloc_shared((tb, Cc), f32)
            comb_x_grad = T.alloc_shared((tb, Cc), f32)
            comb_sums = T.alloc_shared((2, LANES), f32)
            comb_fold = T.alloc_shared((LANES,), f32)
            load_scales(mhc_scale, scale_ub)
            fill_base(mhc_base, pre_base, 0, M, Cm)
            with T.SimdVF():
                zero = T.simd.vdup(0.0, f32)
                for r in T.unroll(2):
                    T.simd.vsts(pre_sums[r, 0], zero)
                    if cfg.split:
                        T.simd.vsts(post_sums[r, 0], zero)
                        T.simd.vsts(comb_sums[r, 0], zero)
            for task in T.Persistent([T.ceildiv(num_tokens, tb)], P, worker, group_size=1, num_stages=1):
                start = task * tb
                count = T.min(tb, num_tokens - start)
                T.copy(x[start : start + count, 0:M], pre_x[0:count, 0:M])
                T.copy(pre_g[start : start + count, :], pre_g_ub[0:count, 0:M])
                if cfg.split:
                    T.copy(x[start : start + count, M : 2 * M], post_x[0:count, 0:M])
                    T.copy(post_g[start : start + count, :], post_g_ub[0:count, 0:M])
                    T.copy(post[start : start + count, :], post_ub[0:count, 0:M])
                    T.copy(x[start : start + count, 2 * M : W], comb_x[0:count, 0:M2])
                    T.copy(comb_g[start : start + count, :], comb_g_ub[0:count, 0:M2])
                with T.SimdVF():
                    segment_backward(
                        pre_x, pre_g_ub, pre_g_ub, pre_x_grad, pre_sums, pre_base, scale_ub, 0, M, Cm, count, post_mult
                    )
                    if cfg.split:
                        segment_backward(
                            post_x, post_g_ub, post_ub, post_x_grad, post_sums, pre_base, scale_ub, 1, M, Cm, count,
                            post_mult,
                        )  # fmt: skip
                        segment_backward(
                            comb_x, comb_g_ub, comb_g_ub, comb_x_grad, comb_sums, pre_base, scale_ub, 2, M2, Cc, count,
                            post_mult,
                        )  # fmt: skip
                T.copy(pre_x_grad[0:count, 0:M], x_grad[start : start + count, 0:M])
                if cfg.split:
                    T.copy(post_x_grad[0:count, 0:M], x_grad[start : start + count, M : 2 * M])
                    T.copy(comb_x_grad[0:count, 0:M2], x_grad[start : start + count, 2 * M : W])
            with T.SimdVF():
                segment_finish(pre_sums, pre_fold, part_ub, 0, Cm)
                if cfg.split:
                    segment_finish(post_sums, post_fold, part_ub, 1, Cm)
                    segment_finish(comb_sums, comb_fold, part_ub, 2, Cc)
            T.copy(part_ub[0:S], scale_partial[worker, :])
            T.copy(pre_fold[0:M], base_partial[worker, 0:M])
            if cfg.split:
                T.copy(post_fold[0:M], base_partial[worker, M : 2 * M])
                T.copy(comb_fold[0:M2], base_partial[worker, 2 * M : W])

    if cfg.kind != 'split_reduce':
        return mixes_entry(T, cfg, num_tokens, forward, backward)

    # 'split_reduce': one core adds the P partial rows in row order.
    @T.prim_func
    def mhc_pre_split_mixes_bwd_reduce_kernel(
        mhc_scale_grad_partial: T.Tensor((P, 3), f32),
        mhc_base_grad_partial: T.Tensor((P, W), f32),
        mhc_scale_grad: T.Tensor((3,), f32),
        mhc_base_grad: T.Tensor((W,), f32),
    ):
        with T.Kernel(1) as _core:
            scale_part_ub = T.alloc_shared((P, 3), f32)
            base_part_ub = T.alloc_shared((P, W), f32)
            scale_ub = T.alloc_shared((8,), f32)
            base_ub = T.alloc_shared((Wp,), f32)
            T.copy(mhc_scale_grad_partial, scale_part_ub)
            T.copy(mhc_base_grad_partial, base_part_ub)
            with T.SimtVF(threads=threads):
                tid = T.get_thread_binding(0)
                total = T.alloc_var(f32)
                if tid < W:
                    total = base_part_ub[0, tid]
                    for p in T.serial(1, P):
                        total = total + base_part_ub[p, tid]
                    base_ub[tid] = total
                if tid >= W and tid < W + 3:
                    total = scale_part_ub[0, tid - W]
                    for p in T.serial(1, P):
                        total = total + scale_part_ub[p, tid - W]
                    scale_ub[tid - W] = total
            T.copy(scale_ub[0:3], mhc_scale_grad)
            T.copy(base_ub[0:W], mhc_base_grad)

    return mhc_pre_split_mixes_bwd_reduce_kernel
