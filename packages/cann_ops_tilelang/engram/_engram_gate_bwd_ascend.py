"""Ascend 950 kernel body of engram_gate_bwd (math and the grad_w_partial contract: engram_gate_bwd_kernel.py).

The chunked scheme, on the vector cores: tokens in chunks of `token_chunk`;
phase A computes dL/dg (and grad_v) of every token of the chunk, phase B walks the column tiles and, per
tile, the chunk's tokens, keeping the tile's weight-gradient accumulator on chip and adding it to the
block's slice of grad_w_partial once per chunk. grad_out is read in both phases, so this path moves
hc * H * 2 more bytes per token (~20 % more traffic).

The core adds into its slice of grad_w_partial, which the caller passes zero-filled.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which refer to
# the generator's local shape variables.

# This module does not import engram_gate_bwd_kernel.py (which imports it): the config comes as `cfg`, the
# prim_func signature as `prim_func`, and the constant the config checks too lives here.
LANES = 64  # fp32 lanes of one 256-byte Ascend vector register


def ascend_chunked_kernel(cfg, prim_func):
    """`cfg` is an EngramGateBwdConfig; `prim_func` the signature builder _engram_gate_bwd_prim_func."""
    import tilelang.ascend.language as T

    hc, hidden, P, D, TC = cfg.hc, cfg.hidden, cfg.num_blocks, cfg.tile_cols, cfg.token_chunk
    has_mask = cfg.has_mask
    L = LANES
    n_tiles = hidden // D
    C = D // L
    TCH = TC * hc  # lanes of the per-chunk scalar vectors (<= 64): lane = i * hc + h
    scale = hidden**-0.5
    inv_h = 1.0 / hidden
    num_tokens = T.dynamic('num_tokens')
    kv_stride_t, kv_stride_h = T.dynamic('kv_stride_t'), T.dynamic('kv_stride_h')

    @T.macro
    def phase_a_vf(i, go_ub, v_ub, sc_ub, dl_ub, gv_ub):
        # dL/dg partials (accumulated over tiles) and the grad_v tile of one text token.
        with T.SimdVF():
            for h in T.serial(hc):
                acc = T.simd.alloc_var(T.float32)
                acc = T.simd.vdup(0.0, T.float32)
                for c in T.serial(C):
                    gf = T.simd.vcvt(T.simd.vld(go_ub[h, c * L], dist='UNPK_B16'), T.float32)
                    vf = T.simd.vcvt(T.simd.vld(v_ub[c * L], dist='UNPK_B16'), T.float32)
                    T.simd.vmula(acc, gf, vf)
                total = T.simd.vcadd(acc)  # lane 0: the tile's sum
                prev = T.simd.vld(dl_ub[i * hc + h], dist='BRC_B32')
                T.simd.vsts(dl_ub[i * hc + h], T.simd.vadd(total, prev), dist='ONEPT_B32')
            for c in T.serial(C):
                acc2 = T.simd.alloc_var(T.float32)
                acc2 = T.simd.vdup(0.0, T.float32)
                for h in T.serial(hc):
                    gf = T.simd.vcvt(T.simd.vld(go_ub[h, c * L], dist='UNPK_B16'), T.float32)
                    gb = T.simd.vld(sc_ub[1, i * hc + h], dist='BRC_B32')
                    T.simd.vmula(acc2, gf, gb)
                T.simd.vsts(gv_ub[c * L], T.simd.vcvt(acc2, T.bfloat16), dist='PK_B32')

    @T.macro
    def phase_b_vf(i, go_ub, x_ub, k_ub, w_ub, r_ub, gx_ub, gk_ub, gw_ub):
        # The grad_x, grad_k tiles of one text token and its share of the weight-gradient tile.
        with T.SimdVF():
            for h in T.serial(hc):
                rb = T.simd.vld(r_ub[0, i * hc + h], dist='BRC_B32')
                cxb = T.simd.vld(r_ub[1, i * hc + h], dist='BRC_B32')
                ckb = T.simd.vld(r_ub[2, i * hc + h], dist='BRC_B32')
                for c in T.serial(C):
                    xf = T.simd.vcvt(T.simd.vld(x_ub[h, c * L], dist='UNPK_B16'), T.float32)
                    kf = T.simd.vcvt(T.simd.vld(k_ub[h, c * L], dist='UNPK_B16'), T.float32)
                    gf = T.simd.vcvt(T.simd.vld(go_ub[h, c * L], dist='UNPK_B16'), T.float32)
                    wf = T.simd.vld(w_ub[h, c * L])
                    tx = T.simd.vsub(T.simd.vmul(kf, wf), T.simd.vmul(xf, cxb))
                    gxv = T.simd.vadd(gf, T.simd.vmul(rb, tx))
                    T.simd.vsts(gx_ub[h, c * L], T.simd.vcvt(gxv, T.bfloat16), dist='PK_B32')
                    tk = T.simd.vsub(T.simd.vmul(xf, wf), T.simd.vmul(kf, ckb))
                    gkv = T.simd.vmul(rb, tk)
                    T.simd.vsts(gk_ub[h, c * L], T.simd.vcvt(gkv, T.bfloat16), dist='PK_B32')
                    acc = T.simd.alloc_var(T.float32)
                    acc = T.simd.vld(gw_ub[h, c * L])
                    T.simd.vmula(acc, T.simd.vmul(rb, xf), kf)
                    T.simd.vsts(gw_ub[h, c * L], acc)

    @T.macro
    def body(
        grad_out,
        hidden_states,
        kv,
        weight_fused,
        dot,
        gate_score,
        rstd_x,
        rstd_k,
        image_token_mask,
        grad_x,
        grad_kv,
        grad_w_partial,
        clamp_value,
        token_counter,
    ):
        dot1 = T.reshape(dot, (num_tokens * hc,))
        gate1 = T.reshape(gate_score, (num_tokens * hc,))
        rx1 = T.reshape(rstd_x, (num_tokens * hc,))
        rk1 = T.reshape(rstd_k, (num_tokens * hc,))
        with T.Kernel(P) as cid:
            go_ub = T.alloc_shared((hc, D), T.bfloat16)
            x_ub = T.alloc_shared((hc, D), T.bfloat16)
            k_ub = T.alloc_shared((hc, D), T.bfloat16)
            gx_ub = T.alloc_shared((hc, D), T.bfloat16)
            gk_ub = T.alloc_shared((hc, D), T.bfloat16)
            v_ub = T.alloc_shared((D,), T.bfloat16)
            gv_ub = T.alloc_shared((D,), T.bfloat16)
            w_ub = T.alloc_shared((hc, D), T.float32)
            gw_ub = T.alloc_shared((hc, D), T.float32)
            sc_ub = T.alloc_shared((4, L), T.float32)  # dot, gate, rstd_x, rstd_k of the chunk (lane i*hc+h)
            dl_ub = T.alloc_shared((L,), T.float32)  # dL/dg of the chunk
            r_ub = T.alloc_shared((3, L), T.float32)  # r, dot*rstd_x^2/H, dot*rstd_k^2/H

            # Round-robin chunks over the cores (a plain loop lowers much faster than T.Persistent here).
            # grad_w_partial arrives zero-filled: every chunk adds its tile accumulators to the core's slice.
            for wc in T.serial(T.ceildiv(T.ceildiv(num_tokens, TC) - cid, P)):
                chunk = wc * P + cid
                c0 = chunk * TC
                nv = T.min(TC, num_tokens - c0)
                with T.Task():
                    T.copy(dot1[c0 * hc : c0 * hc + TCH], sc_ub[0, 0:TCH])
                    T.copy(gate1[c0 * hc : c0 * hc + TCH], sc_ub[1, 0:TCH])
                    T.copy(rx1[c0 * hc : c0 * hc + TCH], sc_ub[2, 0:TCH])
                    T.copy(rk1[c0 * hc : c0 * hc + TCH], sc_ub[3, 0:TCH])
                with T.SimdVF():
                    T.simd.vsts(dl_ub[0], T.simd.vdup(0.0, T.float32))
                # ---- phase A: dL/dg of the chunk's tokens (accumulated over tiles), grad_v
                for it in T.serial(nv * n_tiles):  # one flat loop over (token, tile)
                    i = it // n_tiles
                    d = it % n_tiles
                    t = c0 + i
                    with T.Task():
                        T.copy(grad_out[t, :, d * D : (d + 1) * D], go_ub)
                        T.copy(kv[t, hc, d * D : (d + 1) * D], v_ub)
                    if has_mask:
                        if image_token_mask[t]:  # an image token: grad_v = 0 (its dL/dg is never used)
                            with T.SimdVF():
                                zero = T.simd.vcvt(T.simd.vdup(0.0, T.float32), T.bfloat16)
                                for c in T.serial(C):
                                    T.simd.vsts(gv_ub[c * L], zero, dist='PK_B32')
                        else:
                            phase_a_vf(i, go_ub, v_ub, sc_ub, dl_ub, gv_ub)
                    else:
                        phase_a_vf(i, go_ub, v_ub, sc_ub, dl_ub, gv_ub)
                    T.copy(gv_ub, grad_kv[t, hc, d * D : (d + 1) * D])
                # ---- r, dot*rstd_x^2/H, dot*rstd_k^2/H of the chunk, one lane per (token, branch)
                with T.SimdVF():
                    dl = T.simd.vld(dl_ub[0])
                    dv = T.simd.vld(sc_ub[0, 0])
                    gv = T.simd.vld(sc_ub[1, 0])
                    rx = T.simd.vld(sc_ub[2, 0])
                    rk = T.simd.vld(sc_ub[3, 0])
                    a = T.simd.vmuls(T.simd.vmul(rx, rk), scale)
                    ad = T.simd.vabs(dv)
                    dabs = T.simd.vabs(T.simd.vmuls(T.simd.vmul(T.simd.vmul(dv, rx), rk), scale))
                    clamped = T.simd.vcmps(dabs, clamp_value, op='lt')
                    root = T.simd.vsqrt(T.simd.vdiv(a, ad))
                    one = T.simd.vdup(1.0, T.float32)
                    rv = T.simd.vmul(T.simd.vmul(T.simd.vmul(dl, gv), T.simd.vsub(one, gv)), T.simd.vmuls(root, 0.5))
                    T.simd.vsts(r_ub[0, 0], T.simd.vsel(T.simd.vdup(0.0, T.float32), rv, clamped))
                    T.simd.vsts(r_ub[1, 0], T.simd.vmuls(T.simd.vmul(T.simd.vmul(dv, rx), rx), inv_h))
                    T.simd.vsts(r_ub[2, 0], T.simd.vmuls(T.simd.vmul(T.simd.vmul(dv, rk), rk), inv_h))
                # ---- phase B: per tile, the chunk's tokens; the tile's weight gradient stays in UB
                for d in T.serial(n_tiles):
                    with T.Task():
                        T.copy(weight_fused[:, d * D : (d + 1) * D], w_ub)
                        T.copy(grad_w_partial[cid, :, d * D : (d + 1) * D], gw_ub)
                    for i in T.serial(nv):
                        t = c0 + i
                        with T.Task():
                            T.copy(grad_out[t, :, d * D : (d + 1) * D], go_ub)
                            T.copy(hidden_states[t, :, d * D : (d + 1) * D], x_ub)
                            T.copy(kv[t, 0:hc, d * D : (d + 1) * D], k_ub)
                        if has_mask:
                            if image_token_mask[t]:
                                # An image token: grad_x = grad_out bit for bit (16-bit lanes unpacked and packed
                                # back, no conversion), grad_k = 0, no share of the weight gradient.
                                with T.SimdVF():
                                    zero = T.simd.vcvt(T.simd.vdup(0.0, T.float32), T.bfloat16)
                                    for h in T.serial(hc):
                                        for c in T.serial(C):
                                            go16 = T.simd.vld(go_ub[h, c * L], dist='UNPK_B16')
                                            T.simd.vsts(gx_ub[h, c * L], go16, dist='PK_B32')
                                            T.simd.vsts(gk_ub[h, c * L], zero, dist='PK_B32')
                            else:
                                phase_b_vf(i, go_ub, x_ub, k_ub, w_ub, r_ub, gx_ub, gk_ub, gw_ub)
                        else:
                            phase_b_vf(i, go_ub, x_ub, k_ub, w_ub, r_ub, gx_ub, gk_ub, gw_ub)
                        with T.Task():
                            T.copy(gx_ub, grad_x[t, :, d * D : (d + 1) * D])
                            T.copy(gk_ub, grad_kv[t, 0:hc, d * D : (d + 1) * D])
                    T.copy(gw_ub, grad_w_partial[cid, :, d * D : (d + 1) * D])

    return prim_func(
        T,
        body,
        hc=hc,
        hidden=hidden,
        num_blocks=P,
        has_mask=cfg.has_mask,
        num_tokens=num_tokens,
        strides=(kv_stride_t, kv_stride_h),
    )
