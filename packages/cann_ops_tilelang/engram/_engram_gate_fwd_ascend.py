"""Ascend 950 kernel body of engram_gate_fwd (math, config and the prim_func signature: engram_gate_fwd_kernel.py)."""

# No `from __future__ import annotations`: TileLang reads the prim_func annotations at build time.

# This module does not import engram_gate_fwd_kernel.py (which imports it): the config comes as `cfg`, the
# prim_func signature as `prim_func`, and the constant the config checks too lives here.
ASCEND_LANES = 64  # fp32 lanes of one 256-byte vector register


def ascend_engram_gate_fwd_kernel(cfg, prim_func):
    """SIMD kernel. A task is (token t, group of `group` branches); tasks go round-robin over the vector
    cores (T.Persistent, `stages` buffer versions so the DMA of the next task overlaps the vector work).

    Per task: the value row kv[t, hc] (H), the x and key rows of the group ((group, H) bf16, the key rows
    kv[t, h0 : h0 + group] through kv's strides) and, unless it stays resident for the whole kernel, the
    fp32 weight rows land in UB; one vector pass
    per branch accumulates x*x, k*k and x*w*k in three 64-lane registers, folds them (vcadd) and computes
    rstd_x, rstd_k and the gate in lane 0; a second pass writes out = x + g*v over the x tile in place
    (bf16), which then goes back to GM.

    `cfg` is an EngramGateFwdConfig; `prim_func` the signature builder _engram_gate_fwd_prim_func.
    """
    import tilelang.ascend.language as T

    hc, hidden, save, has_mask = cfg.hc, cfg.hidden, cfg.save_for_backward, cfg.has_mask
    grp, stages, resident = cfg.group, cfg.stages, cfg.weight_resident
    ngrp = hc // grp
    lanes = ASCEND_LANES
    nchunk = hidden // lanes
    inv_hidden = 1.0 / hidden
    scale = hidden**-0.5
    num_cores = cfg.num_cores
    f32, bf16 = T.float32, T.bfloat16

    num_tokens = T.dynamic('num_tokens')
    kv_st = T.dynamic('kv_stride_t')
    kv_sh = T.dynamic('kv_stride_h')

    @T.macro
    def gate_vf(x_ub, k_ub, v_ub, w_ub, s_ub, h0, eps, clamp_value):
        with T.SimdVF():
            one = T.simd.vdup(1.0, f32)
            zero = T.simd.vdup(0.0, f32)
            for i in T.serial(grp):
                wr = h0 + i if resident else i
                axx = T.simd.alloc_var(f32)
                akk = T.simd.alloc_var(f32)
                adt = T.simd.alloc_var(f32)
                axx = T.simd.vdup(0.0, f32)
                akk = T.simd.vdup(0.0, f32)
                adt = T.simd.vdup(0.0, f32)
                for c in T.serial(nchunk):
                    xv = T.simd.vcvt(T.simd.vld(x_ub[i, c * lanes], dist='UNPK_B16'), f32)
                    kv = T.simd.vcvt(T.simd.vld(k_ub[i, c * lanes], dist='UNPK_B16'), f32)
                    wv = T.simd.vld(w_ub[wr, c * lanes])
                    T.simd.vmula(axx, xv, xv)
                    T.simd.vmula(akk, kv, kv)
                    T.simd.vmula(adt, T.simd.vmul(xv, wv), kv)
                sdt = T.simd.vcadd(adt)
                rx = T.simd.vdiv(one, T.simd.vsqrt(T.simd.vadds(T.simd.vmuls(T.simd.vcadd(axx), inv_hidden), eps)))
                rk = T.simd.vdiv(one, T.simd.vsqrt(T.simd.vadds(T.simd.vmuls(T.simd.vcadd(akk), inv_hidden), eps)))
                d = T.simd.vmuls(T.simd.vmul(T.simd.vmul(sdt, rx), rk), scale)
                z = T.simd.vsqrt(T.simd.vmaxs(T.simd.vabs(d), clamp_value))
                z = T.simd.vsel(
                    z,
                    T.simd.vsel(T.simd.vneg(z), zero, T.simd.vcmps(d, 0.0, op='lt')),
                    T.simd.vcmps(d, 0.0, op='gt'),
                )
                g = T.simd.vdiv(one, T.simd.vadds(T.simd.vexp(T.simd.vneg(z)), 1.0))
                if save:
                    T.simd.vsts(s_ub[0, i], sdt, dist='ONEPT_B32')
                    T.simd.vsts(s_ub[1, i], g, dist='ONEPT_B32')
                    T.simd.vsts(s_ub[2, i], rx, dist='ONEPT_B32')
                    T.simd.vsts(s_ub[3, i], rk, dist='ONEPT_B32')
                gb = T.simd.vdupv(g)
                for c in T.serial(nchunk):
                    o = T.simd.alloc_var(f32)
                    o = T.simd.vcvt(T.simd.vld(x_ub[i, c * lanes], dist='UNPK_B16'), f32)
                    vv = T.simd.vcvt(T.simd.vld(v_ub[c * lanes], dist='UNPK_B16'), f32)
                    T.simd.vmula(o, gb, vv)
                    T.simd.vsts(x_ub[i, c * lanes], T.simd.vcvt(o, bf16), dist='PK_B32')

    @T.macro
    def body(x, kv, w, image_token_mask, out, dot_o, g_o, rx_o, rk_o, eps, clamp_value):
        with T.Kernel(num_cores) as cid:
            x_ub = T.alloc_shared((grp, hidden), bf16)  # x, then out (in place)
            k_ub = T.alloc_shared((grp, hidden), bf16)
            v_ub = T.alloc_shared((hidden,), bf16)
            w_ub = T.alloc_shared((hc if resident else grp, hidden), f32)
            s_ub = T.alloc_shared((4, 8), f32)  # dot, g, rstd_x, rstd_k of the group (32-byte rows)
            if resident:
                T.copy(w, w_ub)
                T.annotate_buffer_versions({x_ub: stages, k_ub: stages, v_ub: stages, w_ub: 1})
            else:
                T.annotate_buffer_versions({x_ub: stages, k_ub: stages, v_ub: stages, w_ub: stages})
            for task in T.Persistent([num_tokens * ngrp], num_cores, cid, group_size=1, num_stages=stages):
                t = task // ngrp
                h0 = (task % ngrp) * grp
                # One scheduler task per pipe (MTE2 loads, vector, MTE3 stores) keeps the Z3
                # modulo scheduling of the loop small (lowering time).
                with T.Task():
                    T.copy(x[t, h0 : h0 + grp, :], x_ub)
                    T.copy(kv[t, h0 : h0 + grp, :], k_ub)
                    T.copy(kv[t, hc, :], v_ub)
                    if not resident:
                        T.copy(w[h0 : h0 + grp, :], w_ub)
                if has_mask:
                    # An image token: out = x (x_ub goes back unchanged, bit for bit), saved tensors 0.
                    if image_token_mask[t]:
                        if save:
                            with T.SimdVF():
                                zero = T.simd.vdup(0.0, f32)
                                for i in T.serial(grp):
                                    for r in T.serial(4):
                                        T.simd.vsts(s_ub[r, i], zero, dist='ONEPT_B32')
                    else:
                        gate_vf(x_ub, k_ub, v_ub, w_ub, s_ub, h0, eps, clamp_value)
                else:
                    gate_vf(x_ub, k_ub, v_ub, w_ub, s_ub, h0, eps, clamp_value)
                with T.Task():
                    T.copy(x_ub, out[t, h0 : h0 + grp, :])
                    if save:
                        T.copy(s_ub[0, 0:grp], dot_o[t, h0 : h0 + grp])
                        T.copy(s_ub[1, 0:grp], g_o[t, h0 : h0 + grp])
                        T.copy(s_ub[2, 0:grp], rx_o[t, h0 : h0 + grp])
                        T.copy(s_ub[3, 0:grp], rk_o[t, h0 : h0 + grp])

    return prim_func(
        T,
        body,
        hc=hc,
        hidden=hidden,
        save=save,
        has_mask=cfg.has_mask,
        num_tokens=num_tokens,
        strides=(kv_st, kv_sh),
    )
