"""CUDA kernel body of engram_hash (math, the floormod without division, config and the prim_func
signature: engram_hash_kernel.py).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_hash_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`, the prim_func signature as `prim_func`.
_INT64_MAX = 2**63 - 1


def cuda_engram_hash_kernel(cfg, prim_func):
    """`cfg` is an EngramHashConfig (backend "cuda"); `prim_func` the signature builder _engram_hash_prim_func."""
    import tilelang.language as T

    L, N, E, K = cfg.num_layers, cfg.max_ngram, cfg.num_tables, cfg.num_cols
    has_mask = cfg.has_mask
    B, nt = cfg.block_tokens, cfg.threads
    per_thread = T.ceildiv(B * K, nt)
    num_tokens = T.dynamic('num_tokens')
    u64, i64 = T.uint64, T.int64

    @T.macro
    def body(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out):
        # One layer per grid row, so that a block needs the reciprocals of K divisors only.
        with T.Kernel(T.ceildiv(num_tokens, B), L, threads=nt) as (bx, layer):
            tid = T.get_thread_binding()
            divisor = T.alloc_shared((K,), u64)  # |vocab size|
            # 2 * floor((2**63 - 1) / divisor), within 2 * divisor of 2**64 / divisor; 0 for a zero size
            reciprocal = T.alloc_shared((K,), u64)
            for c in T.serial(T.ceildiv(K, nt)):
                col = c * nt + tid
                if col < K:
                    size = T.cast(vocab_sizes[layer, col // E, col % E], i64)
                    magnitude = T.cast(T.if_then_else(size < 0, -size, size), u64)
                    divisor[col] = magnitude
                    reciprocal[col] = T.if_then_else(
                        magnitude == T.uint64(0), T.uint64(0), T.uint64(_INT64_MAX) // magnitude * T.uint64(2)
                    )
            T.sync_threads()
            for q in T.serial(per_thread):
                idx = q * nt + tid
                i = idx // K
                k = idx % K
                t = bx * B + i
                if i < B and t < num_tokens:
                    n = k // E  # order n + 2
                    h = T.alloc_var(u64)
                    h = T.cast(T.cast(ngram_token_ids[t, 0], i64), u64) * T.cast(multipliers[layer, 0], u64)
                    for j in T.unroll(1, N):
                        if j <= n + 1:
                            h = h ^ (
                                T.cast(T.cast(ngram_token_ids[t, j], i64), u64) * T.cast(multipliers[layer, j], u64)
                            )
                    # floormod(int64(h), size) without a 64-bit division (the module docstring).
                    d = divisor[k]
                    # The sign bit by a shift: TVM's simplifier takes a cast from uint64 to be >= 0.
                    negative_h = (h >> T.uint64(63)) != T.uint64(0)
                    a = T.if_then_else(negative_h, ~h, h)  # -h - 1 >= 0 for a negative h
                    r = T.alloc_var(u64)
                    r = a - T.call_pure_extern(u64, '__umul64hi', a, reciprocal[k]) * d
                    r = T.if_then_else(r >= d, r - d, r)
                    r = T.if_then_else(r >= d, r - d, r)
                    r = T.if_then_else(negative_h, d - T.uint64(1) - r, r)
                    row = T.cast(r, i64)
                    row = T.if_then_else(
                        T.cast(vocab_sizes[layer, n, k % E], i64) < 0 and row != 0, row - T.cast(d, i64), row
                    )
                    value = T.cast(row + T.cast(offsets[layer, k], i64), T.int32)
                    if has_mask:
                        out[layer, t, k] = T.if_then_else(image_token_mask[t], T.int32(-1), value)
                    else:
                        out[layer, t, k] = value

    return prim_func(T, body, cfg=cfg, num_tokens=num_tokens)
