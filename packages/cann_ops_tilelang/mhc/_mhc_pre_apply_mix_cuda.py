"""CUDA kernels of mhc_pre_apply_mix_fwd / mhc_pre_apply_mix_bwd (math and config: mhc_pre_apply_mix_kernel.py).

- fwd: a thread block takes `token_block` tokens by `hidden_block` columns; per stream it loads the x tile
  (16-byte accesses) and adds mix * x into fp32 accumulators, then stores o's tile. Rows past the token count
  are masked (with `clamped_reads` only their stores: they read the last token's row). With `hidden_inner` the
  (1-D) grid walks a token tile's hidden blocks first, so that blocks running side by side read neighbouring
  bytes of x (a few MB of address range across the GPU instead of a column of every token tile); otherwise the
  grid is (token tiles, hidden blocks), token tiles first.
- bwd: a thread block takes one token and walks its hidden row in blocks: per block it reads o_grad, x and
  x_grad once, writes x_grad + mix * o_grad back and keeps per-thread partial sums of o_grad * x; at the end one
  block reduction (TileLang's reduce_sum: fixed order, no atomics) gives the token's mix_grad row.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.


def fwd_tile(T, cfg, num_tokens):
    """The forward's tile as a macro (one home: this kernel and the fused pre path's kernel, which must round alike):
    accumulate_and_store(x, mix, mix_tile, o, tile, col) mixes the tile of tokens `tile * bt ..` by columns
    `col * bh ..` of x into o, token i of the tile by the mix row mix[mix_tile * bt + i] (this kernel: the token's
    row of the global mix, mix_tile = tile; the fused kernel: a row of its shared tile, mix_tile = 0). `cfg` is
    an MhcPreApplyMixConfig (backend "cuda", direction "fwd")."""
    mhc, bh, bt = cfg.mhc, cfg.hidden_block, cfg.token_block
    f32, bf16 = T.float32, T.bfloat16

    @T.macro
    def accumulate_and_store(x, mix, mix_tile, o, tile, col):
        acc = T.alloc_fragment((bt, bh), f32)
        T.clear(acc)
        for m in T.unroll(mhc):
            for i, j in T.Parallel(bt, bh):
                if cfg.clamped_reads:
                    # Rows past the token count read the last token (its bytes are on chip already) and are
                    # not stored: no branch around the loads, so that all of a thread's loads can be in flight.
                    row = T.min(tile * bt + i, num_tokens - 1)
                    acc[i, j] += mix[mix_tile * bt + row - tile * bt, m] * T.cast(x[row, m, col * bh + j], f32)
                elif tile * bt + i < num_tokens:
                    acc[i, j] += mix[mix_tile * bt + i, m] * T.cast(x[tile * bt + i, m, col * bh + j], f32)
        for i, j in T.Parallel(bt, bh):
            if tile * bt + i < num_tokens:
                o[tile * bt + i, col * bh + j] = T.cast(acc[i, j], bf16)

    return accumulate_and_store


def cuda_mhc_pre_apply_mix_kernel(cfg):
    """`cfg` is an MhcPreApplyMixConfig (backend "cuda")."""
    import tilelang.language as T

    mhc, hidden, bh, bt = cfg.mhc, cfg.hidden, cfg.hidden_block, cfg.token_block
    f32, bf16 = T.float32, T.bfloat16
    num_tokens = T.dynamic('num_tokens')
    vec, threads = cfg.vector, cfg.threads
    per_thread = bh // vec // threads  # vectors of a stream's block row per thread

    # The backward's tile layout: vector k = j / vec of every stream row on thread k % threads, so that each
    # thread loads whole vectors and the sum over hidden is one reduction over all threads, the same for
    # every stream.
    def _thread_of(m, j):
        return j // vec % threads

    def _slot_of(m, j):
        return (m * per_thread + j // vec // threads) * vec + j % vec

    if cfg.direction == 'fwd':
        hidden_blocks = hidden // bh
        _accumulate_and_store = fwd_tile(T, cfg, num_tokens)

        if cfg.hidden_inner:

            @T.prim_func
            def mhc_pre_apply_mix_fwd_kernel(
                x: T.Tensor((num_tokens, mhc, hidden), bf16),
                mix: T.Tensor((num_tokens, mhc), f32),
                o: T.Tensor((num_tokens, hidden), bf16),
            ):
                # One grid dimension: the token tiles can exceed gridDim.y's 65535; tiles * hidden blocks is at
                # most tokens * hidden / 64 < 2**31.
                with T.Kernel(T.ceildiv(num_tokens, bt) * hidden_blocks, threads=cfg.threads) as pid:
                    _accumulate_and_store(x, mix, pid // hidden_blocks, o, pid // hidden_blocks, pid % hidden_blocks)

        else:

            @T.prim_func
            def mhc_pre_apply_mix_fwd_kernel(
                x: T.Tensor((num_tokens, mhc, hidden), bf16),
                mix: T.Tensor((num_tokens, mhc), f32),
                o: T.Tensor((num_tokens, hidden), bf16),
            ):
                with T.Kernel(T.ceildiv(num_tokens, bt), hidden_blocks, threads=cfg.threads) as (bx, by):
                    _accumulate_and_store(x, mix, bx, o, bx, by)

        return mhc_pre_apply_mix_fwd_kernel

    @T.prim_func
    def mhc_pre_apply_mix_bwd_kernel(
        o_grad: T.Tensor((num_tokens, hidden), bf16),
        x: T.Tensor((num_tokens, mhc, hidden), bf16),
        mix: T.Tensor((num_tokens, mhc), f32),
        x_grad: T.Tensor((num_tokens, mhc, hidden), bf16),
        mix_grad: T.Tensor((num_tokens, mhc), f32),
    ):
        with T.Kernel(num_tokens, threads=cfg.threads) as t:
            acc = T.alloc_fragment((mhc, bh), f32)
            total = T.alloc_fragment((mhc,), f32)
            # Whole vectors per thread (the reduction alone would give each thread 8-byte pieces of a row).
            T.annotate_layout({acc: T.Fragment((mhc, bh), forward_thread_fn=_thread_of, forward_index_fn=_slot_of)})
            # Enough resident threads per SM to keep the loads in flight: ptxas keeps the registers to that.
            T.annotate_min_blocks_per_sm(cfg.resident_threads // threads)
            T.clear(acc)
            for b in T.serial(hidden // bh):
                for m, j in T.Parallel(mhc, bh):
                    acc[m, j] += T.cast(o_grad[t, b * bh + j], f32) * T.cast(x[t, m, b * bh + j], f32)
                for m, j in T.Parallel(mhc, bh):
                    x_grad[t, m, b * bh + j] = T.cast(
                        T.cast(x_grad[t, m, b * bh + j], f32) + mix[t, m] * T.cast(o_grad[t, b * bh + j], f32), bf16
                    )
            T.reduce_sum(acc, total, dim=1)
            for m in T.Parallel(mhc):
                mix_grad[t, m] = total[m]

    return mhc_pre_apply_mix_bwd_kernel
