"""Ascend 950 kernel of cast_back (math, layouts and config: cast_back_kernel.py).

A persistent loop over (row tile, column tile) tasks on the vector cores, `cfg.num_stages` buffer versions so
that the DMAs of the next task overlap the vector work of this one. Per task the fp8 tile (block_m x block_k)
and the slice of the scale rows it needs land in UB; a task holds either one scale row per token (per-token
scales) or a single token block (block_m <= block_tokens), so its scale rows never straddle a task. A short last
block (H = 64 * odd, 128-channel blocks) makes a task the whole row: its scale slice holds ceil(H / 128) scales,
the last one the short block's, which the row's last 64-column chunk reads. Column-major scales (cfg.col_major_sf)
land transposed, one DMA per task: a burst per scale (UE8M0: per word) of the task's tokens, or of its token
block's one scale / word, into a row of the UB tile.

One SIMD VF per task, 64 fp32 lanes per register:
  - UE8M0 scales first become fp32 in UB: the bytes are widened to 32-bit lanes (an UNPK4_B8 load for the
    row layout; for the column-packed layout a plain load of four bytes per channel, shifted right by 8 * j
    for token block j of the pack and masked) and shifted left by 23, so byte b gives the fp32 bits b << 23;
  - per 64 elements: UNPK4_B8 load of 64 fp8 bytes (byte k to lane k), vcvt e4m3 -> fp32 (exact), one
    vmul by the block's scale (a broadcast load: two selected by a 32-lane mask for 32-channel blocks; a plain
    load of 64 per-channel scales for channel blocks), then the fp32 store or vcvt fp32 -> bf16 (ROUND_R,
    non-saturating: overflow gives inf, NaN stays NaN) and a packing store of the low halves.
E4M3 scales widen like UE8M0 ones (an UNPK4_B8 load, then vcvt e4m3 -> fp32). FP4 data (per-token scales):
a first pass turns each byte (UNPK4_B8, one per 32-bit lane) into the 16-bit codes of its two elements (low nibble
in the low half), so that a 16-bit view of the pass's UB output is in element order; the second pass loads those
codes back one per 32-bit lane (UNPK_B16), decodes them on the bits (ascend_e2m1_decode_macro: no lane
permutation, no table), multiplies by the scale and stores as above. 16-channel blocks: four broadcast scales
selected by the quarter masks of per_token_cast. FP4 rows of H = 64 * odd end in half a 64-byte load (32 bytes): the
task's UB rows are padded to whole loads, so the last load stays in its row and the padding's codes are never read;
with 128-channel blocks that half load is the short block's, its 64 codes multiplied by the row's last scale.
The output tile goes back to GM; rows past the end of the tensor are neither loaded, computed nor stored.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by cast_back_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
import functools

from ._per_token_cast_ascend import ascend_quarter_masks_macro
from ._scale_rules import LANES, UE8M0_PACK, col_major_scales, scale_index
from .fp4 import ascend_e2m1_decode_macro

_UE8M0_SHIFT = 23  # a UE8M0 byte is the biased exponent of an fp32 scale: its bits are byte << 23


def ascend_cast_back_kernel(cfg):
    """`cfg` is a CastBackConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32 = T.float32
    hidden, bm, bk, stages = cfg.hidden, cfg.block_m, cfg.block_k, cfg.num_stages
    bt, bc = cfg.block_tokens, cfg.block_channels
    out_dtype, sf_dtype = cfg.out_dtype, cfg.sf_dtype
    packed, channel = cfg.packed_ue8m0, cfg.channel_blocks
    widened, e4m3_sf, fp4 = cfg.widens_sf, cfg.e4m3_sf, cfg.fp4
    x_dtype, x_cols = ('int8', bk // 2) if fp4 else (T.float8_e4m3fn, bk)
    # FP4 at block_k = 64 * odd: the last load of a row is half (32 bytes); the UB rows are padded to whole loads
    # (x_ub 64 bytes, codes_ub 128 codes), the padding decoded into codes that are never read.
    x_ub_cols = cfg.ascend_data_cols
    raw_dtype = T.float8_e4m3fn if e4m3_sf else T.uint8
    decode = ascend_e2m1_decode_macro(T) if fp4 else None
    quarter_masks = ascend_quarter_masks_macro(T) if bc == 16 else None
    n_tiles = cfg.num_col_tiles
    chunks = bk // LANES
    loads = -(-chunks // 2)  # FP4: 64-byte loads of a row, a last half one included
    grid = cfg.num_cores
    per_token = bt == 1
    sm = cfg.scale_rows_per_task  # scale rows (token blocks) a task reads: block_m per token, else 1
    # Scale columns of one task: its blocks (row layout; a short last block too) or its channels (channel blocks),
    # as fp32 in UB.
    sf_w = bk if channel else cfg.task_blocks
    if widened and not channel:
        # Widened 64 bytes per register over the flat (sm, sf_w) tile: room for whole registers.
        flat = -(-sm * sf_w // LANES) * LANES
        sf_rows_ub = -(-flat // sf_w)
    else:
        sf_rows_ub = sm
    raw_w = UE8M0_PACK * bk if channel and packed else sf_w  # raw scale bytes / fp32 of a row of the task's slice
    col_major = cfg.col_major_sf
    sf_w_task = sf_w  # the task's scales (row layouts)
    if col_major:
        # The task's scales transposed, as one DMA lands them: a row per scale (UE8M0: per word), the tokens along it.
        cm_rows, raw_w = cfg.ascend_col_major_tile
        flat = -(-cm_rows * raw_w // LANES) * LANES
        sf_rows_ub = -(-flat // raw_w) if widened else cm_rows
        sf_w = raw_w  # the flat widening's row width

    num_tokens = T.dynamic('num_tokens')
    num_token_blocks = num_tokens if per_token else T.ceildiv(num_tokens, bt)
    sf_shape = (
        (T.ceildiv(num_token_blocks, UE8M0_PACK), cfg.sf_cols)
        if packed and channel
        else (num_token_blocks, cfg.sf_cols)
    )
    sf_type = T.Tensor(sf_shape, sf_dtype)
    if col_major:  # the transposed column-major scales: rows of stride sf_stride >= R (scale rows)
        sf_type = col_major_scales(T, num_token_blocks, cfg.sf_cols, sf_dtype, packed=packed)

    sf_at = functools.partial(scale_index, col_major=cfg.col_major_sf, packed=cfg.packed_ue8m0)

    @T.macro
    def widen_ue8m0(raw_ub, sf_ub, s0):
        """The task's UE8M0 (or E4M3) bytes -> fp32 scales in sf_ub (inside the VF)."""
        if channel:
            # Byte [r, 4h + j] is token block 4r + j of channel h: the task's block s0 is byte j = s0 % 4.
            exp_mask = S.vdup(0xFF, T.uint32)
            shift = (s0 % UE8M0_PACK) * 8
            for c in T.serial(chunks):
                words = T.reinterpret(S.vld(raw_ub[0, c * UE8M0_PACK * LANES]), 'uint32x64')
                exps = S.vand(S.vshrs(words, shift), exp_mask)
                S.vsts(sf_ub[0, c * LANES], T.reinterpret(S.vshls(exps, _UE8M0_SHIFT), 'float32x64'))
        else:
            # Row layout: the (sm, sf_w) bytes are contiguous; byte k widens to lane k of its register.
            for q in T.serial(flat // LANES):
                if e4m3_sf:
                    # e4m3 -> fp32 is exact.
                    S.vsts(
                        sf_ub[q * LANES // sf_w, q * LANES % sf_w],
                        S.vcvt(S.vld(raw_ub[q * LANES // sf_w, q * LANES % sf_w], dist='UNPK4_B8'), f32),
                    )
                else:
                    bytes_ = T.reinterpret(
                        S.vld(raw_ub[q * LANES // sf_w, q * LANES % sf_w], dist='UNPK4_B8'), 'uint32x64'
                    )
                    S.vsts(
                        sf_ub[q * LANES // sf_w, q * LANES % sf_w],
                        T.reinterpret(S.vshls(bytes_, _UE8M0_SHIFT), 'float32x64'),
                    )

    @T.macro
    def load_scale(sf_ub, g, c, low):
        """fp32 scales of the 64 columns of chunk c for scale row g (16-channel blocks: `low` holds the four
        quarter masks)."""
        if channel:
            return S.vld(sf_ub[g, c * LANES])
        if bc == 16:
            first, second, third, _ = low
            third_scale = S.vld(sf_ub[sf_at(g, 4 * c + 2)], dist='BRC_B32')
            last_two = S.vsel(third_scale, S.vld(sf_ub[sf_at(g, 4 * c + 3)], dist='BRC_B32'), third)
            upper = S.vsel(S.vld(sf_ub[sf_at(g, 4 * c + 1)], dist='BRC_B32'), last_two, second)
            return S.vsel(S.vld(sf_ub[sf_at(g, 4 * c)], dist='BRC_B32'), upper, first)
        if bc == 32:
            return S.vsel(
                S.vld(sf_ub[sf_at(g, 2 * c)], dist='BRC_B32'), S.vld(sf_ub[sf_at(g, 2 * c + 1)], dist='BRC_B32'), low
            )
        return S.vld(sf_ub[sf_at(g, c * LANES // bc)], dist='BRC_B32')

    @T.macro
    def store_row(out_ub, row, c, value):
        if out_dtype == 'float32':
            S.vsts(out_ub[row, c * LANES], value)
        else:
            # bf16 into the low half of each 32-bit lane (PART_EVEN), the low halves packed by the store.
            S.vsts(out_ub[row, c * LANES], S.vcvt(value, T.bfloat16, sat=False), dist='PK_B32')

    @T.macro
    def cast_back_vf(x_ub, raw_ub, sf_ub, out_ub, codes_ub, s0, valid):
        with T.SimdVF():
            low = S.pset(32, 'PAT_VL32') if bc == 32 else None  # lanes 0..31: the first block of a register
            if bc == 16:
                low = quarter_masks()
            if widened:
                widen_ue8m0(raw_ub, sf_ub, s0)
                S.mem_bar('VST_VLD')
            if fp4:
                # Per token (FP4 has no token blocks). Element order without a lane permutation: byte k (64 a
                # load, one per 32-bit lane) becomes the 16-bit codes of elements 2 k (low half) and 2 k + 1 (high
                # half) in codes_ub; those load back widened, one element per 32-bit lane, in order.
                nibble = S.vdup(0xF, T.uint32)
                for row in T.serial(valid):
                    for p in T.serial(loads):
                        bytes_ = T.reinterpret(S.vld(x_ub[row, p * LANES], dist='UNPK4_B8'), 'uint32x64')
                        pair = S.vor(S.vand(bytes_, nibble), S.vshls(S.vand(S.vshrs(bytes_, 4), nibble), 16))
                        S.vsts(codes_ub[row, p * 2 * LANES], T.reinterpret(pair, 'uint16x128'))
                S.mem_bar('VST_VLD')
                for row in T.serial(valid):
                    for c in T.serial(chunks):
                        codes = T.reinterpret(S.vld(codes_ub[row, c * LANES], dist='UNPK_B16'), 'uint32x64')
                        store_row(out_ub, row, c, S.vmul(decode(codes), load_scale(sf_ub, row, c, low)))
            else:
                # Per token: one scale row per row (rows = groups). Token blocks: one scale row for all rows.
                for g in T.serial(valid if per_token else 1):
                    for c in T.serial(chunks):
                        scale = load_scale(sf_ub, g, c, low)
                        for r in T.serial(1 if per_token else valid):
                            row = g + r
                            x = S.vcvt(S.vld(x_ub[row, c * LANES], dist='UNPK4_B8'), f32)
                            store_row(out_ub, row, c, S.vmul(x, scale))

    @T.prim_func
    def cast_back_kernel(
        x: T.Tensor((num_tokens, cfg.data_cols), x_dtype),
        x_sf: sf_type,
        out: T.Tensor((num_tokens, hidden), out_dtype),
    ):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((bm, x_ub_cols), x_dtype)
            out_ub = T.alloc_shared((bm, bk), out_dtype)
            codes_ub = T.alloc_shared((bm, 2 * x_ub_cols), T.uint16) if fp4 else None  # FP4: a code per 16 bits
            if widened:
                raw_ub = T.alloc_shared((sf_rows_ub, raw_w), raw_dtype)
                sf_ub = T.alloc_shared((sf_rows_ub, sf_w), f32)
                T.annotate_buffer_versions({x_ub: stages, out_ub: stages, raw_ub: stages, sf_ub: 1})
            else:
                raw_ub = T.alloc_shared((sf_rows_ub if col_major else sm, raw_w), f32)
                sf_ub = raw_ub  # fp32 scales are used as they land
                T.annotate_buffer_versions({x_ub: stages, out_ub: stages, raw_ub: stages})
            for task in T.Persistent([T.ceildiv(num_tokens, bm) * n_tiles], grid, cid, group_size=1, num_stages=stages):
                t0 = task // n_tiles * bm
                j = task % n_tiles
                valid = T.min(bm, num_tokens - t0)
                s0 = t0 // bt  # the task's first scale row (token block)
                # Tail rows clamped by the DMA; FP4 with a half load: the data in the padded rows.
                T.copy(
                    x[t0 : t0 + bm, j * x_cols : j * x_cols + x_cols],
                    x_ub if x_ub_cols == x_cols else x_ub[0:bm, 0:x_cols],
                )
                if col_major and packed:  # the task's words of its tokens: one burst of 4 * valid bytes per word
                    w0 = j * (sf_w_task // UE8M0_PACK)
                    if per_token:
                        T.copy(
                            x_sf[w0 : w0 + cm_rows, UE8M0_PACK * t0 : UE8M0_PACK * (t0 + valid)],
                            raw_ub[0:cm_rows, 0 : UE8M0_PACK * valid],
                        )
                    else:  # its token block's words: one 4-byte burst per word
                        T.copy(
                            x_sf[w0 : w0 + cm_rows, UE8M0_PACK * s0 : UE8M0_PACK * s0 + UE8M0_PACK],
                            raw_ub[0:cm_rows, 0:UE8M0_PACK],
                        )
                elif col_major and per_token:  # the task's scales of its tokens: one burst of valid scales per scale
                    T.copy(x_sf[j * sf_w_task : (j + 1) * sf_w_task, t0 : t0 + valid], raw_ub[0:cm_rows, 0:valid])
                elif col_major:  # its token block's scales: one single-scale burst per scale
                    T.copy(x_sf[j * sf_w_task : (j + 1) * sf_w_task, s0 : s0 + 1], raw_ub[0:cm_rows, 0:1])
                elif channel and packed:
                    row = s0 // UE8M0_PACK
                    T.copy(x_sf[row : row + 1, j * raw_w : j * raw_w + raw_w], raw_ub[0:1, :])
                else:
                    T.copy(x_sf[s0 : s0 + sm, j * raw_w : j * raw_w + raw_w], raw_ub[0:sm, :])
                cast_back_vf(x_ub, raw_ub, sf_ub, out_ub, codes_ub, s0, valid)
                T.copy(out_ub[0:valid, :], out[t0 : t0 + valid, j * bk : j * bk + bk])

    return cast_back_kernel
