"""Ascend 950 kernel of mhc_pre_big_fuse_fwd fused into one launch (configuration: mhc_pre_big_fuse_kernel.py; the
design and why: docs/mhc.md, "The fused pre path").

A persistent loop over the vector cores, a task per `token_block` tokens. For its tokens a task
- reduces the split partials and RMS-normalises them (the reduction kernel's register arithmetic): each split's
  pre, post and comb columns land by DMA in a tile of their own (rows padded to the mix kernels' segment rows, as
  the split kernel loads them) and are added to running sums in split order, the sums of squares alike; then
  1 / rms per token and, per token row, the segment's sums times it (the reduction's group sum, one group);
- splits the normalised mixes into pre, post and comb logits (the split kernel's segment arithmetic on the same
  tile shapes) and stores post_mix;
- runs the Sinkhorn routine on each token's comb logits (a SIMT thread per token, as the Sinkhorn kernel) and
  stores comb_mix;
- streams each token's residual rows in pre_apply_mix_fwd's hidden blocks and mixes them by the token's pre
  (pre_apply_mix_fwd's block macro) into layer_input.

Every value goes through the stage kernels' own pieces (rms_routines, mix_math, the Sinkhorn routines,
fwd_block) in their order; only the intermediates stay in UB instead of going through global fp32 buffers: the
results are the composition's bits. Rows past the task's tokens compute on whatever UB holds and are never
stored.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

from ._mhc_pre_apply_mix_ascend import fwd_block
from ._mhc_reduce_partials_and_rmsnorm_fwd_ascend import rms_routines
from ._mhc_sinkhorn_routine import make_sinkhorn_routines
from ._mixes_ascend import LANES, lanes_of, mix_math


def fused_ub_bytes(mhc_mult: int, token_block: int, hidden_block: int) -> int:
    """UB bytes of the fused kernel's buffers (one version each), as it allocates them below."""
    Cm, Cc = lanes_of(mhc_mult), lanes_of(mhc_mult * mhc_mult)
    tb, tbp = token_block, -(-token_block // LANES) * LANES
    words = (
        3 * 8 + 3 * LANES  # scales, bases
        + 6 * tb * Cm + 4 * tb * Cc  # pre / post: partial, input, output; comb: partial, input, logits, output
        + 2 * (tb + LANES // Cm) * Cm + (tb + LANES // Cc) * Cc  # the split sums and their spare rows
        + 3 * tbp  # the squares' partial and sum, 1 / rms
    )  # fmt: skip
    return 4 * words + 2 * (mhc_mult + 1) * hidden_block  # and the residual tile and its layer_input block


def ascend_mhc_pre_big_fuse_fwd_kernel(cfg):
    """`cfg` is a fused MhcPreBigFuseConfig (backend "ascend", direction "fwd")."""
    import tilelang.ascend.language as T

    reduce, split = cfg.stage('reduce_partials_and_rmsnorm_fwd'), cfg.stage('pre_split_mixes_fwd')
    sinkhorn, apply = cfg.stage('sinkhorn_fwd'), cfg.stage('pre_apply_mix_fwd')
    M, M3, S, H = split.mhc_mult, split.width, reduce.n_splits, apply.hidden
    mm, tb, repeat, cores = M * M, cfg.token_block, sinkhorn.repeat, apply.num_cores
    block = apply.hidden_block
    blocks = H // block
    Cm, Cc = lanes_of(M), lanes_of(mm)  # UB rows of a pre / post tile and of a comb tile
    tbp = -(-tb // LANES) * LANES  # per-token scalars, in whole registers
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')
    rms = rms_routines(T)
    mix = mix_math(T, split.num_scales, tb)
    routine = make_sinkhorn_routines(T, M)
    mix_block = fwd_block(T, M, block)

    @T.macro
    def add_split(total_ub, part_ub, C):
        """total_ub += part_ub over a segment's tile (tb rows of C lanes), register by register."""
        for i in T.serial(tb * C // LANES):
            a = T.simd.alloc_var(f32)
            a = T.simd.vld(total_ub[i * (LANES // C), 0])
            a = rms.add_partial(a, T.simd.vld(part_ub[i * (LANES // C), 0]))
            T.simd.vsts(total_ub[i * (LANES // C), 0], a)

    @T.macro
    def normalise_row(total_ub, mixes_ub, t, rs, keep):
        """mixes_ub row t <- total_ub row t times 1 / rms (the group sum of one group, from +0.0)."""
        o = T.simd.alloc_var(f32)
        o = T.simd.vdup(0.0, f32)
        rms.add_normalised(o, T.simd.vld(total_ub[t, 0]), rs)
        T.simd.vsts(mixes_ub[t, 0], o, keep)

    @T.prim_func
    def mhc_pre_big_fuse_fwd_kernel(
        gemm_out_mul: T.Tensor((S, num_tokens, 1, M3), f32),
        gemm_out_sqrsum: T.Tensor((S, num_tokens, 1), f32),
        mhc_scale: T.Tensor((3,), f32),
        mhc_base: T.Tensor((M3,), f32),
        residual: T.Tensor((num_tokens, M, H), bf16),
        post_mix: T.Tensor((num_tokens, M), f32),
        comb_mix: T.Tensor((num_tokens, mm), f32),
        layer_input: T.Tensor((num_tokens, H), bf16),
        inv_group_size: f32,
        rms_eps: f32,
        eps: f32,
        sinkhorn_eps: f32,
        post_mult: f32,
    ):
        with T.Kernel(cores) as core_id:
            scale_ub = T.alloc_shared((3, 8), f32)
            pre_base = T.alloc_shared((LANES,), f32)
            post_base = T.alloc_shared((LANES,), f32)
            comb_base = T.alloc_shared((LANES,), f32)
            pre_part = T.alloc_shared((tb, Cm), f32)
            post_part = T.alloc_shared((tb, Cm), f32)
            comb_part = T.alloc_shared((tb, Cc), f32)
            sq_part = T.alloc_shared((tbp,), f32)
            # The split sums; a row's 64-lane load reaches the rows after it (past the tile: spare rows).
            pre_sum = T.alloc_shared((tb + LANES // Cm, Cm), f32)
            post_sum = T.alloc_shared((tb + LANES // Cm, Cm), f32)
            comb_sum = T.alloc_shared((tb + LANES // Cc, Cc), f32)
            sq_sum = T.alloc_shared((tbp,), f32)
            rstd_ub = T.alloc_shared((tbp,), f32)
            pre_in = T.alloc_shared((tb, Cm), f32)
            post_in = T.alloc_shared((tb, Cm), f32)
            comb_in = T.alloc_shared((tb, Cc), f32)
            pre_ub = T.alloc_shared((tb, Cm), f32)
            post_ub = T.alloc_shared((tb, Cm), f32)
            logits_ub = T.alloc_shared((tb, Cc), f32)
            comb_ub = T.alloc_shared((tb, Cc), f32)
            x_ub = T.alloc_shared((M, block), bf16)
            o_ub = T.alloc_shared((block,), bf16)
            mix.load_scales(mhc_scale, scale_ub)
            mix.fill_base(mhc_base, pre_base, 0, M, Cm)
            mix.fill_base(mhc_base, post_base, M, M, Cm)
            mix.fill_base(mhc_base, comb_base, 2 * M, mm, Cc)
            for task in T.Persistent([T.ceildiv(num_tokens, tb)], cores, core_id, group_size=1, num_stages=1):
                t0 = task * tb
                vt = T.min(tb, num_tokens - t0)
                with T.SimdVF():
                    zero = T.simd.vdup(0.0, f32)
                    for i in T.serial(tb * Cm // LANES):
                        T.simd.vsts(pre_sum[i * (LANES // Cm), 0], zero)
                        T.simd.vsts(post_sum[i * (LANES // Cm), 0], zero)
                    for i in T.serial(tb * Cc // LANES):
                        T.simd.vsts(comb_sum[i * (LANES // Cc), 0], zero)
                    for i in T.serial(tbp // LANES):
                        T.simd.vsts(sq_sum[i * LANES], zero)
                for s in T.serial(S):  # split order: the reduction's summation order
                    T.copy(gemm_out_mul[s, t0 : t0 + vt, 0, 0:M], pre_part[0:vt, 0:M])
                    T.copy(gemm_out_mul[s, t0 : t0 + vt, 0, M : 2 * M], post_part[0:vt, 0:M])
                    T.copy(gemm_out_mul[s, t0 : t0 + vt, 0, 2 * M : M3], comb_part[0:vt, 0:mm])
                    T.copy(gemm_out_sqrsum[s, t0 : t0 + vt, 0], sq_part[0:vt])
                    with T.SimdVF():
                        add_split(pre_sum, pre_part, Cm)
                        add_split(post_sum, post_part, Cm)
                        add_split(comb_sum, comb_part, Cc)
                        for i in T.serial(tbp // LANES):
                            q = T.simd.alloc_var(f32)
                            q = T.simd.vld(sq_sum[i * LANES])
                            q = rms.add_partial(q, T.simd.vld(sq_part[i * LANES]))
                            T.simd.vsts(sq_sum[i * LANES], q)
                with T.SimdVF():
                    one = T.simd.vdup(1.0, f32)
                    lane = T.simd.vci(T.int32(0), T.int32)
                    for i in T.serial(tbp // LANES):
                        T.simd.vsts(rstd_ub[i * LANES], rms.inverse_rms(T.simd.vld(sq_sum[i * LANES]), one,
                                                                        inv_group_size, rms_eps))  # fmt: skip
                    # The 1/rms stores land before the broadcast loads below read them.
                    T.simd.mem_bar('VST_VLD')
                    keep_pre = T.simd.vcmps(lane, T.int32(Cm), op='lt')
                    keep_comb = T.simd.vcmps(lane, T.int32(Cc), op='lt')
                    for t in T.serial(tb):
                        rs = T.simd.vld(rstd_ub[t], dist='BRC_B32')
                        normalise_row(pre_sum, pre_in, t, rs, keep_pre)
                        normalise_row(post_sum, post_in, t, rs, keep_pre)
                        normalise_row(comb_sum, comb_in, t, rs, keep_comb)
                    # The normalised mixes land before the split's loads read them.
                    T.simd.mem_bar('VST_VLD')
                    mix.segment_forward(pre_in, pre_ub, pre_base, scale_ub, 0, Cm, post_mult, eps)
                    mix.segment_forward(post_in, post_ub, post_base, scale_ub, 1, Cm, post_mult, eps)
                    mix.segment_forward(comb_in, logits_ub, comb_base, scale_ub, 2, Cc, post_mult, eps)
                T.copy(post_ub[0:vt, 0:M], post_mix[t0 : t0 + vt, :])
                with T.SimtVF(threads=tb):
                    thread = T.get_thread_binding(0)
                    if thread < vt:
                        a = T.alloc_local((mm,), f32)
                        # A copy: the routine's macro names its eps argument `eps`, the mixes' too (an entry
                        # parameter each would share the name).
                        sinkhorn_eps_copy = T.alloc_var(f32, init=0.0)
                        sinkhorn_eps_copy = sinkhorn_eps
                        routine.read(a, logits_ub, thread)
                        routine.forward(a, sinkhorn_eps_copy, repeat)
                        routine.write(comb_ub, thread, a)
                T.copy(comb_ub[0:vt, 0:mm], comb_mix[t0 : t0 + vt, :])
                for i in T.serial(vt):
                    for b in T.serial(blocks):
                        T.copy(residual[t0 + i, :, b * block : (b + 1) * block], x_ub)
                        with T.SimdVF():
                            # The macro expands here, in this iteration: the lambda reads this token's pre row.
                            mix_block(x_ub, lambda m: pre_ub[i, m], o_ub)  # noqa: B023
                        T.copy(o_ub, layer_input[t0 + i, b * block : (b + 1) * block])

    return mhc_pre_big_fuse_fwd_kernel
