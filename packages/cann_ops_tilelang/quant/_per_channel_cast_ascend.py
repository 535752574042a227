"""Ascend 950 kernel of per_channel_cast (math and config: per_channel_cast_kernel.py).

A persistent loop over (token block, column tile) tasks on the vector cores, its x and out tiles (block_tokens x
block_k, at most 96 KiB per buffer version) double-buffered so that the next task's DMA overlaps the vector work.
With packed UE8M0 scales a task is (four token blocks, column tile), the blocks handled one after another, so
that the task owns whole scale words. Per token block the rows' slice lands in UB (the last block's rows only as
far as T goes; for a pre-quantised x also the rows' input scales) and one SIMD VF makes three passes over it, in
fp32 (bf16 widens exactly; a pre-quantised x decodes as fp32(x) times its fp32, UE8M0 or E4M3 scale widened,
broadcast per row and input block): the column maxima, a running element-wise max of |x| over the block's rows,
64 channels per register; the scale factors and their inverses for 64 channels per register (the domain's shared
rule); then x * inverse narrowed to float8_e4m3fn, row by row. The fp8 rows and the scale row (or, packed, the
task's scale words, each token block's exponent ORed into its byte, once its four blocks are done) go back to GM.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_channel_cast_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
from ._scale_rules import LANES, UE8M0_PACK, ascend_scales_macro


def _accumulators(chunks: int) -> int:
    """Registers of column maxima kept live per pass over the rows: 4, 2 or 1, dividing `chunks`."""
    return next(a for a in (4, 2, 1) if chunks % a == 0)


def ascend_per_channel_cast_kernel(cfg):
    """`cfg` is a PerChannelCastConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32 = T.float32
    hidden, bk, bt, stages = cfg.hidden, cfg.block_k, cfg.block_tokens, cfg.num_stages
    in_dtype, sf_dtype = cfg.in_dtype, cfg.sf_dtype
    n_tiles = cfg.num_col_tiles
    chunks = bk // LANES
    acc_regs = _accumulators(chunks)
    packed = cfg.packed_ue8m0
    group = cfg.sf_pack  # token blocks per task
    grid = cfg.num_cores
    # Packed output: the shared rule's fp32 power of two, its exponent moved into byte j of the channel's word.
    scales = ascend_scales_macro(T, round_sf=cfg.round_sf, packed_ue8m0=False)

    prequantised = cfg.in_block_channels is not None
    if prequantised:
        in_bc, in_sf_dtype, in_sf_cols = cfg.in_block_channels, cfg.in_sf_dtype, cfg.in_sf_cols
        in_scales = bk // in_bc  # input scales of one row of a task
        per_32_bytes = 32 // (1 if cfg.in_packed_ue8m0 or cfg.in_e4m3_sf else 4)
        in_scales_padded = -(-in_scales // per_32_bytes) * per_32_bytes  # UB rows 32-byte aligned
    else:  # the kernel takes no x_sf
        in_bc = in_sf_dtype = in_sf_cols = in_scales = in_scales_padded = None

    num_tokens = T.dynamic('num_tokens')
    num_blocks = T.ceildiv(num_tokens, bt)
    sf_rows = T.ceildiv(num_blocks, group)

    @T.macro
    def input_scale(xs_ub, i, k):
        """fp32 register of row i's input scale k (of the task's columns), in every lane."""
        if cfg.in_e4m3_sf:
            # The e4m3 byte in every byte lane, so whichever byte of a 32-bit lane the conversion widens is it.
            return S.vcvt(S.vld(xs_ub[i, k], dist='BRC_B8'), f32)
        if cfg.in_packed_ue8m0:
            # The byte in every byte lane; its low copy shifted into the fp32 exponent: 2 ** (byte - 127).
            byte = S.vand(T.reinterpret(S.vld(xs_ub[i, k], dist='BRC_B8'), 'uint32x64'), S.vdup(0xFF, T.uint32))
            return T.reinterpret(S.vshls(byte, 23), 'float32x64')
        return S.vld(xs_ub[i, k], dist='BRC_B32')

    @T.macro
    def load_f32(x_ub, xs_ub, i, c, low):
        """Row i, channels 64 c .. 64 c + 63 of the tile as fp32 (a pre-quantised x decoded: fp32(x) * scale)."""
        if prequantised:
            raw = S.vcvt(S.vld(x_ub[i, c * LANES], dist='UNPK4_B8'), f32)
            if in_bc == LANES // 2:
                scale = S.vsel(input_scale(xs_ub, i, 2 * c), input_scale(xs_ub, i, 2 * c + 1), low)
            else:
                scale = input_scale(xs_ub, i, c * LANES // in_bc)
            return S.vmul(raw, scale)
        if in_dtype == 'bfloat16':
            return S.vcvt(S.vld(x_ub[i, c * LANES], dist='UNPK_B16'), f32)
        return S.vld(x_ub[i, c * LANES])

    @T.macro
    def cast_vf(x_ub, xs_ub, amax_ub, inv_ub, sf_ub, out_ub, rows):
        with T.SimdVF():
            # Lanes 0..31: the first 32-channel input scale block of a register.
            low = S.pset(32, 'PAT_VL32') if prequantised and in_bc == LANES // 2 else None
            # Pass 1: column maxima of |x| over the block's rows, `acc_regs` registers of 64 channels at a time.
            for p in T.serial(chunks // acc_regs):
                acc = S.alloc_local((acc_regs,), f32)
                for a in T.unroll(acc_regs, explicit=True):
                    acc[a] = S.vdup(0.0, f32)
                for i in T.serial(rows):
                    for a in T.unroll(acc_regs, explicit=True):
                        acc[a] = S.vmax(acc[a], S.vabs(load_f32(x_ub, xs_ub, i, p * acc_regs + a, low)))
                for a in T.unroll(acc_regs, explicit=True):
                    S.vsts(amax_ub[(p * acc_regs + a) * LANES], acc[a])
            S.mem_bar('VST_VLD')
            # Pass 2: scales and inverses, 64 channels per register.
            scales(amax_ub, sf_ub, inv_ub, bk)
            S.mem_bar('VST_VLD')
            # Pass 3: x * inverse -> e4m3 (nearest even, saturating), one byte per fp32 lane, packed.
            for c in T.serial(chunks):
                inverse = S.vld(inv_ub[c * LANES])
                for i in T.serial(rows):
                    scaled = S.vmul(load_f32(x_ub, xs_ub, i, c, low), inverse)
                    S.vsts(out_ub[i, c * LANES], S.vcvt(scaled, T.float8_e4m3fn), dist='PK4_B32')

    @T.macro
    def pack_vf(sf_ub, words_ub, j):
        """Byte j of each channel's scale word: the biased exponent of the fp32 power of two in sf_ub (the words
        were zeroed when the task started, so bytes of token blocks past the last stay zero)."""
        with T.SimdVF():
            for c in T.serial(chunks):
                exponent = S.vshrs(T.reinterpret(S.vld(sf_ub[c * LANES]), 'uint32x64'), 23)
                word = T.reinterpret(S.vld(words_ub[c * LANES * UE8M0_PACK]), 'uint32x64')
                word = S.vor(word, S.vshls(exponent, j * 8))
                S.vsts(words_ub[c * LANES * UE8M0_PACK], T.reinterpret(word, 'uint8x256'), dist='NORM_B8')

    @T.macro
    def zero_vf(words_ub):
        with T.SimdVF():
            for c in T.serial(chunks):
                S.vsts(words_ub[c * LANES * UE8M0_PACK], S.vdup(0, T.uint8), dist='NORM_B8')

    @T.macro
    def load(x, x_sf, x_ub, xs_ub, t0, rows, col):
        T.copy(x[t0 : t0 + rows, col : col + bk], x_ub[0:rows, :])
        if prequantised:
            k0 = col // in_bc
            T.copy(x_sf[t0 : t0 + rows, k0 : k0 + in_scales], xs_ub[0:rows, 0:in_scales])

    @T.macro
    def body(x, x_sf, out, out_sf):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((bt, bk), in_dtype)
            out_ub = T.alloc_shared((bt, bk), T.float8_e4m3fn)
            amax_ub = T.alloc_shared((bk,), f32)
            inv_ub = T.alloc_shared((bk,), f32)
            sf_ub = T.alloc_shared((bk,), f32)
            versions = {x_ub: stages, out_ub: stages, amax_ub: 1, inv_ub: 1}
            if prequantised:
                xs_ub = T.alloc_shared((bt, in_scales_padded), in_sf_dtype)
                versions[xs_ub] = stages
            else:
                xs_ub = None  # the macros read input scales only for a pre-quantised x
            if packed:
                words_ub = T.alloc_shared((bk * UE8M0_PACK,), T.uint8)
                versions[sf_ub] = 1
                versions[words_ub] = stages
            else:
                versions[sf_ub] = stages
            T.annotate_buffer_versions(versions)
            for task in T.Persistent([sf_rows * n_tiles], grid, cid, group_size=1, num_stages=stages):
                r = task // n_tiles
                col = task % n_tiles * bk
                if packed:
                    zero_vf(words_ub)
                    for j in T.serial(group):
                        t0 = (r * group + j) * bt
                        if t0 < num_tokens:
                            rows = T.min(bt, num_tokens - t0)
                            load(x, x_sf, x_ub, xs_ub, t0, rows, col)
                            cast_vf(x_ub, xs_ub, amax_ub, inv_ub, sf_ub, out_ub, rows)
                            pack_vf(sf_ub, words_ub, j)
                            T.copy(out_ub[0:rows, :], out[t0 : t0 + rows, col : col + bk])
                    T.copy(words_ub, out_sf[r, col * UE8M0_PACK : (col + bk) * UE8M0_PACK])
                else:
                    t0 = r * bt
                    rows = T.min(bt, num_tokens - t0)
                    load(x, x_sf, x_ub, xs_ub, t0, rows, col)
                    cast_vf(x_ub, xs_ub, amax_ub, inv_ub, sf_ub, out_ub, rows)
                    T.copy(out_ub[0:rows, :], out[t0 : t0 + rows, col : col + bk])
                    T.copy(sf_ub, out_sf[r, col : col + bk])

    if prequantised:

        @T.prim_func
        def per_channel_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            x_sf: T.Tensor((num_tokens, in_sf_cols), in_sf_dtype),
            out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
            out_sf: T.Tensor((sf_rows, cfg.sf_cols), sf_dtype),
        ):
            body(x, x_sf, out, out_sf)

        return per_channel_cast_kernel

    @T.prim_func
    def per_channel_cast_kernel(
        x: T.Tensor((num_tokens, hidden), in_dtype),
        out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
        out_sf: T.Tensor((sf_rows, cfg.sf_cols), sf_dtype),
    ):
        body(x, None, out, out_sf)

    return per_channel_cast_kernel
