"""The scale rules every e4m3 cast of the domain shares, for both backends (one home: the casts differ only in
which elements share a block).

For a block with absolute maximum a, c = max(a, AMAX_FLOOR):

    fp32 scales:  sf = c / 448, inverse = 448 / c                  (two IEEE divisions)
    round_sf:     sf = 2 ** ceil(log2(c * fp32(1/448))), inverse = 1 / sf (exact: a power of two)
    packed_ue8m0: the rounded scale's biased exponent byte (UE8M0), four bytes per int32 of the interface's view

The power of two is found on the bits: any mantissa bit carries into the exponent, then the mantissa is dropped.
Its inverse has biased exponent 254 - biased(sf); an inf scale (255) gets inverse +0.

The functions here build expressions (CUDA) or a SIMD macro (Ascend) inside a kernel generator; they import
nothing at module level, so importing the domain compiles nothing.
"""

FP8_MAX = 448.0  # largest finite float8_e4m3fn
AMAX_FLOOR = 1e-4  # TileKernels' default amax clamp for e4m3 with fp32 / UE8M0 scales
INV_FP8_MAX = 1.0 / FP8_MAX  # rounded to fp32 where it is used, as the references' constant
UE8M0_PACK = 4  # UE8M0 bytes per int32 of the interface's view, on both backends
LANES = 64  # fp32 lanes of one 256-byte Ascend vector register


