"""Ascend 950 kernel of apply_rotary (math, layout and config: apply_rotary_kernel.py).

A persistent loop over (token tile, head group) tasks on the vector cores, `cfg.num_stages` buffer versions so
that the DMAs of the next task overlap the vector work of this one. Per task, token by token: the head group's
rows of x (one 2-D DMA through x's strides) and the token's cos/sin row of the cache (row from positions and
seqlen_offset, clamped) land in UB; one SIMD VF rotates the tile into a second tile; that goes back to x, token by
token.

The VF works in fp32 registers of 64 lanes (16-bit x widens exactly with UNPK_B16 loads and is narrowed back by
vcvt, nearest even, and a packing store). A head's pairs are taken 64 at a time ("chunks", rot_dim / 128 rounded
up): NeoX loads the chunk's first halves and second halves directly (x[j], x[j + rot_dim / 2]); GPT-J loads 128
consecutive elements as two registers and de-interleaves them (asc_deintlv), interleaving the results back
before the stores. The cos/sin registers of a chunk are loaded once per token and serve all its heads.

Partial chunks (rot_dim / 2 not a multiple of 64) are not masked: their loads read up to `ascend_overread` elements
past the head (the next head's elements, or the pad rows of the tiles: computed on, never stored to GM) and their
stores write as far past it into the rotated tile. Every such stray lane lands where a later store of the same VF
writes the right value (the stores of one VF are in program order): the chunks go last to first, and within a
chunk heads in order, so a partial chunk's overflow into the second half (NeoX) or into the next head is
overwritten by chunk 0, whose stores never overflow when there are two chunks (rot_dim / 2 >= 64).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

ASCEND_LANES = 64  # fp32 lanes of one 256-byte vector register


def ascend_overread(rot_dim: int) -> int:
    """Elements past a head's end that its partial-chunk loads read (and stores write): GPT-J's two registers per
    chunk reach twice as far as NeoX's second half."""
    half = rot_dim // 2
    chunks = -(-half // ASCEND_LANES)
    return 2 * (chunks * ASCEND_LANES - half)


def ascend_apply_rotary_kernel(cfg):
    """`cfg` is an ApplyRotaryConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32 = T.float32
    lanes = ASCEND_LANES
    dtype, rot_dim, half, interleaved = cfg.dtype, cfg.rot_dim, cfg.half, cfg.interleaved
    hg, bt, stages, grid = cfg.head_group, cfg.block_tokens, cfg.num_stages, cfg.num_cores
    n_groups = cfg.heads // hg
    chunks = -(-half // lanes)
    x_pad = -(-ascend_overread(rot_dim) // rot_dim)  # head rows after the tile for the last head's overflow
    cs_pad = -(-(chunks * lanes - half) // rot_dim)  # cache rows after the tile for the last sin load
    has_positions = cfg.positions != 'none'

    batch = T.dynamic('batch')
    seqlen = T.dynamic('seqlen')
    seqlen_ro = T.dynamic('seqlen_ro')
    x_sb = T.dynamic('x_stride_b')
    x_ss = T.dynamic('x_stride_s')
    x_sh = T.dynamic('x_stride_h')
    cs_stride = T.dynamic('cos_sin_stride')
    pos_stride = T.dynamic('positions_stride')
    num_tokens = batch * seqlen

    @T.macro
    def load_f32(buf, i, col):
        if dtype == 'float32':
            return S.vld(buf[i, col])
        return S.vcvt(S.vld(buf[i, col], dist='UNPK_B16'), f32)

    @T.macro
    def store_f32(buf, i, col, value):
        if dtype == 'float32':
            S.vsts(buf[i, col], value)
        else:
            # 16-bit results in the low half of each 32-bit lane, packed by the store
            S.vsts(buf[i, col], S.vcvt(value, dtype, sat=False), dist='PK_B32')

    @T.macro
    def rotate_vf(x_ub, y_ub, cs_ub, rows, sin_sign):
        with T.SimdVF():
            for r in T.serial(rows):
                for c in range(chunks - 1, -1, -1):  # last chunk first: see the module docstring
                    cosine = S.alloc_var(f32)
                    sine = S.alloc_var(f32)
                    neg_sine = S.alloc_var(f32)
                    cosine = S.vld(cs_ub[r, c * lanes])
                    sine = S.vmuls(S.vld(cs_ub[r, half + c * lanes]), sin_sign)
                    neg_sine = S.vneg(sine)
                    for h in T.serial(hg):
                        i = r * hg + h
                        if interleaved:
                            x1, x2 = S.vdintlv(load_f32(x_ub, i, 2 * c * lanes), load_f32(x_ub, i, (2 * c + 1) * lanes))
                        else:
                            x1 = load_f32(x_ub, i, c * lanes)
                            x2 = load_f32(x_ub, i, half + c * lanes)
                        y1 = S.alloc_var(f32)
                        y2 = S.alloc_var(f32)
                        y1 = S.vmul(x2, neg_sine)
                        S.vmula(y1, x1, cosine)  # fma(x1, cos, -(x2 * sin))
                        y2 = S.vmul(x1, sine)
                        S.vmula(y2, x2, cosine)  # fma(x2, cos, x1 * sin)
                        if interleaved:
                            z1, z2 = S.vintlv(y1, y2)
                            store_f32(y_ub, i, 2 * c * lanes, z1)
                            store_f32(y_ub, i, (2 * c + 1) * lanes, z2)
                        else:
                            store_f32(y_ub, i, c * lanes, y1)
                            store_f32(y_ub, i, half + c * lanes, y2)

    @T.macro
    def body(x, cos_sin, positions, seqlen_offset, sin_sign):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((bt * hg + x_pad, rot_dim), dtype)
            y_ub = T.alloc_shared((bt * hg + x_pad, rot_dim), dtype)
            cs_ub = T.alloc_shared((bt + cs_pad, rot_dim), f32)
            T.annotate_buffer_versions({x_ub: stages, y_ub: stages, cs_ub: stages})
            num_tasks = T.ceildiv(num_tokens, bt) * n_groups
            for task in T.Persistent([num_tasks], grid, cid, group_size=1, num_stages=stages):
                n0 = (task // n_groups) * bt
                h0 = (task % n_groups) * hg
                rows = T.min(bt, num_tokens - n0)
                for r in T.serial(bt):
                    if r < rows:
                        b = (n0 + r) // seqlen
                        s = (n0 + r) % seqlen
                        T.copy(x[b, s, h0 : h0 + hg, :], x_ub[r * hg : r * hg + hg, :])
                        if has_positions:
                            # int64, clamped into the cache: an out-of-range position reads its first or last row
                            p = T.cast(positions[b, s], 'int64') + T.cast(seqlen_offset, 'int64')
                            row = T.cast(T.max(T.min(p, T.cast(seqlen_ro - 1, 'int64')), T.cast(0, 'int64')), 'int32')
                            T.copy(cos_sin[row, :], cs_ub[r, :])
                        else:
                            T.copy(cos_sin[s + seqlen_offset, :], cs_ub[r, :])
                rotate_vf(x_ub, y_ub, cs_ub, rows, sin_sign)
                for r in T.serial(bt):
                    if r < rows:
                        b = (n0 + r) // seqlen
                        s = (n0 + r) % seqlen
                        T.copy(y_ub[r * hg : r * hg + hg, :], x[b, s, h0 : h0 + hg, :])

    x_type = T.StridedTensor((batch, seqlen, cfg.heads, rot_dim), (x_sb, x_ss, x_sh, 1), dtype)
    cs_type = T.StridedTensor((seqlen_ro, rot_dim), (cs_stride, 1), f32)
    if has_positions:

        @T.prim_func
        def apply_rotary_kernel(
            x: x_type,
            cos_sin_cache: cs_type,
            positions: T.StridedTensor((batch, seqlen), (pos_stride, 1), cfg.positions),
            seqlen_offset: T.int32,
            sin_sign: T.float32,
        ):
            body(x, cos_sin_cache, positions, seqlen_offset, sin_sign)

    else:

        @T.prim_func
        def apply_rotary_kernel(x: x_type, cos_sin_cache: cs_type, seqlen_offset: T.int32, sin_sign: T.float32):
            body(x, cos_sin_cache, None, seqlen_offset, sin_sign)

    return apply_rotary_kernel
