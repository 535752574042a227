"""Ascend 950 kernel of per_block_cast_lossless (math and config: per_block_cast_lossless_kernel.py).

A persistent loop over (output token block, column tile) tasks on the vector cores, two buffer versions. Per task
the FP4 tile (up to bto rows of block_k / 2 bytes) and the slice of input scales it needs land in UB, and one
SIMD VF makes four passes, all in 32-bit integer lanes (64 per register):

1. the input exponents: UE8M0 bytes widened one per lane (UNPK4_B8), or fp32 bits shifted right by 23 and masked;
   kept per scale row, with a running column maximum down the rows that exist;
2. the output exponents, 64 output blocks per register: the column maxima of the `in_per_out` input blocks of an
   output block are neighbours, so log2(in_per_out) rounds of de-interleave (even / odd lanes) and vmax reduce
   them in order; E = max(M, 6) - 6, stored as fp32 bits E << 23 or as UE8M0 bytes (lanes past the task's blocks
   zeroed: the zero padding of a packed row);
3. E broadcast to the lanes of each 128-element step (one lane per FP4 byte, i.e. per element pair);
4. per scale row and step, the exponent offset d = max(e - E, -16) of each lane's input block (a broadcast load
   per block, selected by lane index), then per row: the step's 64 bytes widened (UNPK4_B8), each nibble's fp32
   built on the bits (0, 2 ** (d - 1), or (m << 22) + ((126 + d) << 23), the code's sign), narrowed with vcvt to
   e4m3 (nearest even: exact within the bound), and the even / odd element bytes joined into 16-bit lanes whose
   packing store (PK_B32) writes the 128 output bytes in element order.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_block_cast_lossless_kernel.py, never the other way round: the config comes as `cfg`.
from ._scale_rules import LANES, UE8M0_PACK, col_major_scales

_CHUNK = 2 * LANES  # elements of one step: 64 FP4 bytes, one per 32-bit lane


def _sizes(cfg):
    gin, gout, gpo = cfg.in_groups, cfg.out_groups, cfg.in_per_out
    in_regs = -(-gin // LANES)  # registers of input exponents per scale row
    out_regs = -(-gout // LANES)  # registers of output exponents per task
    sm = cfg.sf_rows_per_task
    # Rows of the scale slice start 32-byte aligned (what the widening load needs), with room for a whole
    # register loaded at the start of the last one.
    per_32 = 32 if cfg.in_packed else 8
    raw_w = -(-gin // per_32) * per_32
    raw_rows = -(-((sm - 1) * raw_w + in_regs * LANES) // raw_w)
    return gin, gout, gpo, in_regs, out_regs, sm, raw_rows, raw_w


def ascend_buffer_shapes(cfg):
    """(shape, bytes per element, versions) of each UB buffer the kernel allocates (the config's UB estimate)."""
    _, _, gpo, in_regs, out_regs, sm, raw_rows, raw_w = _sizes(cfg)
    bto, bk, st = cfg.out_block_tokens, cfg.block_k, cfg.num_stages
    in_item = 1 if cfg.in_packed else 4
    out_item = 1 if cfg.out_packed else 4
    return [
        ((bto, bk // 2), 1, st),  # x_ub
        ((bto, bk), 1, st),  # out_ub
        ((raw_rows, raw_w), in_item, st),  # raw_ub
        ((out_regs * LANES,), out_item, st),  # osf_ub
        ((sm * in_regs * LANES,), 4, 1),  # exp_ub
        ((out_regs * gpo * LANES,), 4, 1),  # colmax_ub
        ((out_regs * LANES,), 4, 1),  # e_ub
        ((bk // 2,), 4, 1),  # ecol_ub
    ]


def ascend_per_block_cast_lossless_kernel(cfg):
    """`cfg` is a PerBlockCastLosslessConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    i32 = T.int32
    hidden, bk, stages = cfg.hidden, cfg.block_k, cfg.num_stages
    bti, bci, bto, bco = cfg.in_block_tokens, cfg.in_block_channels, cfg.out_block_tokens, cfg.out_block_channels
    in_sf_dtype, out_sf_dtype = cfg.in_sf_dtype, cfg.out_sf_dtype
    in_packed, out_packed = cfg.in_packed, cfg.out_packed
    gin, gout, gpo, in_regs, out_regs, sm, raw_rows, raw_w = _sizes(cfg)
    n_tiles, padding = cfg.num_col_tiles, cfg.out_sf_padding
    steps = bk // _CHUNK
    in_per_step, out_per_step = _CHUNK // bci, _CHUNK // bco  # blocks of one step: 1..8 and 1..4
    lanes_per_in, lanes_per_out = bci // 2, bco // 2
    grid = cfg.num_cores
    per_token = bti == 1
    headroom, min_offset = cfg.headroom, cfg.min_offset

    num_tokens = T.dynamic('num_tokens')
    in_sf_rows = num_tokens if per_token else T.ceildiv(num_tokens, bti)
    out_sf_rows = T.ceildiv(num_tokens, bto)

    @T.macro
    def load_exponents(raw_ub, r, q):
        """Biased exponents of 64 input scales from row r of the task's slice, one per int32 lane."""
        if in_packed:
            return T.reinterpret(S.vld(raw_ub[r, q * LANES], dist='UNPK4_B8'), 'int32x64')
        bits = T.reinterpret(S.vld(raw_ub[r, q * LANES]), 'int32x64')
        return S.vand(S.vshrs(bits, 23), S.vdup(0xFF, i32))

    def group_max(regs):
        """Maxima of each `len(regs)` neighbouring lanes of the registers, taken as one sequence, in order."""
        while len(regs) > 1:
            merged = []
            for i in range(0, len(regs), 2):
                even, odd = S.vdintlv(regs[i], regs[i + 1])
                merged.append(S.vmax(even, odd))
            regs = merged
        return regs[0]

    @T.macro
    def broadcast_by_lane(src_ub, first, count, lanes_each, lane):
        """src_ub[first + k] on the lanes k * lanes_each .. (k + 1) * lanes_each - 1, k < count."""
        value = S.alloc_var(i32)
        value = S.vld(src_ub[first], dist='BRC_B32')
        for k in range(1, count):
            value = S.vsel(S.vld(src_ub[first + k], dist='BRC_B32'), value, S.vcmps(lane, k * lanes_each, op='ge'))
        return value

    @T.macro
    def element_bits(code, base, zero):
        """fp32 bits of e2m1 code (0..15 per lane) times 2**d, base = (126 + d) << 23: exact on the bits."""
        magnitude = S.vand(code, S.vdup(7, i32))
        bits = S.vadd(S.vshls(magnitude, 22), base)
        bits = S.vsel(base, bits, S.vcmps(magnitude, 1, op='eq'))  # 0.5 * 2**d
        bits = S.vsel(zero, bits, S.vcmps(magnitude, 0, op='eq'))
        return S.vor(bits, S.vshls(S.vand(code, S.vdup(8, i32)), 28))

    @T.macro
    def e4m3_byte(bits):
        narrow = S.vcvt(T.reinterpret(bits, 'float32x64'), T.float8_e4m3fn)
        return S.vand(T.reinterpret(narrow, 'int32x64'), S.vdup(0xFF, i32))

    @T.macro
    def lossless_vf(x_ub, raw_ub, exp_ub, colmax_ub, e_ub, ecol_ub, osf_ub, out_ub, valid, sf_valid):
        with T.SimdVF():
            lane = S.vci(0, i32)
            zero = S.vdup(0, i32)
            # Pass 1: input exponents and their maxima down the valid scale rows.
            for q in T.serial(in_regs):
                acc = S.alloc_var(i32)
                acc = zero
                for r in T.serial(sf_valid):
                    e = load_exponents(raw_ub, r, q)
                    S.vsts(exp_ub[(r * in_regs + q) * LANES], e)
                    acc = S.vmax(acc, e)
                S.vsts(colmax_ub[q * LANES], acc)
            for q in T.serial(out_regs * gpo - in_regs):  # lanes past the task's blocks: exponent 0
                S.vsts(colmax_ub[(in_regs + q) * LANES], zero)
            S.mem_bar('VST_VLD')
            # Pass 2: output exponents, 64 blocks per register.
            for w in T.serial(out_regs):
                top = group_max([S.vld(colmax_ub[(w * gpo + i) * LANES]) for i in range(gpo)])
                out_exp = S.vadds(S.vmaxs(top, headroom), -headroom)
                out_exp = S.vsel(out_exp, zero, S.vcmps(lane, gout - w * LANES, op='lt'))
                S.vsts(e_ub[w * LANES], out_exp)
                if out_packed:
                    S.vsts(osf_ub[w * LANES], T.reinterpret(out_exp, 'uint8x256'), dist='PK4_B32')
                else:
                    S.vsts(osf_ub[w * LANES], T.reinterpret(S.vshls(out_exp, 23), 'float32x64'))
            S.mem_bar('VST_VLD')
            # Pass 3: E on the lanes of each step.
            for c in T.serial(steps):
                S.vsts(ecol_ub[c * LANES], broadcast_by_lane(e_ub, c * out_per_step, out_per_step, lanes_per_out, lane))
            S.mem_bar('VST_VLD')
            # Pass 4: the elements, one scale row at a time.
            for g in T.serial(sf_valid):
                for c in T.serial(steps):
                    in_exp = broadcast_by_lane(
                        exp_ub, g * in_regs * LANES + c * in_per_step, in_per_step, lanes_per_in, lane
                    )
                    d = S.vmaxs(S.vsub(in_exp, S.vld(ecol_ub[c * LANES])), min_offset)
                    base = S.vshls(S.vadds(d, 126), 23)
                    for r in T.serial(1 if per_token else T.min(bti, valid - g * bti)):
                        row = g + r if per_token else g * bti + r
                        packed = T.reinterpret(S.vld(x_ub[row, c * LANES], dist='UNPK4_B8'), 'int32x64')
                        low = e4m3_byte(element_bits(S.vand(packed, S.vdup(0xF, i32)), base, zero))
                        high = e4m3_byte(element_bits(S.vand(S.vshrs(packed, 4), S.vdup(0xF, i32)), base, zero))
                        pair = S.vor(low, S.vshls(high, 8))
                        S.vsts(out_ub[row, c * _CHUNK], T.reinterpret(pair, 'uint16x128'), dist='PK_B32')

    out_sf_type = T.Tensor((out_sf_rows, cfg.out_sf_cols), out_sf_dtype)
    if cfg.col_major_sf:  # the transposed column-major scales: rows of stride sf_stride >= ceil(T / bto)
        out_sf_type = col_major_scales(T, out_sf_rows, cfg.out_sf_cols, out_sf_dtype, packed=out_packed)

    @T.prim_func
    def per_block_cast_lossless_kernel(
        x: T.Tensor((num_tokens, hidden // 2), T.uint8),
        x_sf: T.Tensor((in_sf_rows, cfg.in_sf_cols), in_sf_dtype),
        out: T.Tensor((num_tokens, hidden), T.float8_e4m3fn),
        out_sf: out_sf_type,
    ):
        with T.Kernel(grid) as cid:
            x_ub = T.alloc_shared((bto, bk // 2), T.uint8)
            out_ub = T.alloc_shared((bto, bk), T.float8_e4m3fn)
            raw_ub = T.alloc_shared((raw_rows, raw_w), in_sf_dtype)
            osf_ub = T.alloc_shared((out_regs * LANES,), out_sf_dtype)
            exp_ub = T.alloc_shared((sm * in_regs * LANES,), i32)
            colmax_ub = T.alloc_shared((out_regs * gpo * LANES,), i32)
            e_ub = T.alloc_shared((out_regs * LANES,), i32)
            ecol_ub = T.alloc_shared((bk // 2,), i32)
            T.annotate_buffer_versions(
                {
                    x_ub: stages,
                    out_ub: stages,
                    raw_ub: stages,
                    osf_ub: stages,
                    exp_ub: 1,
                    colmax_ub: 1,
                    e_ub: 1,
                    ecol_ub: 1,
                }
            )
            for task in T.Persistent([out_sf_rows * n_tiles], grid, cid, group_size=1, num_stages=stages):
                b = task // n_tiles
                j = task % n_tiles
                t0 = b * bto
                valid = T.min(bto, num_tokens - t0)
                s0 = t0 if per_token else t0 // bti
                sf_valid = valid if per_token else T.ceildiv(valid, bti)
                T.copy(x[t0 : t0 + valid, j * (bk // 2) : j * (bk // 2) + bk // 2], x_ub[0:valid, :])
                T.copy(x_sf[s0 : s0 + sf_valid, j * gin : j * gin + gin], raw_ub[0:sf_valid, 0:gin])
                lossless_vf(x_ub, raw_ub, exp_ub, colmax_ub, e_ub, ecol_ub, osf_ub, out_ub, valid, sf_valid)
                T.copy(out_ub[0:valid, :], out[t0 : t0 + valid, j * bk : j * bk + bk])
                if cfg.col_major_sf and out_packed:
                    # Whole words (the config checks it), one burst each to the next row of the transposed view.
                    sf_len = gout + (padding if n_tiles == 1 else 0)
                    word, words = j * (gout // UE8M0_PACK), sf_len // UE8M0_PACK
                    T.copy(osf_ub[0:sf_len], out_sf[word : word + words, UE8M0_PACK * b : UE8M0_PACK * (b + 1)])
                elif cfg.col_major_sf:  # one fp32 scale per burst, each to the next row of the transposed view
                    T.copy(osf_ub[0:gout], out_sf[j * gout : j * gout + gout, b])
                elif padding > 0:
                    # The last column tile also writes the row's zero padding bytes.
                    sf_len = T.if_then_else(j == n_tiles - 1, gout + padding, gout)
                    T.copy(osf_ub[0:sf_len], out_sf[b, j * gout : j * gout + sf_len])
                else:
                    T.copy(osf_ub[0:gout], out_sf[b, j * gout : j * gout + gout])

    return per_block_cast_lossless_kernel