def col_major_scales(T, rows, sf_cols: int, dtype, *, packed: bool, stride_name: str = 'sf_stride'):
    """The prim_func parameter type of column-major scales as the kernels take them, the transposed view `sf.T`
    (packed UE8M0 as bytes, `sf.T.view(torch.uint8)`): (sf_cols, rows), or (sf_cols / 4, 4 rows) bytes, rows
    `stride_name` apart (a dynamic symbol the launch binds: >= rows, CUDA's TMA padding included; a kernel with
    two such arguments names them apart)."""
    shape = (sf_cols // UE8M0_PACK, UE8M0_PACK * rows) if packed else (sf_cols, rows)
    return T.StridedTensor(shape, (T.dynamic(stride_name), 1), dtype)


def check_col_major_words(cfg) -> None:
    """ValueError for an Ascend configuration of column-major UE8M0 scales whose tasks cut an int32 word: a task
    writes its scales in whole words (one DMA burst each), so a row of several tasks needs a multiple of
    UE8M0_PACK blocks in each. `cfg`: the per-token cast configurations' fields (backend, col_major_sf,
    packed_ue8m0, num_col_tiles, groups_per_tile, block_k, block_size)."""
    if (
        cfg.col_major_sf
        and cfg.packed_ue8m0
        and cfg.backend == 'ascend'
        and cfg.num_col_tiles > 1
        and cfg.groups_per_tile % UE8M0_PACK
    ):
        raise ValueError(
            f'Ascend: column-major UE8M0 scales need whole int32 words per task: block_k {cfg.block_k} must '
            f'hold a multiple of {UE8M0_PACK} blocks of {cfg.block_size}, or be the whole row'
        )


def scale_index(row, k, *, col_major: bool, packed: bool):
    """The indices of scale k of scale row `row` (a token, a token block, a task's row) in a kernel's scale buffer:
    (row, k) row-major; column-major (the transposed view the kernels take, `sf.T`) (k, row), and for packed UE8M0
    byte k % 4 of word k // 4, (k // 4, 4 row + k % 4). Ints or PrimExprs."""
    if not col_major:
        return row, k
    if packed:
        return k // UE8M0_PACK, UE8M0_PACK * row + k % UE8M0_PACK
    return k, row


def cuda_scale_and_inverse(T, amax, *, round_sf: bool, packed_ue8m0: bool):
    """(stored scale, inverse) of one block's |x| maximum `amax` (fp32 PrimExprs): the stored scale is fp32, or
    with `packed_ue8m0` the uint8 UE8M0 byte."""
    clamped = T.max(amax, T.float32(AMAX_FLOOR))
    if not round_sf:
        return clamped / T.float32(FP8_MAX), T.float32(FP8_MAX) / clamped
    pow2 = (T.reinterpret(clamped * T.float32(INV_FP8_MAX), T.uint32) + T.uint32(0x7FFFFF)) & T.uint32(0x7F800000)
    biased = T.cast(pow2 >> T.uint32(23), T.int32)
    inverse = T.reinterpret(T.cast(T.max(T.int32(254) - biased, T.int32(0)), T.uint32) << T.uint32(23), T.float32)
    stored = T.cast(biased, T.uint8) if packed_ue8m0 else T.reinterpret(pow2, T.float32)
    return stored, inverse


def ascend_scales_macro(T, *, round_sf: bool, packed_ue8m0: bool):
    """A SIMD macro `scales(amax_ub, sf_ub, inv_ub, count)` for inside a `T.SimdVF()`: for `count` block maxima
    in amax_ub (fp32), the stored scales into sf_ub (fp32, or UE8M0 bytes packed from the low byte of each
    lane, the lanes past `count` zeroed) and the inverses into inv_ub, 64 blocks per register. The buffers hold
    `count` rounded up to 64; lanes past `count` compute on whatever amax_ub holds there."""
    S = T.simd
    f32 = T.float32

    @T.macro
    def scales(amax_ub, sf_ub, inv_ub, count):
        for q in T.serial(-(-count // LANES)):
            clamped = S.vmaxs(S.vld(amax_ub[q * LANES]), AMAX_FLOOR)
            if round_sf:
                bits = T.reinterpret(S.vmuls(clamped, INV_FP8_MAX), 'uint32x64')
                pow2 = S.vand(S.vadds(bits, 0x7FFFFF), S.vdup(0x7F800000, T.uint32))
                biased = S.vshrs(pow2, 23)
                inv_exp = S.vmaxs(S.vsub(S.vdup(254, T.int32), T.reinterpret(biased, 'int32x64')), 0)
                S.vsts(inv_ub[q * LANES], T.reinterpret(S.vshls(inv_exp, 23), 'float32x64'))
                if packed_ue8m0:
                    valid = S.update_mask(count - q * LANES, 32)
                    exp_bytes = S.vsel(biased, S.vdup(0, T.uint32), valid)
                    S.vsts(sf_ub[q * LANES], T.reinterpret(exp_bytes, 'uint8x256'), dist='PK4_B32')
                else:
                    S.vsts(sf_ub[q * LANES], T.reinterpret(pow2, 'float32x64'))
            else:
                fmax = S.vdup(FP8_MAX, f32)
                S.vsts(sf_ub[q * LANES], S.vdiv(clamped, fmax))
                S.vsts(inv_ub[q * LANES], S.vdiv(fmax, clamped))

    return scales


def cuda_inverse_of(T, sf):
    """The inverse of a given fp32 scale (the precomputed-scale casts): IEEE 1 / sf, correctly rounded whatever
    the fast-math flags (__frcp_rn). The narrowing (__nv_fp8_e4m3's, saturating) caps the overflow such a scale
    can cause."""
    return T.call_extern(T.float32, '__frcp_rn', sf)


def ascend_precomputed_macros(T):
    """SIMD macros of the precomputed-scale casts, for inside a `T.SimdVF()`: `inverses(sf_ub, inv_ub, count)`
    writes IEEE 1 / sf of `count` fp32 scales (64 per register), and `saturate(v)` clamps a product to +-448 by
    compare and select (NaN stays NaN). A scale the kernel did not compute can overflow e4m3, and the kernels
    do not rely on the conversion's saturation setting; the computed scales cannot overflow."""
    S = T.simd
    f32 = T.float32

    @T.macro
    def inverses(sf_ub, inv_ub, count):
        one = S.vdup(1.0, f32)
        for q in T.serial(-(-count // LANES)):
            S.vsts(inv_ub[q * LANES], S.vdiv(one, S.vld(sf_ub[q * LANES])))

    @T.macro
    def saturate(v):
        capped = S.vsel(S.vdup(FP8_MAX, f32), v, S.vcmps(v, FP8_MAX, op='gt'))
        return S.vsel(S.vdup(-FP8_MAX, f32), capped, S.vcmps(capped, -FP8_MAX, op='lt'))

    return inverses, saturate


# ---------------------------------------------------------------- every output format and scale format
# (per_token_cast's FP4 output and E4M3 scales; the e4m3 functions above are this rule's fmt='e4m3' case with fp32
# or UE8M0 scales, kept as they are for the casts that have no other format yet.)

E4M3_SF_FLOOR = 2.0**-9  # smallest e4m3 subnormal: the smallest E4M3 scale, so a stored scale is never 0
FORMAT_MAX = {'e4m3': FP8_MAX, 'e2m1': 6.0}  # largest finite value of each output format
# The amax floor c = max(a, floor) per (fmt, E4M3 scales), TileKernels' defaults: e4m3 with fp32 / UE8M0 scales
# 1e-4; FP4 with fp32 scales a floor whose scale is the smallest normal fp32 (2**-126, never subnormal); with E4M3
# scales the floor whose scale is E4M3_SF_FLOOR.
AMAX_FLOORS = {
    ('e4m3', False): AMAX_FLOOR,
    ('e4m3', True): FP8_MAX * E4M3_SF_FLOOR,
    ('e2m1', False): FORMAT_MAX['e2m1'] * 2.0**-126,
    ('e2m1', True): FORMAT_MAX['e2m1'] * E4M3_SF_FLOOR,
}


def cuda_cast_scale_and_inverse(T, amax, *, fmt: str, round_sf: bool, packed_ue8m0: bool, e4m3_sf: bool):
    """(stored scale, inverse) of one block's |x| maximum `amax` (fp32 PrimExpr) for output format `fmt` (max m),
    c = max(amax, AMAX_FLOORS[fmt, e4m3_sf]):

    - fp32: sf = c / m, inverse = m / c;
    - round_sf: sf = 2 ** ceil(log2(c * fp32(1 / m))), inverse = 1 / sf (exact); packed_ue8m0: its UE8M0 byte;
    - e4m3_sf: sf = e4m3(c / m) (nearest even, saturating at 448), inverse = IEEE 1 / fp32(sf) (__frcp_rn).
    """
    fmax = FORMAT_MAX[fmt]
    clamped = T.max(amax, T.float32(AMAX_FLOORS[fmt, e4m3_sf]))
    if e4m3_sf:
        # Capped first (as on Ascend): the scalar conversion's overflow handling is then never reached.
        stored = T.cast(T.min(clamped / T.float32(fmax), T.float32(FP8_MAX)), T.float8_e4m3fn)
        return stored, T.call_extern(T.float32, '__frcp_rn', T.cast(stored, T.float32))
    if not round_sf:
        return clamped / T.float32(fmax), T.float32(fmax) / clamped
    pow2 = (T.reinterpret(clamped * T.float32(1.0 / fmax), T.uint32) + T.uint32(0x7FFFFF)) & T.uint32(0x7F800000)
    biased = T.cast(pow2 >> T.uint32(23), T.int32)
    inverse = T.reinterpret(T.cast(T.max(T.int32(254) - biased, T.int32(0)), T.uint32) << T.uint32(23), T.float32)
    stored = T.cast(biased, T.uint8) if packed_ue8m0 else T.reinterpret(pow2, T.float32)
    return stored, inverse


def ascend_cast_scales_macro(T, *, fmt: str, round_sf: bool, packed_ue8m0: bool, e4m3_sf: bool):
    """ascend_scales_macro's `scales(amax_ub, sf_ub, inv_ub, count)` for output format `fmt` and any scale format
    (cuda_cast_scale_and_inverse's rule): with `e4m3_sf` sf_ub holds e4m3 bytes (c / m capped at 448 by compare
    and select, then narrowed to nearest even), and the inverse is the IEEE reciprocal of that byte widened."""
    S = T.simd
    f32 = T.float32
    largest = FORMAT_MAX[fmt]
    floor = AMAX_FLOORS[fmt, e4m3_sf]

    @T.macro
    def scales(amax_ub, sf_ub, inv_ub, count):
        for q in T.serial(-(-count // LANES)):
            clamped = S.vmaxs(S.vld(amax_ub[q * LANES]), floor)
            if e4m3_sf:
                scale = S.vdiv(clamped, S.vdup(largest, f32))
                capped = S.vsel(S.vdup(FP8_MAX, f32), scale, S.vcmps(scale, FP8_MAX, op='gt'))
                narrow = S.vcvt(capped, T.float8_e4m3fn)
                S.vsts(sf_ub[q * LANES], narrow, dist='PK4_B32')
                S.vsts(inv_ub[q * LANES], S.vdiv(S.vdup(1.0, f32), S.vcvt(narrow, f32)))
            elif round_sf:
                bits = T.reinterpret(S.vmuls(clamped, 1.0 / largest), 'uint32x64')
                pow2 = S.vand(S.vadds(bits, 0x7FFFFF), S.vdup(0x7F800000, T.uint32))
                biased = S.vshrs(pow2, 23)
                inv_exp = S.vmaxs(S.vsub(S.vdup(254, T.int32), T.reinterpret(biased, 'int32x64')), 0)
                S.vsts(inv_ub[q * LANES], T.reinterpret(S.vshls(inv_exp, 23), 'float32x64'))
                if packed_ue8m0:
                    valid = S.update_mask(count - q * LANES, 32)
                    exp_bytes = S.vsel(biased, S.vdup(0, T.uint32), valid)
                    S.vsts(sf_ub[q * LANES], T.reinterpret(exp_bytes, 'uint8x256'), dist='PK4_B32')
                else:
                    S.vsts(sf_ub[q * LANES], T.reinterpret(pow2, 'float32x64'))
            else:
                fmax = S.vdup(largest, f32)  # the name of the e4m3 kernels' register (unchanged sources)
                S.vsts(sf_ub[q * LANES], S.vdiv(clamped, fmax))
                S.vsts(inv_ub[q * LANES], S.vdiv(fmax, clamped))

    return scales


def ascend_e4m3_sf_inverses_macro(T):
    """`inverses(sf_ub, inv_ub, count)` of given E4M3 scales (bytes in sf_ub): IEEE 1 / fp32(sf), 64 per
    register (ascend_precomputed_macros' `inverses` for e4m3 bytes)."""
    S = T.simd
    f32 = T.float32

    @T.macro
    def inverses(sf_ub, inv_ub, count):
        one = S.vdup(1.0, f32)
        for q in T.serial(-(-count // LANES)):
            widened = S.vcvt(S.vld(sf_ub[q * LANES], dist='UNPK4_B8'), f32)
            S.vsts(inv_ub[q * LANES], S.vdiv(one, widened))

    return inverses
