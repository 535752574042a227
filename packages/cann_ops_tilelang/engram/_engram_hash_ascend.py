"""Ascend 950 kernel body of engram_hash (math, config and the prim_func signature: engram_hash_kernel.py)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_hash_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`, the prim_func signature as `prim_func`.


def ascend_engram_hash_kernel(cfg, prim_func):
    """`cfg` is an EngramHashConfig (backend "ascend"); `prim_func` the signature builder _engram_hash_prim_func."""
    import tilelang.ascend.language as T

    L, N, E, K = cfg.num_layers, cfg.max_ngram, cfg.num_tables, cfg.num_cols
    has_mask = cfg.has_mask
    B, num_cores, threads, stages = cfg.block_tokens, cfg.num_cores, cfg.threads, cfg.num_stages
    num_tokens = T.dynamic('num_tokens')

    @T.macro
    def body(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out):
        with T.Kernel(num_cores) as cid:
            ids_ub = T.alloc_shared((B, N), T.int32)
            m_ub = T.alloc_shared((L, N), T.int64)
            v_ub = T.alloc_shared((L, N - 1, E), T.int32)
            o_ub = T.alloc_shared((L, K), T.int32)
            r_ub = T.alloc_shared((B, K), T.int32)
            if has_mask:
                mask_ub = T.alloc_shared((B,), T.bool)  # image_token_mask of the block
            T.copy(multipliers, m_ub)
            T.copy(vocab_sizes, v_ub)
            T.copy(offsets, o_ub)
            for blk in T.Persistent([T.ceildiv(num_tokens, B)], num_cores, cid, group_size=1, num_stages=stages):
                t0 = blk * B
                nv = T.min(B, num_tokens - t0)
                T.copy(ngram_token_ids[t0 : t0 + B, :], ids_ub)  # tail rows clamped by the DMA
                if has_mask:
                    T.copy(image_token_mask[t0 : t0 + nv], mask_ub[0:nv])
                for layer in T.serial(L):
                    with T.SimtVF(threads=threads):
                        for i, k in T.Parallel(B, K):
                            n = k // E  # order n + 2
                            h = T.alloc_var(T.uint64)
                            h = T.cast(T.cast(ids_ub[i, 0], T.int64), T.uint64) * T.cast(m_ub[layer, 0], T.uint64)
                            for j in T.unroll(1, N):
                                if j <= n + 1:
                                    h = h ^ (
                                        T.cast(T.cast(ids_ub[i, j], T.int64), T.uint64)
                                        * T.cast(m_ub[layer, j], T.uint64)
                                    )
                            row = T.floormod(T.cast(h, T.int64), T.cast(v_ub[layer, n, k % E], T.int64))
                            if has_mask:
                                r_ub[i, k] = T.if_then_else(
                                    mask_ub[i], T.int32(-1), T.cast(row + T.cast(o_ub[layer, k], T.int64), T.int32)
                                )
                            else:
                                r_ub[i, k] = T.cast(row + T.cast(o_ub[layer, k], T.int64), T.int32)
                    T.copy(r_ub[:nv, :], out[layer, t0 : t0 + nv, :])

    return prim_func(T, body, cfg=cfg, num_tokens=num_tokens)
