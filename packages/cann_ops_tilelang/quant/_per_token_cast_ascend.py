"""Ascend 950 kernel of per_token_cast (math and config: per_token_cast_kernel.py).

A persistent loop over (token, column tile) tasks on the vector cores. Per task the row slice lands in UB
and one SIMD VF makes three passes over it, in fp32 (bf16 widens exactly): the absolute maximum of each block
(a masked reduction per 16-, 32-, 64- or 128-element block), the scale factors and their inverses for 64 blocks
per register, then x * inverse narrowed to float8_e4m3fn, or (FP4) rounded to e2m1 codes by compares on the
grid's midpoints and packed two a byte after a deinterleave of two registers. The data row and the scale row go
back to GM. With cfg.stochastic the third pass rounds x * inverse to e4m3 by quant.cast's stochastic rounding
(_cast_ascend.ascend_stochastic_macros: the element hash of t * H + h from the task's first index and a lane ramp, the
key a launch argument) and packs the low byte of each lane; FP4 with cfg.stochastic rounds x * inverse to e2m1 codes
by fp4.ascend_e2m1_stochastic_macro with the same hash (compares for the lower neighbour, the exact fraction (a - lo) *
(1 / spacing) against 24 random bits) and packs them as the nearest-even codes are. Mode 'sf_only' skips the third
pass and the data row; mode 'precomputed' reads the task's scales (fp32 or e4m3) instead of the first two passes and
takes their IEEE reciprocals.
Where a product can pass 448 (given scales, E4M3 scales that saturate or round down) it is clamped to +-448 before the
e4m3 narrowing, so no kernel relies on the conversion's saturation setting; the e2m1 rounding saturates by construction.

Column-major scales (cfg.col_major_sf): the task's scales leave UB as they are (dense, one task's run) in one DMA
whose bursts are single scales (fp32 4 bytes, E4M3 1 byte) or packed UE8M0 words (4 bytes), each burst to the next
row of the transposed GM view (asc_copy_ub2gm_align: n_burst = the task's scales, a UB stride equal to the burst
length, the GM stride the view's row stride). No UB transpose, no extra pass: the same bytes as the row-major
kernel, scattered by the DMA. (The peer transposes 32 tokens' scales in UB to write 128-byte runs; with one token
per task the bursts stay short, which only a device can price.)
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_token_cast_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
from ._cast_ascend import _MAGNITUDE, _SIGN, ascend_stochastic_macros
from ._per_token_cast_signature import per_token_cast_prim_func
from ._scale_rules import (
    LANES,
    UE8M0_PACK,
    ascend_cast_scales_macro,
    ascend_e4m3_sf_inverses_macro,
    ascend_precomputed_macros,
)
from .fp4 import ascend_e2m1_macros, ascend_e2m1_stochastic_macro


def ascend_row_macros(T, *, in_dtype: str, block_size: int, chunks: int, valid_chunks: int | None = None):
    """SIMD macros over a row tile of `chunks` 64-lane registers in UB, cut into blocks of `block_size` (16, 32, 64
    or 128) channels, for the per-token casts (per_token_cast, per_token_cast_and_cast_back); `valid_chunks` (odd,
    128-channel blocks only): the registers that hold x, the last block short of its second register:

    - `load_f32(x_ub, c)`: register c as fp32 (bf16 widens exactly);
    - `block_maxima(x_ub, amax_ub, low, high, quarters)`: the |x| maximum of each block into amax_ub[0:blocks]
      (`low` / `high`: the masks of lanes 0..31 / 32..63; `quarters`, for 16-channel blocks only: the masks of
      lanes 0..15, 16..31, 32..47 and 48..63, from ascend_quarter_masks_macro);
    - `block_scalar(buf, c, low, quarters)`: the 64 lanes of register c get their block's value of `buf` (one fp32
      per block).
    """
    S = T.simd
    f32 = T.float32
    bs = block_size

    @T.macro
    def load_f32(x_ub, c):
        if in_dtype == 'bfloat16':
            return S.vcvt(S.vld(x_ub[c * LANES], dist='UNPK_B16'), f32)
        return S.vld(x_ub[c * LANES])

    @T.macro
    def block_maxima(x_ub, amax_ub, low, high, quarters=None):
        if bs == 16:
            for c in T.serial(chunks):
                a = S.vabs(load_f32(x_ub, c))
                first, second, third, fourth = quarters
                S.vsts(amax_ub[4 * c], S.vcmax(a, first), dist='ONEPT_B32')
                S.vsts(amax_ub[4 * c + 1], S.vcmax(a, second), dist='ONEPT_B32')
                S.vsts(amax_ub[4 * c + 2], S.vcmax(a, third), dist='ONEPT_B32')
                S.vsts(amax_ub[4 * c + 3], S.vcmax(a, fourth), dist='ONEPT_B32')
        elif bs == 128:
            pairs = (chunks if valid_chunks is None else valid_chunks) // 2
            for p in T.serial(pairs):
                pair_max = S.vmax(S.vabs(load_f32(x_ub, 2 * p)), S.vabs(load_f32(x_ub, 2 * p + 1)))
                S.vsts(amax_ub[p], S.vcmax(pair_max), dist='ONEPT_B32')
            if valid_chunks is not None and valid_chunks % 2:  # the short last block: its one register
                S.vsts(amax_ub[pairs], S.vcmax(S.vabs(load_f32(x_ub, valid_chunks - 1))), dist='ONEPT_B32')
        else:
            for c in T.serial(chunks):
                a = S.vabs(load_f32(x_ub, c))
                if bs == 64:
                    S.vsts(amax_ub[c], S.vcmax(a), dist='ONEPT_B32')
                else:
                    S.vsts(amax_ub[2 * c], S.vcmax(a, low), dist='ONEPT_B32')
                    S.vsts(amax_ub[2 * c + 1], S.vcmax(a, high), dist='ONEPT_B32')

    @T.macro
    def block_scalar(buf, c, low, quarters=None):
        if bs == 16:
            first, second, third, _ = quarters
            last_two = S.vsel(S.vld(buf[4 * c + 2], dist='BRC_B32'), S.vld(buf[4 * c + 3], dist='BRC_B32'), third)
            upper = S.vsel(S.vld(buf[4 * c + 1], dist='BRC_B32'), last_two, second)
            return S.vsel(S.vld(buf[4 * c], dist='BRC_B32'), upper, first)
        if bs == 32:
            return S.vsel(S.vld(buf[2 * c], dist='BRC_B32'), S.vld(buf[2 * c + 1], dist='BRC_B32'), low)
        return S.vld(buf[c * LANES // bs], dist='BRC_B32')

    return load_f32, block_maxima, block_scalar


def ascend_quarter_masks_macro(T):
    """A SIMD macro `quarter_masks()` -> the masks of fp32 lanes 0..15, 16..31, 32..47 and 48..63 (16-channel
    blocks)."""
    S = T.simd

    @T.macro
    def quarter_masks():
        every = S.pset(32, 'PAT_ALL')
        first = S.pset(32, 'PAT_VL16')
        half = S.pset(32, 'PAT_VL32')
        three = S.update_mask(48, 32)  # no fixed pattern of 48 lanes
        second = S.pxor(half, first, every)
        third = S.pxor(three, half, every)
        fourth = S.pnot(three, every)
        return first, second, third, fourth

    return quarter_masks


def ascend_per_token_cast_kernel(cfg, recipe):
    """`cfg` is a PerTokenCastConfig (backend "ascend"), `recipe` quant.cast's CastRecipe (the stochastic rounding's
    constants)."""
    import tilelang.ascend.language as T

    S = T.simd
    f32, u32 = T.float32, T.uint32
    hidden, bk, bs, stages = cfg.hidden, cfg.block_k, cfg.block_size, cfg.num_stages
    in_dtype, sf_dtype, data_storage = cfg.in_dtype, cfg.sf_dtype, cfg.data_storage
    n_tiles = cfg.num_col_tiles
    groups = cfg.groups_per_tile
    groups_padded = -(-groups // LANES) * LANES  # whole registers of scales
    sf_len = groups + (cfg.sf_padding if n_tiles == 1 else 0)  # scale elements one task stores
    # A packed UE8M0 row of several tasks ending in zero padding (H > 8192, 4 n + r blocks): the row's last task
    # stores the padding after its scales (sf_ub's lanes past `groups` are zero: groups % 64 != 0 here).
    row_padding = cfg.sf_padding if n_tiles > 1 else 0
    last_sf_len = groups + row_padding  # scale elements the row's last task stores
    chunks = bk // LANES
    # A short last block (H = 64 * odd, 128-channel blocks; the task is the row): H / 64 registers hold x, the last
    # block has one of its two, and the data pass and stores stop at H (UB past it is never read).
    short = cfg.short_block
    x_len = hidden if short else bk  # elements of x one task reads
    data_chunks = x_len // LANES
    fp4 = cfg.fp4
    data_len = x_len // 2 if fp4 else x_len  # data elements of one task (FP4: bytes)
    # FP4 packs two registers into 64 bytes; an odd last register still stores 64 (the second half zero codes).
    data_ub_len = -(-chunks // 2) * LANES if fp4 else bk
    grid = cfg.num_cores
    scales = ascend_cast_scales_macro(
        T, fmt=cfg.fmt, round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0, e4m3_sf=cfg.e4m3_sf
    )
    fp32_inverses, saturate = ascend_precomputed_macros(T)
    inverses = ascend_e4m3_sf_inverses_macro(T) if cfg.e4m3_sf else fp32_inverses
    e2m1_codes, store_code_pairs = ascend_e2m1_macros(T)
    stochastic_e2m1_codes = ascend_e2m1_stochastic_macro(T)
    quarter_masks = ascend_quarter_masks_macro(T)
    writes_data, computes_sf = cfg.writes_data, cfg.computes_sf
    col_major, packed = cfg.col_major_sf, cfg.packed_ue8m0
    stochastic = cfg.stochastic
    # Products past 448: given scales, and E4M3 scales (saturated at 448, or rounded below c / 448). The stochastic
    # rounding saturates by itself (min(|v|, 448) first).
    clamps = not fp4 and (not computes_sf or cfg.e4m3_sf) and not stochastic
    hash_registers, random_bits, _, round_e4m3 = ascend_stochastic_macros(T, recipe)

    num_tokens = T.dynamic('num_tokens')
    x_type = T.Tensor((num_tokens, hidden), in_dtype)
    if cfg.strided_rows:  # rows x_stride elements apart (each task's DMA reads its row slice)
        x_type = T.StridedTensor((num_tokens, hidden), (T.dynamic('x_stride'), 1), in_dtype)

    load_f32, block_maxima, block_scalar = ascend_row_macros(
        T, in_dtype=in_dtype, block_size=bs, chunks=chunks, valid_chunks=data_chunks if short else None
    )

    @T.macro
    def scaled_register(x_ub, inv_ub, c, low, quarters):
        inverse = block_scalar(inv_ub, c, low, quarters)
        scaled = S.vmul(load_f32(x_ub, c), inverse)
        if clamps:
            scaled = saturate(scaled)
        return scaled

    def register_offset(first, c, key):
        """The hash's per-register term of register c: index_step * (first element index + 64 c) + key."""
        return T.Cast('uint32', first + c * LANES) * T.uint32(recipe.index_step) + key

    @T.macro
    def cast_vf(x_ub, amax_ub, inv_ub, sf_ub, out_ub, first, key):
        with T.SimdVF():
            low = S.pset(32, 'PAT_VL32')  # lanes 0..31: the first 32-element block of a register
            every = S.pset(32, 'PAT_ALL')  # a mask is bound to a name before it feeds another mask op
            high = S.pnot(low, every)
            quarters = quarter_masks() if bs == 16 else None
            if computes_sf:
                # Pass 1: |x| maxima, one per block, into amax_ub[0:groups].
                block_maxima(x_ub, amax_ub, low, high, quarters)
                S.mem_bar('VST_VLD')
                # Pass 2: scales and inverses, 64 blocks per register (packed padding lanes zeroed).
                scales(amax_ub, sf_ub, inv_ub, groups)
            else:
                inverses(sf_ub, inv_ub, groups)  # the given scales' IEEE reciprocals
            if writes_data:
                S.mem_bar('VST_VLD')
                if fp4 and stochastic:
                    # Pass 3: x * inverse -> e2m1 codes by the stochastic rounding of element `first` + lane
                    # (t * H + h), two registers (128 elements) -> 64 bytes. The hash's constant registers, once per VF.
                    ramp, key_lanes = hash_registers(key)
                    for p in T.serial(data_chunks // 2):
                        even_h = random_bits(ramp, key_lanes, register_offset(first, 2 * p, key))
                        odd_h = random_bits(ramp, key_lanes, register_offset(first, 2 * p + 1, key))
                        store_code_pairs(
                            out_ub, p * LANES,
                            stochastic_e2m1_codes(scaled_register(x_ub, inv_ub, 2 * p, low, quarters), even_h),
                            stochastic_e2m1_codes(scaled_register(x_ub, inv_ub, 2 * p + 1, low, quarters), odd_h),
                        )  # fmt: skip
                    if data_chunks % 2:
                        last_h = random_bits(ramp, key_lanes, register_offset(first, data_chunks - 1, key))
                        last = stochastic_e2m1_codes(
                            scaled_register(x_ub, inv_ub, data_chunks - 1, low, quarters), last_h
                        )
                        store_code_pairs(out_ub, data_chunks // 2 * LANES, last, S.vdup(0, T.uint32))
                elif fp4:
                    # Pass 3: x * inverse -> e2m1 codes, two registers (128 elements) -> 64 bytes.
                    for p in T.serial(data_chunks // 2):
                        store_code_pairs(
                            out_ub, p * LANES,
                            e2m1_codes(scaled_register(x_ub, inv_ub, 2 * p, low, quarters)),
                            e2m1_codes(scaled_register(x_ub, inv_ub, 2 * p + 1, low, quarters)),
                        )  # fmt: skip
                    if data_chunks % 2:
                        last = e2m1_codes(scaled_register(x_ub, inv_ub, data_chunks - 1, low, quarters))
                        store_code_pairs(out_ub, data_chunks // 2 * LANES, last, S.vdup(0, T.uint32))
                elif stochastic:
                    # Pass 3: x * inverse -> e4m3 by quant.cast's stochastic rounding of element `first` + lane
                    # (t * H + h), the bits packed from the low byte of each lane. The constant registers of
                    # quant.cast's kernel (_cast_ascend.py), made once per VF.
                    ramp, key_lanes = hash_registers(key)
                    magnitude = S.alloc_var(u32)
                    magnitude = S.vdup(T.uint32(_MAGNITUDE), u32)
                    sign_bit = S.alloc_var(u32)
                    sign_bit = S.vdup(T.uint32(_SIGN), u32)
                    nan8 = S.alloc_var(u32)
                    nan8 = S.vdup(T.uint32(0x7F), u32)
                    for c in T.serial(data_chunks):
                        scaled = scaled_register(x_ub, inv_ub, c, low, quarters)
                        offset = T.Cast('uint32', first + c * LANES) * T.uint32(recipe.index_step) + key
                        h = random_bits(ramp, key_lanes, offset)
                        code = round_e4m3(T.reinterpret(scaled, 'uint32x64'), h, magnitude, sign_bit, nan8)
                        S.vsts(out_ub[c * LANES], T.reinterpret(code, 'uint8x256'), dist='PK4_B32')
                else:
                    # Pass 3: x * inverse -> e4m3 (nearest even), one byte per fp32 lane, packed.
                    for c in T.serial(data_chunks):
                        scaled = scaled_register(x_ub, inv_ub, c, low, quarters)
                        S.vsts(out_ub[c * LANES], S.vcvt(scaled, T.float8_e4m3fn), dist='PK4_B32')

    @T.macro
    def body(x, out, out_sf, sf, key):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((bk,), in_dtype)
            amax_ub = T.alloc_shared((groups_padded,), f32)
            inv_ub = T.alloc_shared((groups_padded,), f32)
            sf_ub = T.alloc_shared((groups_padded,), sf_dtype)
            versions = {x_ub: stages, sf_ub: stages, amax_ub: 1, inv_ub: 1}
            out_ub = None
            if writes_data:
                out_ub = T.alloc_shared((data_ub_len,), data_storage)
                versions[out_ub] = stages
            T.annotate_buffer_versions(versions)
            for task in T.Persistent([num_tokens * n_tiles], grid, cid, group_size=1, num_stages=stages):
                t = task // n_tiles
                j = task % n_tiles
                if short:  # the row (j = 0), H of the task's bk elements
                    T.copy(x[t, 0:hidden], x_ub[0:hidden])
                else:
                    T.copy(x[t, j * bk : j * bk + bk], x_ub)
                if not computes_sf:
                    T.copy(sf[t, j * groups : j * groups + groups], sf_ub[0:groups])
                # first: the element index t * H + j * bk of the task's first element (< 2**31: T * H is)
                cast_vf(x_ub, amax_ub, inv_ub, sf_ub, out_ub, t * hidden + j * bk if stochastic else None, key)
                if writes_data:
                    T.copy(out_ub[0:data_len], out[t, j * data_len : j * data_len + data_len])
                if computes_sf and not col_major and row_padding:
                    if j == n_tiles - 1:
                        T.copy(sf_ub[0:last_sf_len], out_sf[t, j * groups : j * groups + last_sf_len])
                    else:
                        T.copy(sf_ub[0:groups], out_sf[t, j * groups : j * groups + groups])
                elif computes_sf and not col_major:
                    T.copy(sf_ub[0:sf_len], out_sf[t, j * groups : j * groups + sf_len])
                elif computes_sf and packed:  # whole words: groups % 4 == 0, or the row's padding ends the task
                    word, words = j * (groups // UE8M0_PACK), sf_len // UE8M0_PACK
                    T.copy(sf_ub[0:sf_len], out_sf[word : word + words, UE8M0_PACK * t : UE8M0_PACK * (t + 1)])
                elif computes_sf:
                    T.copy(sf_ub[0:sf_len], out_sf[j * groups : j * groups + sf_len, t])

    return per_token_cast_prim_func(T, cfg, num_tokens, x_type, body)
