"""CUDA kernel of apply_rotary (math, layout and config: apply_rotary_kernel.py).

A streaming kernel: each element of query and key is read once and written once, in place, in one launch for
both; the cos/sin row of a token is read once per thread and serves the thread's heads (an L1 / L2 hit for all
but the first thread of the token).

Work split. A token's heads form groups, query's then key's: group g of a tensor with G groups holds the heads
h = i * G + g, i < heads_per_thread (4, 2 or 1, the most that divides its heads). Thread (token, group, unit u)
rotates `vec` consecutive pairs (u * vec ..) of its group's heads: the lanes of a warp are consecutive units, then
consecutive groups, so for one i a warp's accesses cover whole contiguous head rows. NeoX reads the two halves of
its pairs as two `vec`-element accesses, GPT-J the 2 * vec consecutive elements as two accesses; 16 bytes each
where the addresses and strides allow (`vec` from the interface, narrower otherwise). A thread issues all its
loads (up to 4 heads, 128 bytes) before the first use. A thread block holds `tokens_per_block` tokens of
`groups_per_block` groups (up to 256 threads); the grid is flat over (token tile, group chunk), chunks fastest.
Query and key differ only in which tensor, strides and head count a thread's group selects.

Per pair, in fp32: s = sin * sin_sign, x1' = fma(x1, cos, -(x2 * s)), x2' = fma(x2, cos, x1 * s) (explicit
fused multiply-adds, so the roundings are those of the Ascend kernel whatever the compiler contracts), rounded to
x's dtype (nearest even).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

_HEADS_PER_THREAD = (4, 2, 1)  # heads a thread rotates with one cos/sin load


def heads_per_thread(heads: int) -> int:
    """Heads one thread rotates: the most of _HEADS_PER_THREAD that divides `heads`."""
    return next(h for h in _HEADS_PER_THREAD if heads % h == 0)


def cuda_apply_rotary_kernel(cfg):
    """`cfg` is an ApplyRotaryConfig (backend "cuda")."""
    import tilelang.language as T

    f32 = T.float32
    dtype, rot_dim, half, interleaved = cfg.dtype, cfg.rot_dim, cfg.half, cfg.interleaved
    vec, cs_vec, units = cfg.vec, cfg.cs_vec, cfg.units
    gpb, tpb, chunks, threads = cfg.groups_per_block, cfg.tokens_per_block, cfg.chunks, cfg.threads
    q_groups, all_groups = cfg.groups, cfg.all_groups
    has_key, has_positions = cfg.key_heads > 0, cfg.positions != 'none'
    q_per = heads_per_thread(cfg.heads)
    k_per = heads_per_thread(cfg.key_heads) if has_key else 1
    block_threads = gpb * units  # threads of one token in a block

    batch = T.dynamic('batch')
    seqlen = T.dynamic('seqlen')
    seqlen_ro = T.dynamic('seqlen_ro')
    q_sb = T.dynamic('query_stride_b')
    q_ss = T.dynamic('query_stride_s')
    q_sh = T.dynamic('query_stride_h')
    k_sb = T.dynamic('key_stride_b')
    k_ss = T.dynamic('key_stride_s')
    k_sh = T.dynamic('key_stride_h')
    cs_stride = T.dynamic('cos_sin_stride')
    pos_stride = T.dynamic('positions_stride')
    num_tokens = batch * seqlen

    @T.macro
    def rotate(x, xv, cs, b, s, g, groups, per_thread, col, sin_sign):
        """The pairs col .. col + vec - 1 of x's heads i * groups + g (i < per_thread), in place."""
        for i in T.unroll(per_thread):
            for k in T.unroll(2):
                start = (2 * col + k * vec) if interleaved else (col + k * half)
                for e in T.vectorized(vec):
                    xv[i, k * vec + e] = x[b, s, i * groups + g, start + e]
        for i in T.unroll(per_thread):
            for j in T.unroll(vec):
                a = 2 * j if interleaved else j  # where x1 and x2 of pair j sit in xv[i]
                z = 2 * j + 1 if interleaved else vec + j
                x1 = T.cast(xv[i, a], f32)
                x2 = T.cast(xv[i, z], f32)
                sine = cs[vec + j] * sin_sign
                xv[i, a] = T.cast(T.ieee_fmaf(x1, cs[j], -(x2 * sine)), dtype)
                xv[i, z] = T.cast(T.ieee_fmaf(x2, cs[j], x1 * sine), dtype)
        for i in T.unroll(per_thread):
            for k in T.unroll(2):
                start = (2 * col + k * vec) if interleaved else (col + k * half)
                for e in T.vectorized(vec):
                    x[b, s, i * groups + g, start + e] = xv[i, k * vec + e]

    @T.macro
    def body(query, key, cos_sin, positions, seqlen_offset, sin_sign):
        with T.Kernel(T.ceildiv(num_tokens, tpb) * chunks, threads=threads) as bid:
            # The host launches only non-empty tensors and guarantees starts and strides aligned to the accesses.
            T.evaluate(T.assume(seqlen > 0))
            for stride in (q_sb, q_ss, q_sh, *((k_sb, k_ss, k_sh) if has_key else ())):
                T.evaluate(T.assume(stride % vec == 0))
            T.evaluate(T.assume(cs_stride % cs_vec == 0))
            tid = T.get_thread_binding()
            n = (bid // chunks) * tpb + tid // block_threads
            g = (bid % chunks) * gpb + tid % block_threads // units  # query's groups, then key's
            col = tid % units * vec  # the thread's first pair
            xv = T.alloc_local((max(q_per, k_per), 2 * vec), dtype)  # NeoX: [x1s, x2s]; GPT-J: the pairs
            cs = T.alloc_local((2 * vec,), f32)  # [cos, sin] of the thread's pairs
            if n < num_tokens and g < all_groups:
                b = n // seqlen
                s = n % seqlen
                row = T.alloc_var(T.int32)
                if has_positions:
                    # int64, clamped into the cache: an out-of-range position reads its first or last row
                    p = T.cast(positions[b, s], 'int64') + T.cast(seqlen_offset, 'int64')
                    row = T.cast(T.max(T.min(p, T.cast(seqlen_ro - 1, 'int64')), T.cast(0, 'int64')), 'int32')
                else:
                    row = s + seqlen_offset
                for k in T.unroll(2):
                    for m in T.unroll(vec // cs_vec):
                        for e in T.vectorized(cs_vec):
                            cs[k * vec + m * cs_vec + e] = cos_sin[row, k * half + col + m * cs_vec + e]
                if has_key:
                    if g < q_groups:
                        rotate(query, xv, cs, b, s, g, q_groups, q_per, col, sin_sign)
                    else:
                        rotate(key, xv, cs, b, s, g - q_groups, all_groups - q_groups, k_per, col, sin_sign)
                else:
                    rotate(query, xv, cs, b, s, g, q_groups, q_per, col, sin_sign)

    q_type = T.StridedTensor((batch, seqlen, cfg.heads, rot_dim), (q_sb, q_ss, q_sh, 1), dtype)
    k_type = T.StridedTensor((batch, seqlen, max(1, cfg.key_heads), rot_dim), (k_sb, k_ss, k_sh, 1), dtype)
    cs_type = T.StridedTensor((seqlen_ro, rot_dim), (cs_stride, 1), f32)
    pos_type = T.StridedTensor((batch, seqlen), (pos_stride, 1), cfg.positions if has_positions else 'int32')
    if has_key and has_positions:

        @T.prim_func
        def apply_rotary_kernel(
            query: q_type,
            key: k_type,
            cos_sin_cache: cs_type,
            positions: pos_type,
            seqlen_offset: T.int32,
            sin_sign: T.float32,
        ):
            body(query, key, cos_sin_cache, positions, seqlen_offset, sin_sign)

    elif has_key:

        @T.prim_func
        def apply_rotary_kernel(
            query: q_type, key: k_type, cos_sin_cache: cs_type, seqlen_offset: T.int32, sin_sign: T.float32
        ):
            body(query, key, cos_sin_cache, None, seqlen_offset, sin_sign)

    elif has_positions:

        @T.prim_func
        def apply_rotary_kernel(
            query: q_type, cos_sin_cache: cs_type, positions: pos_type, seqlen_offset: T.int32, sin_sign: T.float32
        ):
            body(query, None, cos_sin_cache, positions, seqlen_offset, sin_sign)

    else:

        @T.prim_func
        def apply_rotary_kernel(query: q_type, cos_sin_cache: cs_type, seqlen_offset: T.int32, sin_sign: T.float32):
            body(query, None, cos_sin_cache, None, seqlen_offset, sin_sign)

    return apply_rotary_kernel
