"""Ascend 950 kernel of per_token_cast (math and config: per_token_cast_kernel.py).

A persistent loop over (token, column tile) tasks on the vector cores. Per task the row slice lands in UB
and one SIMD VF makes three passes over it, in fp32 (bf16 widens exactly): the absolute maximum of each block
(a masked reduction per 32-, 64- or 128-element block), the scale factors and their inverses for 64 blocks
per register, then x * inverse narrowed to float8_e4m3fn. The fp8 row and the scale row go back to GM.
Mode 'sf_only' skips the third pass and the fp8 row; mode 'precomputed' reads the task's fp32 scales instead of
the first two passes, takes their IEEE reciprocals, and clamps the products to +-448 before the narrowing.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_token_cast_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
from ._scale_rules import LANES, ascend_precomputed_macros, ascend_scales_macro


def ascend_row_macros(T, *, in_dtype: str, block_size: int, chunks: int):
    """SIMD macros over a row tile of `chunks` 64-lane registers in UB, cut into blocks of `block_size` (32, 64 or
    128) channels, for the per-token casts (per_token_cast, per_token_cast_and_cast_back):

    - `load_f32(x_ub, c)`: register c as fp32 (bf16 widens exactly);
    - `block_maxima(x_ub, amax_ub, low, high)`: the |x| maximum of each block into amax_ub[0:blocks] (`low` /
      `high`: the masks of lanes 0..31 / 32..63);
    - `block_scalar(buf, c, low)`: the 64 lanes of register c get their block's value of `buf` (one fp32 per block).
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
    def block_maxima(x_ub, amax_ub, low, high):
        if bs == 128:
            for p in T.serial(chunks // 2):
                pair_max = S.vmax(S.vabs(load_f32(x_ub, 2 * p)), S.vabs(load_f32(x_ub, 2 * p + 1)))
                S.vsts(amax_ub[p], S.vcmax(pair_max), dist='ONEPT_B32')
        else:
            for c in T.serial(chunks):
                a = S.vabs(load_f32(x_ub, c))
                if bs == 64:
                    S.vsts(amax_ub[c], S.vcmax(a), dist='ONEPT_B32')
                else:
                    S.vsts(amax_ub[2 * c], S.vcmax(a, low), dist='ONEPT_B32')
                    S.vsts(amax_ub[2 * c + 1], S.vcmax(a, high), dist='ONEPT_B32')

    @T.macro
    def block_scalar(buf, c, low):
        if bs == 32:
            return S.vsel(S.vld(buf[2 * c], dist='BRC_B32'), S.vld(buf[2 * c + 1], dist='BRC_B32'), low)
        return S.vld(buf[c * LANES // bs], dist='BRC_B32')

    return load_f32, block_maxima, block_scalar


def ascend_per_token_cast_kernel(cfg):
    """`cfg` is a PerTokenCastConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32 = T.float32
    hidden, bk, bs, stages = cfg.hidden, cfg.block_k, cfg.block_size, cfg.num_stages
    in_dtype, sf_dtype = cfg.in_dtype, cfg.sf_dtype
    n_tiles = cfg.num_col_tiles
    groups = cfg.groups_per_tile
    groups_padded = -(-groups // LANES) * LANES  # whole registers of scales
    sf_len = groups + cfg.sf_padding  # scale elements one task stores (padding only when it owns the row)
    chunks = bk // LANES
    grid = cfg.num_cores
    scales = ascend_scales_macro(T, round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0)
    inverses, saturate = ascend_precomputed_macros(T)
    writes_data, computes_sf = cfg.writes_data, cfg.computes_sf

    num_tokens = T.dynamic('num_tokens')

    load_f32, block_maxima, block_scalar = ascend_row_macros(T, in_dtype=in_dtype, block_size=bs, chunks=chunks)

    @T.macro
    def cast_vf(x_ub, amax_ub, inv_ub, sf_ub, out_ub):
        with T.SimdVF():
            low = S.pset(32, 'PAT_VL32')  # lanes 0..31: the first 32-element block of a register
            every = S.pset(32, 'PAT_ALL')  # a mask is bound to a name before it feeds another mask op
            high = S.pnot(low, every)
            if computes_sf:
                # Pass 1: |x| maxima, one per block, into amax_ub[0:groups].
                block_maxima(x_ub, amax_ub, low, high)
                S.mem_bar('VST_VLD')
                # Pass 2: scales and inverses, 64 blocks per register (packed padding lanes zeroed).
                scales(amax_ub, sf_ub, inv_ub, groups)
            else:
                inverses(sf_ub, inv_ub, groups)  # the given scales' IEEE reciprocals
            if writes_data:
                S.mem_bar('VST_VLD')
                # Pass 3: x * inverse -> e4m3 (nearest even, saturating), one byte per fp32 lane, packed.
                for c in T.serial(chunks):
                    inverse = block_scalar(inv_ub, c, low)
                    scaled = S.vmul(load_f32(x_ub, c), inverse)
                    if not computes_sf:
                        scaled = saturate(scaled)
                    S.vsts(out_ub[c * LANES], S.vcvt(scaled, T.float8_e4m3fn), dist='PK4_B32')

    @T.macro
    def body(x, out, out_sf, sf):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((bk,), in_dtype)
            amax_ub = T.alloc_shared((groups_padded,), f32)
            inv_ub = T.alloc_shared((groups_padded,), f32)
            sf_ub = T.alloc_shared((groups_padded,), sf_dtype)
            versions = {x_ub: stages, sf_ub: stages, amax_ub: 1, inv_ub: 1}
            out_ub = None
            if writes_data:
                out_ub = T.alloc_shared((bk,), T.float8_e4m3fn)
                versions[out_ub] = stages
            T.annotate_buffer_versions(versions)
            for task in T.Persistent([num_tokens * n_tiles], grid, cid, group_size=1, num_stages=stages):
                t = task // n_tiles
                j = task % n_tiles
                T.copy(x[t, j * bk : j * bk + bk], x_ub)
                if not computes_sf:
                    T.copy(sf[t, j * groups : j * groups + groups], sf_ub[0:groups])
                cast_vf(x_ub, amax_ub, inv_ub, sf_ub, out_ub)
                if writes_data:
                    T.copy(out_ub, out[t, j * bk : j * bk + bk])
                if computes_sf:
                    T.copy(sf_ub[0:sf_len], out_sf[t, j * groups : j * groups + sf_len])

    sf_shape = (num_tokens, cfg.sf_cols)
    if cfg.mode == 'cast':

        @T.prim_func
        def per_token_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
            out_sf: T.Tensor(sf_shape, sf_dtype),
        ):
            body(x, out, out_sf, None)

    elif cfg.mode == 'sf_only':

        @T.prim_func
        def per_token_cast_kernel(x: T.Tensor((num_tokens, hidden), in_dtype), out_sf: T.Tensor(sf_shape, sf_dtype)):
            body(x, None, out_sf, None)

    else:

        @T.prim_func
        def per_token_cast_kernel(
            x: T.Tensor((num_tokens, hidden), in_dtype),
            sf: T.Tensor(sf_shape, T.float32),
            out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
        ):
            body(x, out, None, sf)

    return per_token_cast_kernel
