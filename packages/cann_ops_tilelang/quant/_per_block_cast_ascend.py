"""Ascend 950 kernel of per_block_cast (math and config: per_block_cast_kernel.py).

A persistent loop over (token block, column tile) tasks on the vector cores: task (b, j) owns the rows
b * bt .. b * bt + rows - 1 (rows = bt, fewer in the last token block) and the channels j * block_k ..
(j + 1) * block_k - 1. Its x tile lands in UB (one 2-D DMA, only the rows that exist), and one SIMD VF makes
up to three passes over it, in fp32 (bf16 widens exactly):

1. block maxima: per 64-lane register column a running |x| maximum over the tile's rows (vmax, one register
   live per column), then one cross-lane vcmax per channel block (four masked quarters for bc = 16, two masked
   halves for bc = 32, two register columns merged first for bc = 128);
2. the scales and inverses of the tile's channel blocks, 64 per register (_scale_rules.ascend_cast_scales_macro:
   fp32, power-of-two, UE8M0 or E4M3 scales of either output format), or in mode 'precomputed' the inverses
   1 / sf of the scales DMA'd in (fp32 or e4m3);
3. x * inverse narrowed to float8_e4m3fn, register column by register column (the inverse broadcast once per
   column), row by row; or (FP4) rounded to e2m1 codes by compares on the grid's midpoints (fp4.py), two
   register columns at a time, each row's 128 codes deinterleaved and packed into 64 bytes. Where an e4m3
   product can pass 448 (given scales, E4M3 scales that saturate or round down) it is clamped to +-448 first
   (compare and select, so NaN stays NaN): no kernel relies on the conversion's saturation setting; the
   computed fp32 / power-of-two scales cannot overflow, and the e2m1 rounding saturates by construction.

The data tile and the scale row slice go back to GM; the task of the last column tile also writes the zero
padding bytes of a packed UE8M0 row (its copy is a few bytes longer).

Column-major scales (cfg.col_major_sf): the task's scales leave UB as they are in one DMA whose bursts are single
scales (fp32 4 bytes, E4M3 1 byte) or packed UE8M0 words, each to the next row of the transposed GM view (its row
stride a launch argument), as in per_token_cast. A task of UE8M0 scales that does not hold whole words (the chooser
avoids it where a whole-word task fits the x buffer; not so for e.g. 128 x 128 blocks of bf16, 2 blocks a task)
stores its bytes one DMA each, byte k at word k // 4, byte 4 b + k % 4 of the byte view, each from a 32-byte
block of its own (a DMA's UB source is 32-byte aligned: the VF spreads the bytes with one broadcast load and
one single-lane store each).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_block_cast_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
from ._per_token_cast_ascend import ascend_quarter_masks_macro
from ._scale_rules import (
    LANES,
    UE8M0_PACK,
    ascend_cast_scales_macro,
    ascend_e4m3_sf_inverses_macro,
    ascend_precomputed_macros,
    col_major_scales,
)
from .fp4 import ascend_e2m1_macros


def ascend_per_block_cast_kernel(cfg):
    """`cfg` is a PerBlockCastConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32 = T.float32
    hidden, bk, bt, bc, stages = cfg.hidden, cfg.block_k, cfg.block_tokens, cfg.block_channels, cfg.num_stages
    in_dtype, sf_dtype, mode = cfg.in_dtype, cfg.sf_dtype, cfg.mode
    writes_data, computes_sf = cfg.writes_data, cfg.computes_sf
    n_tiles, groups, padding = cfg.num_col_tiles, cfg.groups_per_tile, cfg.sf_padding
    sf_ub_len = -(-groups // LANES) * LANES  # whole registers of scales
    if groups + padding > sf_ub_len:  # the scales macro zeroes the packed padding lanes of its registers only
        raise ValueError(f'{groups} channel blocks per task leave the UE8M0 padding outside the scale registers')
    chunks = bk // LANES
    grid = cfg.num_cores
    fp4, data_dtype = cfg.fp4, cfg.data_dtype
    data_len = bk // 2 if fp4 else bk  # data elements of one task row (FP4: bytes)
    # FP4 packs two register columns into 64 bytes; an odd last column still stores 64 (the second half zero codes).
    data_ub_len = -(-chunks // 2) * LANES if fp4 else bk
    scales = ascend_cast_scales_macro(
        T, fmt=cfg.fmt, round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0, e4m3_sf=cfg.e4m3_sf
    )
    fp32_inverses, saturate = ascend_precomputed_macros(T)
    inverses = ascend_e4m3_sf_inverses_macro(T) if cfg.e4m3_sf else fp32_inverses
    e2m1_codes, store_code_pairs = ascend_e2m1_macros(T)
    quarter_masks = ascend_quarter_masks_macro(T)
    # Products past 448: given scales, and E4M3 scales (saturated at 448, or rounded below c / 448).
    clamps = not fp4 and (not computes_sf or cfg.e4m3_sf)

    col_major, packed = cfg.col_major_sf, cfg.packed_ue8m0
    # Column-major UE8M0: a task's bytes are whole words when each task holds a multiple of 4 blocks, or one task
    # holds the row (its padding completes the last word).
    word_tasks = groups % UE8M0_PACK == 0 or n_tiles == 1
    # Otherwise each byte goes out in a DMA of its own, from a 32-byte block of its own (a DMA's UB source is
    # 32-byte aligned): the VF spreads the task's bytes (its padding included) 32 bytes apart.
    spread = col_major and packed and not word_tasks
    stage_len = 32 * (groups + padding)

    num_tokens = T.dynamic('num_tokens')
    sf_rows = T.ceildiv(num_tokens, bt)

    @T.macro
    def load_f32(x_ub, r, c):
        if in_dtype == 'bfloat16':
            return S.vcvt(S.vld(x_ub[r, c * LANES], dist='UNPK_B16'), f32)
        return S.vld(x_ub[r, c * LANES])

    @T.macro
    def block_maxima(x_ub, amax_ub, rows, low, high, quarters):
        """Pass 1: |x| maxima of the tile's channel blocks over its `rows` rows, into amax_ub[0:groups]."""
        if bc == 128:
            for p in T.serial(chunks // 2):
                acc = S.alloc_var(f32)
                acc = S.vdup(0.0, f32)
                for r in T.serial(rows):
                    acc = S.vmax(acc, S.vmax(S.vabs(load_f32(x_ub, r, 2 * p)), S.vabs(load_f32(x_ub, r, 2 * p + 1))))
                S.vsts(amax_ub[p], S.vcmax(acc), dist='ONEPT_B32')
        else:
            for c in T.serial(chunks):
                acc = S.alloc_var(f32)
                acc = S.vdup(0.0, f32)
                for r in T.serial(rows):
                    acc = S.vmax(acc, S.vabs(load_f32(x_ub, r, c)))
                if bc == 64:
                    S.vsts(amax_ub[c], S.vcmax(acc), dist='ONEPT_B32')
                elif bc == 16:
                    for q, quarter in enumerate(quarters):  # unrolled in Python: one masked vcmax each
                        S.vsts(amax_ub[4 * c + q], S.vcmax(acc, quarter), dist='ONEPT_B32')
                else:
                    S.vsts(amax_ub[2 * c], S.vcmax(acc, low), dist='ONEPT_B32')
                    S.vsts(amax_ub[2 * c + 1], S.vcmax(acc, high), dist='ONEPT_B32')

    @T.macro
    def column_inverse(inv_ub, c, low, quarters):
        """The inverses of register column c's channel blocks, one per lane."""
        if bc == 16:
            first, second, third, _ = quarters
            last_two = S.vsel(S.vld(inv_ub[4 * c + 2], dist='BRC_B32'), S.vld(inv_ub[4 * c + 3], dist='BRC_B32'), third)
            upper = S.vsel(S.vld(inv_ub[4 * c + 1], dist='BRC_B32'), last_two, second)
            return S.vsel(S.vld(inv_ub[4 * c], dist='BRC_B32'), upper, first)
        if bc == 32:
            return S.vsel(S.vld(inv_ub[2 * c], dist='BRC_B32'), S.vld(inv_ub[2 * c + 1], dist='BRC_B32'), low)
        return S.vld(inv_ub[c * LANES // bc], dist='BRC_B32')

    @T.macro
    def cast_rows(x_ub, inv_ub, out_ub, rows, low, quarters):
        """Pass 3: x * inverse -> e4m3 (nearest even, saturating), one byte per fp32 lane, packed."""
        for c in T.serial(chunks):
            inverse = column_inverse(inv_ub, c, low, quarters)
            for r in T.serial(rows):
                scaled = S.vmul(load_f32(x_ub, r, c), inverse)
                if clamps:
                    scaled = saturate(scaled)
                S.vsts(out_ub[r, c * LANES], S.vcvt(scaled, T.float8_e4m3fn), dist='PK4_B32')

    @T.macro
    def cast_rows_fp4(x_ub, inv_ub, out_ub, rows, low, quarters):
        """Pass 3 (FP4): x * inverse -> e2m1 codes, register columns 2 p and 2 p + 1 of a row (128 elements) -> 64
        bytes at out_ub[r, 64 p]."""
        for p in T.serial(chunks // 2):
            first = column_inverse(inv_ub, 2 * p, low, quarters)
            second = column_inverse(inv_ub, 2 * p + 1, low, quarters)
            for r in T.serial(rows):
                store_code_pairs(
                    out_ub, (r, p * LANES),
                    e2m1_codes(S.vmul(load_f32(x_ub, r, 2 * p), first)),
                    e2m1_codes(S.vmul(load_f32(x_ub, r, 2 * p + 1), second)),
                )  # fmt: skip
        if chunks % 2:
            last = column_inverse(inv_ub, chunks - 1, low, quarters)
            for r in T.serial(rows):
                codes = e2m1_codes(S.vmul(load_f32(x_ub, r, chunks - 1), last))
                store_code_pairs(out_ub, (r, chunks // 2 * LANES), codes, S.vdup(0, T.uint32))

    @T.macro
    def block_vf(x_ub, amax_ub, inv_ub, sf_ub, out_ub, stage_ub, rows):
        with T.SimdVF():
            low = S.pset(32, 'PAT_VL32')  # lanes 0..31: the first 32-channel block of a register
            every = S.pset(32, 'PAT_ALL')  # a mask is bound to a name before it feeds another mask op
            high = S.pnot(low, every)
            quarters = quarter_masks() if bc == 16 else None  # lanes 0..15, 16..31, 32..47, 48..63
            if computes_sf:
                block_maxima(x_ub, amax_ub, rows, low, high, quarters)
                S.mem_bar('VST_VLD')
                # Pass 2: scales and inverses, 64 blocks per register (packed padding lanes zeroed).
                scales(amax_ub, sf_ub, inv_ub, groups)
                if spread:
                    S.mem_bar('VST_VLD')
                    for i in T.serial(groups + padding):  # byte i to stage_ub[32 i]
                        S.vsts(stage_ub[32 * i], S.vld(sf_ub[i], dist='BRC_B8'), dist='ONEPT_B8')
            else:
                inverses(sf_ub, inv_ub, groups)
            if writes_data:
                S.mem_bar('VST_VLD')
                if fp4:
                    cast_rows_fp4(x_ub, inv_ub, out_ub, rows, low, quarters)
                else:
                    cast_rows(x_ub, inv_ub, out_ub, rows, low, quarters)

    @T.macro
    def store_scales(sf_ub, stage_ub, out_sf, b, j):
        """Task (b, j)'s scales (the last column tile's with the row's zero padding bytes) to GM."""
        if not col_major:
            if padding > 0:
                # The last column tile also writes the row's zero padding bytes.
                sf_len = T.if_then_else(j == n_tiles - 1, groups + padding, groups)
                T.copy(sf_ub[0:sf_len], out_sf[b, j * groups : j * groups + sf_len])
            else:
                T.copy(sf_ub[0:groups], out_sf[b, j * groups : j * groups + groups])
        elif not packed:
            T.copy(sf_ub[0:groups], out_sf[j * groups : j * groups + groups, b])
        elif word_tasks:  # one burst per word: no padding, or the row's single task ends with it
            word, words = j * (groups // UE8M0_PACK), (groups + padding) // UE8M0_PACK
            T.copy(sf_ub[0 : groups + padding], out_sf[word : word + words, UE8M0_PACK * b : UE8M0_PACK * (b + 1)])
        else:  # bytes of words shared with the neighbouring tasks: one DMA each, from its 32-byte block
            sf_len = T.if_then_else(j == n_tiles - 1, groups + padding, groups) if padding > 0 else groups
            for i in T.serial(sf_len):
                k = j * groups + i
                at = UE8M0_PACK * b + k % UE8M0_PACK
                T.copy(stage_ub[32 * i : 32 * i + 1], out_sf[k // UE8M0_PACK, at : at + 1])

    @T.macro
    def body(x, out, out_sf, sf):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((bt, bk), in_dtype)
            amax_ub = T.alloc_shared((sf_ub_len,), f32)
            inv_ub = T.alloc_shared((sf_ub_len,), f32)
            sf_ub = T.alloc_shared((sf_ub_len,), sf_dtype)
            versions = {x_ub: stages, sf_ub: stages, amax_ub: 1, inv_ub: 1}
            out_ub = stage_ub = None
            if spread:
                stage_ub = T.alloc_shared((stage_len,), sf_dtype)
                versions[stage_ub] = stages
            if writes_data:
                out_ub = T.alloc_shared((bt, data_ub_len), data_dtype)
                versions[out_ub] = stages
            T.annotate_buffer_versions(versions)
            for task in T.Persistent([sf_rows * n_tiles], grid, cid, group_size=1, num_stages=stages):
                b = task // n_tiles
                j = task % n_tiles
                t0 = b * bt
                rows = T.min(bt, num_tokens - t0)
                T.copy(x[t0 : t0 + rows, j * bk : j * bk + bk], x_ub[0:rows, :])
                if not computes_sf:
                    T.copy(sf[b, j * groups : j * groups + groups], sf_ub[0:groups])
                block_vf(x_ub, amax_ub, inv_ub, sf_ub, out_ub, stage_ub, rows)
                if writes_data:
                    T.copy(out_ub[0:rows, 0:data_len], out[t0 : t0 + rows, j * data_len : j * data_len + data_len])
                if computes_sf:
                    store_scales(sf_ub, stage_ub, out_sf, b, j)

    out_sf_type = T.Tensor((sf_rows, cfg.sf_cols), sf_dtype)
    if col_major:  # the transposed column-major scales: rows of stride sf_stride >= ceil(T / bt)
        out_sf_type = col_major_scales(T, sf_rows, cfg.sf_cols, sf_dtype, packed=packed)
    if mode == 'cast':

        @T.prim_func
        def per_block_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            out: T.Tensor((num_tokens, cfg.data_cols), data_dtype),
            out_sf: out_sf_type,
        ):
            body(x, out, out_sf, None)

    elif mode == 'sf_only':

        @T.prim_func
        def per_block_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            out_sf: out_sf_type,
        ):
            body(x, None, out_sf, None)

    else:

        @T.prim_func
        def per_block_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            sf: T.Tensor((sf_rows, cfg.sf_cols), sf_dtype),
            out: T.Tensor((num_tokens, cfg.data_cols), data_dtype),
        ):
            body(x, out, None, sf)

    return per_block_cast_kernel
