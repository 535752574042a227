"""Ascend 950 kernel of quant.cast (math and config: cast_kernel.py).

A persistent loop over tasks of `tile` consecutive elements on the vector cores: a task's elements land in UB
(one DMA of the elements that exist: the last task is shorter), one SIMD VF converts them 64 at a time (one fp32
register), and one DMA writes the results back. Registers past the last element compute on whatever the UB
holds there and are not written to GM.

Per register: the source widened to fp32 (bf16 / fp16: an unpacking load and vcvt; e4m3 / e5m2: a load of one
byte per 32-bit lane and vcvt; all exact), then

- plain casts: vcvt to the output dtype, to nearest even (bf16 / fp16 with saturation off: IEEE overflow to
  inf; e4m3 / e5m2 after a clamp to +-448 / +-57344 by compare and select, so that the result saturates and
  NaN stays NaN whatever the conversion's saturation setting), stored packed (one 16-bit or 8-bit result per
  32-bit lane);
- stochastic rounding: the element hash on uint32 lanes (an index ramp times the step, made once per VF, plus
  index_step * first index + key per register), then the rounding of cast_kernel.py on the fp32 bits, the output
  bits packed from the low half / low byte of each lane.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by cast_kernel.py, never the other way round (no import circle): the config comes as `cfg`, the
# constants of the casts as `recipe`.

LANES = 64  # fp32 lanes of one 256-byte vector register
FP8_NAMES = ('float8_e4m3fn', 'float8_e5m2')
_SIGN = 0x80000000
_MAGNITUDE = 0x7FFFFFFF
_INF_BITS = 0x7F800000


def ascend_stochastic_macros(T, recipe):
    """The SIMD macros of the stochastic roundings (cast_kernel.py's rule), for inside a `T.SimdVF()`: the element
    hash `random_bits(ramp, key_lanes, offset)` of 64 consecutive indices (its registers from `hash_registers(key)`,
    made once per VF), and `round_bf16` / `round_e4m3`, fp32 bits to the output's bits in each uint32 lane. One home
    for every kernel that rounds stochastically (cast, per_token_cast's stochastic_cast); `recipe`:
    cast_kernel.CastRecipe."""
    S = T.simd

    @T.macro
    def random_bits(ramp, key_lanes, offset):
        """The element hash of 64 consecutive indices: ramp = lane * index_step, offset = first * step + key."""
        h = S.vadds(ramp, offset)
        h = S.vxor(h, S.vshrs(h, recipe.shift1))
        h = S.vmuls(h, T.uint32(recipe.mul1))
        h = S.vxor(h, key_lanes)
        h = S.vxor(h, S.vshrs(h, recipe.shift2))
        return S.vmuls(h, T.uint32(recipe.mul2))

    @T.macro
    def hash_registers(key):
        """The hash's constant registers of a VF, made once: (ramp, key_lanes) for random_bits."""
        ramp = S.alloc_var(T.uint32)
        ramp = S.vmuls(T.reinterpret(S.vci(0, 'int32'), 'uint32x64'), T.uint32(recipe.index_step))
        key_lanes = S.alloc_var(T.uint32)
        key_lanes = S.vdup(key, T.uint32)
        return ramp, key_lanes

    @T.macro
    def round_bf16(bits, h, magnitude, sign_bit, inf16, qnan16):
        """Stochastic fp32 -> bf16 bits (low half of each lane); the last four: constant registers."""
        mag = S.vand(bits, magnitude)
        sign = S.vshrs(S.vand(bits, sign_bit), 16)
        capped = S.vmins(mag, T.uint32(recipe.bf16_max_bits))
        rounded = S.vshrs(S.vadd(capped, S.vshrs(h, recipe.bf16_random_shift)), 16)
        rounded = S.vsel(inf16, rounded, S.vcmps(mag, T.uint32(_INF_BITS), op='ge'))
        rounded = S.vsel(qnan16, rounded, S.vcmps(mag, T.uint32(_INF_BITS), op='gt'))
        return S.vor(rounded, sign)

    @T.macro
    def round_e4m3(bits, h, magnitude, sign_bit, nan8):
        """Stochastic fp32 -> e4m3 bits (low byte of each lane); the last three: constant registers."""
        mag = S.vand(bits, magnitude)
        sign = S.vshrs(S.vand(bits, sign_bit), 24)
        a = S.vmins(T.reinterpret(mag, 'float32x64'), recipe.e4m3_max)
        lifted = S.vmuls(S.vadds(a, recipe.e4m3_min_normal), 0.5)
        aligned = T.reinterpret(S.vmax(a, lifted), 'uint32x64')
        carried = S.vadd(aligned, S.vshrs(h, recipe.e4m3_random_shift))
        code = S.vshrs(S.vadds(carried, T.uint32((1 << 32) - recipe.e4m3_code_base)), 20)
        code = S.vsel(nan8, code, S.vcmps(mag, T.uint32(_INF_BITS), op='gt'))
        return S.vor(code, sign)

    return hash_registers, random_bits, round_bf16, round_e4m3


def ascend_cast_kernel(cfg, recipe):
    """`cfg` is a CastConfig (backend "ascend"), `recipe` the CastRecipe."""
    import tilelang.ascend.language as T

    S = T.simd
    f32, u32 = T.float32, T.uint32
    in_dtype, out_dtype, out_storage = cfg.in_dtype, cfg.out_dtype, cfg.out_storage
    tile, stages, grid, stochastic = cfg.tile, cfg.num_stages, cfg.num_cores, cfg.stochastic_rounding

    fp8_max = recipe.e5m2_max if out_dtype == 'float8_e5m2' else recipe.e4m3_max  # the plain FP8 casts' clamp
    numel = T.dynamic('numel')

    @T.macro
    def load_f32(x_ub, c):
        if in_dtype == 'float32':
            return S.vld(x_ub[c * LANES])
        if in_dtype in FP8_NAMES:
            return S.vcvt(S.vld(x_ub[c * LANES], dist='UNPK4_B8'), f32)
        return S.vcvt(S.vld(x_ub[c * LANES], dist='UNPK_B16'), f32)

    @T.macro
    def store_plain(out_ub, c, v):
        if out_dtype == 'float32':
            S.vsts(out_ub[c * LANES], v)
        elif out_dtype in FP8_NAMES:
            capped = S.vsel(S.vdup(fp8_max, f32), v, S.vcmps(v, fp8_max, op='gt'))
            capped = S.vsel(S.vdup(-fp8_max, f32), capped, S.vcmps(capped, -fp8_max, op='lt'))
            narrow = S.vcvt(capped, out_dtype)
            if out_storage == 'uint8':  # e5m2 through its bits: see CastConfig.out_storage
                narrow = T.reinterpret(narrow, 'uint8x256')
            S.vsts(out_ub[c * LANES], narrow, dist='PK4_B32')
        else:
            S.vsts(out_ub[c * LANES], S.vcvt(v, out_dtype, sat=False), dist='PK_B32')

    hash_registers, random_bits, round_bf16, round_e4m3 = ascend_stochastic_macros(T, recipe)

    @T.macro
    def convert_vf(x_ub, out_ub, count, first, key):
        with T.SimdVF():
            if stochastic:
                # Registers every 64 elements use, made once per VF.
                ramp, key_lanes = hash_registers(key)
                magnitude = S.alloc_var(u32)
                magnitude = S.vdup(T.uint32(_MAGNITUDE), u32)
                sign_bit = S.alloc_var(u32)
                sign_bit = S.vdup(T.uint32(_SIGN), u32)
                special = S.alloc_var(u32)  # bf16: +inf's bits; e4m3: NaN's code
                if out_dtype == 'bfloat16':
                    special = S.vdup(T.uint32(_INF_BITS >> 16), u32)
                    qnan16 = S.alloc_var(u32)
                    qnan16 = S.vdup(T.uint32(0x7FC0), u32)
                else:
                    special = S.vdup(T.uint32(0x7F), u32)
                for c in T.serial(T.ceildiv(count, LANES)):
                    offset = T.Cast('uint32', first + c * LANES) * T.uint32(recipe.index_step) + key
                    h = random_bits(ramp, key_lanes, offset)
                    bits = T.reinterpret(load_f32(x_ub, c), 'uint32x64')
                    if out_dtype == 'bfloat16':
                        rounded = round_bf16(bits, h, magnitude, sign_bit, special, qnan16)
                        S.vsts(out_ub[c * LANES], T.reinterpret(rounded, 'uint16x128'), dist='PK_B32')
                    else:
                        rounded = round_e4m3(bits, h, magnitude, sign_bit, special)
                        S.vsts(out_ub[c * LANES], T.reinterpret(rounded, 'uint8x256'), dist='PK4_B32')
            else:
                for c in T.serial(T.ceildiv(count, LANES)):
                    store_plain(out_ub, c, load_f32(x_ub, c))

    @T.macro
    def body(x, out, key):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((tile,), in_dtype)
            out_ub = T.alloc_shared((tile,), out_storage)
            T.annotate_buffer_versions({x_ub: stages, out_ub: stages})
            for task in T.Persistent([T.ceildiv(numel, tile)], grid, cid, group_size=1, num_stages=stages):
                first = task * tile
                count = T.min(tile, numel - first)  # no int32 overflow: first < numel
                T.copy(x[first : first + count], x_ub[0:count])
                convert_vf(x_ub, out_ub, count, first, key)
                T.copy(out_ub[0:count], out[first : first + count])

    if stochastic:

        @T.prim_func
        def cast_kernel(
            x: T.Tensor((numel,), in_dtype),
            out: T.Tensor((numel,), out_storage),
            key: T.int32,
        ):
            body(x, out, T.Cast('uint32', key))

    else:

        @T.prim_func
        def cast_kernel(
            x: T.Tensor((numel,), in_dtype),
            out: T.Tensor((numel,), out_storage),
        ):
            body(x, out, None)

    return cast_kernel
