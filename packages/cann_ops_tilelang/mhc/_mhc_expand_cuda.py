"""CUDA kernels of mhc_expand_fwd / mhc_expand_bwd (math and config: mhc_expand_kernel.py).

A thread block takes `token_block` tokens by `hidden_block` columns (CUDA_BLOCK_ELEMENTS in all) with 16-byte
accesses: fwd loads the x tile once into registers and stores it to every stream; bwd loads the mhc_mult
o_grad tiles (all in flight before the sums need them), sums them in stream order in fp32 and stores x_grad's
tile. Rows past the token count are masked (the last token tile).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.


def cuda_mhc_expand_kernel(cfg):
    """`cfg` is an MhcExpandConfig (backend "cuda")."""
    import tilelang.language as T

    mhc, hidden, bh, bt = cfg.mhc, cfg.hidden, cfg.hidden_block, cfg.token_block
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')

    if cfg.direction == 'fwd':

        @T.prim_func
        def mhc_expand_fwd_kernel(
            x: T.Tensor((num_tokens, hidden), bf16),
            o: T.Tensor((num_tokens, mhc, hidden), bf16),
        ):
            with T.Kernel(T.ceildiv(num_tokens, bt), hidden // bh, threads=cfg.threads) as (bx, by):
                x_frag = T.alloc_fragment((bt, bh), bf16)
                for i, j in T.Parallel(bt, bh):
                    if bx * bt + i < num_tokens:
                        x_frag[i, j] = x[bx * bt + i, by * bh + j]
                for m in T.unroll(mhc):
                    for i, j in T.Parallel(bt, bh):
                        if bx * bt + i < num_tokens:
                            o[bx * bt + i, m, by * bh + j] = x_frag[i, j]

        return mhc_expand_fwd_kernel

    @T.prim_func
    def mhc_expand_bwd_kernel(
        o_grad: T.Tensor((num_tokens, mhc, hidden), bf16),
        x_grad: T.Tensor((num_tokens, hidden), bf16),
    ):
        with T.Kernel(T.ceildiv(num_tokens, bt), hidden // bh, threads=cfg.threads) as (bx, by):
            acc = T.alloc_fragment((bt, bh), f32)
            T.clear(acc)
            for m in T.unroll(mhc):
                for i, j in T.Parallel(bt, bh):
                    if bx * bt + i < num_tokens:
                        acc[i, j] += T.cast(o_grad[bx * bt + i, m, by * bh + j], f32)
            for i, j in T.Parallel(bt, bh):
                if bx * bt + i < num_tokens:
                    x_grad[bx * bt + i, by * bh + j] = T.cast(acc[i, j], bf16)

    return mhc_expand_bwd_kernel
