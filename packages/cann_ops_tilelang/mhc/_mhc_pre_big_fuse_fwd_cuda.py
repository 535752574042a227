"""CUDA kernel of mhc_pre_big_fuse_fwd fused into one launch (configuration: mhc_pre_big_fuse_kernel.py; the
design and why: docs/mhc.md, "The fused pre path").

The grid is two kinds of thread blocks of the same width, the Sinkhorn blocks first so that the block scheduler
starts them ahead of the stream (their latency then hides behind it instead of trailing it):

- Sinkhorn blocks, one per `tokens` of the Sinkhorn stage's configuration: a thread per (token, mix) of the
  post and comb mixes reduces that mix's partials and RMS-normalises it, writes post_mix or puts the comb logit
  in shared memory; then a thread per token runs the Sinkhorn routine on its matrix and writes comb_mix.
- Stream blocks, pre_apply_mix_fwd's tiles on its grid (hidden blocks of a token tile side by side): a thread
  per (token, pre mix) of the tile computes the token's pre in shared memory the same way, then the block mixes
  the residual tile into layer_input (pre_apply_mix_fwd's tile macro, 16-byte accesses).

Every value goes through the stage kernels' own expressions (rms_routines, mix_math, sinkhorn_routines,
fwd_tile) in their order, only kept in registers or shared memory instead of global fp32 intermediates: the
results are the composition's bits.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

from ._mhc_pre_apply_mix_cuda import fwd_tile
from ._mhc_reduce_partials_and_rmsnorm_fwd_cuda import rms_routines
from ._mhc_sinkhorn_cuda import sinkhorn_routines
from ._mixes_cuda import mix_math


def cuda_mhc_pre_big_fuse_fwd_kernel(cfg):
    """`cfg` is a fused MhcPreBigFuseConfig (backend "cuda", direction "fwd")."""
    import tilelang.language as T

    reduce, split = cfg.stage('reduce_partials_and_rmsnorm_fwd'), cfg.stage('pre_split_mixes_fwd')
    sinkhorn, apply = cfg.stage('sinkhorn_fwd'), cfg.stage('pre_apply_mix_fwd')
    M, M3, S, H = split.mhc_mult, split.width, reduce.n_splits, apply.hidden
    mm, tail = M * M, M3 - M  # a Sinkhorn block's mixes per token: post and comb (column M on)
    bt, nt, sk, repeat = apply.token_block, apply.threads, sinkhorn.tokens, sinkhorn.repeat
    hidden_blocks = H // apply.hidden_block
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')
    rms = rms_routines(T, S)
    mix = mix_math(T, M, split.num_scales)
    routine = sinkhorn_routines(T, sinkhorn)
    accumulate_and_store = fwd_tile(T, apply, num_tokens)

    @T.macro
    def normalised_mix(o, q, m, gemm_out_mul, gemm_out_sqrsum, t, j, inv_group_size, rms_eps):
        """o[0] <- mix j of token t, reduced and RMS-normalised as the reduction kernel does (one RMS group)."""
        o[0] = 0.0
        rms.split_sums(q, m, gemm_out_mul, gemm_out_sqrsum, t, 0, j)
        o[0] += rms.normalised(m[0], q[0], inv_group_size, rms_eps)

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
        pre_eps: f32,
        sinkhorn_eps: f32,
        post_mult: f32,
    ):
        # One grid dimension (the stream tiles can exceed gridDim.y's 65535): Sinkhorn blocks, then stream tiles.
        with T.Kernel(T.ceildiv(num_tokens, sk) + T.ceildiv(num_tokens, bt) * hidden_blocks, threads=nt) as block:
            tid = T.get_thread_binding()
            comb_s = T.alloc_shared((sk, mm), f32)
            pre_s = T.alloc_shared((bt, M), f32)
            q = T.alloc_local((1,), f32)
            m = T.alloc_local((1,), f32)
            o = T.alloc_local((1,), f32)
            a = T.alloc_local((mm,), f32)
            if block < T.ceildiv(num_tokens, sk):
                for it in T.serial(T.ceildiv(sk * tail, nt)):
                    e = it * nt + tid
                    t = block * sk + e // tail
                    j = M + e % tail
                    if e < sk * tail and t < num_tokens:
                        normalised_mix(o, q, m, gemm_out_mul, gemm_out_sqrsum, t, j, inv_group_size, rms_eps)
                        z = mix.logit(o[0], mhc_scale, mhc_base, j)
                        if j < 2 * M:
                            post_mix[t, j - M] = mix.post(z, post_mult)
                        else:
                            comb_s[e // tail, j - 2 * M] = z
                T.sync_threads()
                if tid < sk and block * sk + tid < num_tokens:
                    routine.read(a, comb_s, tid)
                    routine.forward(a, sinkhorn_eps, repeat)
                    routine.write(comb_mix, block * sk + tid, a)
            else:
                pid = block - T.ceildiv(num_tokens, sk)
                tile = pid // hidden_blocks
                for it in T.serial(T.ceildiv(bt * M, nt)):
                    e = it * nt + tid
                    t = tile * bt + e // M
                    if e < bt * M and t < num_tokens:
                        normalised_mix(o, q, m, gemm_out_mul, gemm_out_sqrsum, t, e % M, inv_group_size, rms_eps)
                        pre_s[e // M, e % M] = mix.pre(mix.logit(o[0], mhc_scale, mhc_base, e % M), pre_eps)
                T.sync_threads()
                accumulate_and_store(residual, pre_s, 0, layer_input, tile, pid % hidden_blocks)

    return mhc_pre_big_fuse_fwd_kernel
