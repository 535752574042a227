"""Ascend 950 kernel of moe_swiglu_forward and its fused per-token cast (math and config:
moe_swiglu_forward_kernel.py).

A persistent loop over (row, column tile) tasks on the vector cores; a core's rows rise, so it finds each row's
expert by moving one expert pointer forward over psum (read from GM as scalars). A row of an expert: its gate
and up tiles land in UB and one SIMD VF computes y in fp32 (bf16 widens exactly), counting clamped lanes into
per-core int32 lanes in UB; a padding row: a VF writes y = 0 and x is not read. bf16 / fp32 output goes back to
GM as it is; 'e4m3' output takes per_token_cast's three passes on the fp32 y (block maxima, scales, x * inverse
narrowed), with its macros, so the bytes are per_token_cast's. The per-core counts go to GM once, at the end.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by moe_swiglu_forward_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
from cann_ops_tilelang.quant._per_token_cast_ascend import ascend_quarter_masks_macro, ascend_row_macros
from cann_ops_tilelang.quant._scale_rules import LANES, UE8M0_PACK, ascend_cast_scales_macro, col_major_scales

from ._swiglu import CLAMP_COUNTERS, align_rows, ascend_swiglu_macro


def ascend_moe_swiglu_forward_kernel(cfg):
    """`cfg` is a MoeSwigluForwardConfig (backend "ascend")."""
    import tilelang.ascend.language as T

    S = T.simd
    f32, i32 = T.float32, T.int32
    hidden, bk, bs, stages, grid = cfg.hidden, cfg.block_k, cfg.block_size, cfg.num_stages, cfg.num_cores
    in_dtype, out_dtype, fp8 = cfg.in_dtype, cfg.out_dtype, cfg.fp8
    n_tiles, chunks = cfg.num_col_tiles, cfg.block_k // LANES
    groups = cfg.groups_per_tile
    groups_padded = -(-groups // LANES) * LANES  # whole registers of scales
    sf_len = groups + (cfg.sf_padding if n_tiles == 1 else 0)  # scale elements one task stores
    # A packed UE8M0 row of several tasks ending in zero padding (I > 8192, 4 n + r blocks), as in per_token_cast's
    # kernel: the row's last task stores the padding after its scales (sf_ub's lanes past `groups` are zero).
    row_padding = cfg.sf_padding if n_tiles > 1 else 0
    last_sf_len = groups + row_padding  # scale elements the row's last task stores
    counting, layout, weighted = cfg.count_clamp, cfg.with_layout, cfg.with_weight
    y_dtype = f32 if fp8 else out_dtype  # the fused cast reads the fp32 y
    count_len = CLAMP_COUNTERS * LANES
    # A short last block (I = 64 * odd, 128-channel blocks; the task is the row, bk its whole blocks): I / 64
    # registers hold gate, up and y, the last block has one of its two, and the copies and passes stop at I (UB past
    # it is never read), as in per_token_cast's kernel.
    short = cfg.short_block
    row_chunks = (hidden if short else bk) // LANES  # registers of gate, up and y one task holds

    num_tokens = T.dynamic('num_tokens')
    num_experts = T.dynamic('num_experts')
    num_weights = T.dynamic('num_weights')
    num_counts = T.dynamic('num_counts')
    sf_rows = num_tokens if fp8 else T.dynamic('sf_rows')
    sf_shape = (sf_rows, cfg.sf_cols if fp8 else 1)
    sf_dtype = cfg.sf_dtype if fp8 else f32
    col_major, packed_sf = cfg.col_major_sf, cfg.packed_ue8m0
    sf_type = T.Tensor(sf_shape, sf_dtype)
    if col_major:  # the transposed column-major scales: rows of stride sf_stride >= T
        sf_type = col_major_scales(T, num_tokens, cfg.sf_cols, sf_dtype, packed=packed_sf)

    load_in, _, _ = ascend_row_macros(T, in_dtype=in_dtype, block_size=bs, chunks=chunks)
    load_y, block_maxima, block_scalar = ascend_row_macros(
        T, in_dtype='float32', block_size=bs, chunks=chunks, valid_chunks=row_chunks if short else None
    )
    swiglu = ascend_swiglu_macro(T, clamp=cfg.clamp)
    scales = ascend_cast_scales_macro(T, fmt='e4m3', round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0,
                                      e4m3_sf=False)  # fmt: skip
    quarter_masks = ascend_quarter_masks_macro(T)

    @T.macro
    def store_y(y_ub, c, y):
        if y_dtype == 'bfloat16':
            S.vsts(y_ub[c * LANES], S.vcvt(y, T.bfloat16), dist='PK_B32')
        else:
            S.vsts(y_ub[c * LANES], y)

    @T.macro
    def swiglu_vf(g_ub, u_ub, y_ub, acc_ub, weight, clamp_value):
        with T.SimdVF():
            if counting:
                ones = S.vdup(1, i32)
                zeros = S.vdup(0, i32)
                acc = S.alloc_local((CLAMP_COUNTERS,), i32)
                for k in range(CLAMP_COUNTERS):
                    acc[k] = S.vld(acc_ub[k * LANES])
            for c in T.serial(row_chunks):
                gate = load_in(g_ub, c)
                up = load_in(u_ub, c)
                if counting:  # before the clamp: the lanes it changes
                    acc[0] = S.vadd(acc[0], S.vsel(ones, zeros, S.vcmps(gate, clamp_value, op='gt')))
                    acc[1] = S.vadd(acc[1], S.vsel(ones, zeros, S.vcmps(up, clamp_value, op='gt')))
                    acc[2] = S.vadd(acc[2], S.vsel(ones, zeros, S.vcmps(up, -clamp_value, op='lt')))
                    acc[3] = S.vadd(acc[3], ones)
                y = swiglu(gate, up, clamp_value)
                if weighted:
                    y = S.vmuls(y, weight)
                store_y(y_ub, c, y)
            if counting:
                for k in range(CLAMP_COUNTERS):
                    S.vsts(acc_ub[k * LANES], acc[k])

    @T.macro
    def zero_vf(y_ub):
        with T.SimdVF():
            zero = S.vdup(0.0, f32)
            for c in T.serial(row_chunks):
                store_y(y_ub, c, zero)

    @T.macro
    def cast_vf(y_ub, amax_ub, inv_ub, sf_ub, out_ub):
        # per_token_cast's passes on the fp32 y (its 'cast' mode with fp32 or UE8M0 scales).
        with T.SimdVF():
            low = S.pset(32, 'PAT_VL32')  # lanes 0..31: the first 32-element block of a register
            every = S.pset(32, 'PAT_ALL')  # a mask is bound to a name before it feeds another mask op
            high = S.pnot(low, every)
            quarters = quarter_masks() if bs == 16 else None
            block_maxima(y_ub, amax_ub, low, high, quarters)
            S.mem_bar('VST_VLD')
            scales(amax_ub, sf_ub, inv_ub, groups)
            S.mem_bar('VST_VLD')
            for c in T.serial(row_chunks):
                scaled = S.vmul(load_y(y_ub, c), block_scalar(inv_ub, c, low, quarters))
                S.vsts(out_ub[c * LANES], S.vcvt(scaled, T.float8_e4m3fn), dist='PK4_B32')

    @T.prim_func
    def moe_swiglu_forward_kernel(
        x: T.Tensor((num_tokens, 2 * hidden), in_dtype),
        out: T.Tensor((num_tokens, hidden), out_dtype),
        out_sf: sf_type,
        psum: T.Tensor((num_experts,), i32),
        topk_weights: T.Tensor((num_weights,), f32),
        counts: T.Tensor((num_counts,), i32),
        routed_scaling_factor: f32,
        clamp_value: f32,
    ):
        with T.Kernel(grid) as cid:
            g_ub = T.alloc_shared((bk,), in_dtype)
            u_ub = T.alloc_shared((bk,), in_dtype)
            y_ub = T.alloc_shared((bk,), y_dtype)
            versions = {g_ub: stages, u_ub: stages, y_ub: 1 if fp8 else stages}
            acc_ub = None
            if counting:
                acc_ub = T.alloc_shared((count_len,), i32)
                versions[acc_ub] = 1
                with T.SimdVF():
                    for k in range(CLAMP_COUNTERS):
                        S.vsts(acc_ub[k * LANES], S.vdup(0, i32))
            if fp8:
                amax_ub = T.alloc_shared((groups_padded,), f32)
                inv_ub = T.alloc_shared((groups_padded,), f32)
                sf_ub = T.alloc_shared((groups_padded,), sf_dtype)
                out_ub = T.alloc_shared((bk,), out_dtype)
                versions.update({amax_ub: 1, inv_ub: 1, sf_ub: stages, out_ub: stages})
            T.annotate_buffer_versions(versions)
            expert = T.alloc_var(i32, init=0)  # the first expert whose rows end after the current row
            for task in T.Persistent([num_tokens * n_tiles], grid, cid, group_size=1, num_stages=stages):
                t = task // n_tiles
                j = task % n_tiles
                valid = T.alloc_var(T.bool, init=True)
                if layout:
                    # The core's rows rise (tasks of a wave go to the cores in order): the pointer only moves on.
                    searching = T.alloc_var(T.bool, init=True)
                    while searching:
                        if expert < num_experts:
                            if psum[expert] <= t:
                                expert += 1
                            else:
                                searching = False
                        else:
                            searching = False
                    if expert >= num_experts:
                        valid = False
                    elif expert > 0:
                        valid = t >= align_rows(psum[expert - 1], cfg.alignment)
                if valid:
                    if short:  # the row (j = 0), I of the task's bk elements
                        T.copy(x[t, 0:hidden], g_ub[0:hidden])
                        T.copy(x[t, hidden : 2 * hidden], u_ub[0:hidden])
                    else:
                        T.copy(x[t, j * bk : j * bk + bk], g_ub)
                        T.copy(x[t, hidden + j * bk : hidden + j * bk + bk], u_ub)
                    weight = T.alloc_var(f32, init=1.0)
                    if weighted:
                        weight = topk_weights[t] * routed_scaling_factor
                    swiglu_vf(g_ub, u_ub, y_ub, acc_ub, weight, clamp_value)
                else:
                    zero_vf(y_ub)
                if fp8:
                    cast_vf(y_ub, amax_ub, inv_ub, sf_ub, out_ub)
                    if short:
                        T.copy(out_ub[0:hidden], out[t, 0:hidden])
                    else:
                        T.copy(out_ub, out[t, j * bk : j * bk + bk])
                    if not col_major and row_padding:
                        if j == n_tiles - 1:
                            T.copy(sf_ub[0:last_sf_len], out_sf[t, j * groups : j * groups + last_sf_len])
                        else:
                            T.copy(sf_ub[0:groups], out_sf[t, j * groups : j * groups + groups])
                    elif not col_major:
                        T.copy(sf_ub[0:sf_len], out_sf[t, j * groups : j * groups + sf_len])
                    elif packed_sf:  # whole words (groups % 4 == 0, or the row's padding ends the task), a burst each
                        word, words = j * (groups // UE8M0_PACK), sf_len // UE8M0_PACK
                        T.copy(sf_ub[0:sf_len], out_sf[word : word + words, UE8M0_PACK * t : UE8M0_PACK * (t + 1)])
                    else:  # the task's scales, one burst each, a row stride apart
                        T.copy(sf_ub[0:sf_len], out_sf[j * groups : j * groups + sf_len, t])
                else:
                    T.copy(y_ub, out[t, j * bk : j * bk + bk])
            if counting:
                T.copy(acc_ub, counts[cid * count_len : cid * count_len + count_len])

    return moe_swiglu_forward_kernel
