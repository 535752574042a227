"""CUDA kernel of mhc_post_fwd (configuration and generator: mhc_post_fwd_kernel.py).

A flat grid over (token, 8-column chunk): each thread reads one 16-byte chunk of x and of each of the M residual
rows of its token, the token's M * M + M mixes (the same addresses across the warp's threads of one token: one
transaction each, from L1), and writes the M 16-byte output chunks. One pass over the big tensors, every access
16 bytes wide and coalesced across the warp; no shared memory, no barrier.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to the
# generator's local shape variables.

from ._mhc_post_common import CUDA_VEC


def cuda_mhc_post_fwd_kernel(cfg):
    """`cfg` is a MhcPostFwdConfig (backend "cuda")."""
    import tilelang.language as T

    mhc, hidden, threads = cfg.mhc, cfg.hidden, cfg.threads
    ve = CUDA_VEC
    per_row = hidden // ve  # chunks of one token row
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def mhc_post_fwd_kernel(
        x: T.Tensor((num_tokens, hidden), bf16),
        residual: T.Tensor((num_tokens, mhc, hidden), bf16),
        post_layer_mix: T.Tensor((num_tokens, mhc), f32),
        comb_res_mix: T.Tensor((num_tokens, mhc, mhc), f32),
        out: T.Tensor((num_tokens, mhc, hidden), bf16),
    ):
        with T.Kernel(T.ceildiv(num_tokens * per_row, threads), threads=threads) as bx:
            tid = T.get_thread_binding()
            x_l = T.alloc_local((ve,), bf16)
            r_l = T.alloc_local((mhc * ve,), bf16)
            o_l = T.alloc_local((mhc * ve,), bf16)
            comb = T.alloc_local((mhc * mhc,), f32)
            post = T.alloc_local((mhc,), f32)
            chunk = bx * threads + tid
            if chunk < num_tokens * per_row:
                t = chunk // per_row
                col = (chunk % per_row) * ve
                # Every load of the thread issued before any use: (M + 1) 16-byte loads in flight.
                for j in T.vectorized(ve):
                    x_l[j] = x[t, col + j]
                for i in T.unroll(mhc):
                    for j in T.vectorized(ve):
                        r_l[i * ve + j] = residual[t, i, col + j]
                for k in T.unroll(mhc * mhc):
                    comb[k] = comb_res_mix[t, k // mhc, k % mhc]
                for o in T.unroll(mhc):
                    post[o] = post_layer_mix[t, o]
                for o in T.unroll(mhc):
                    for j in T.unroll(ve):
                        acc = T.alloc_var(f32)
                        acc = post[o] * T.cast(x_l[j], f32)
                        for i in T.unroll(mhc):
                            acc += comb[i * mhc + o] * T.cast(r_l[i * ve + j], f32)
                        o_l[o * ve + j] = T.cast(acc, bf16)
                for o in T.unroll(mhc):
                    for j in T.vectorized(ve):
                        out[t, o, col + j] = o_l[o * ve + j]

    return mhc_post_fwd_kernel
