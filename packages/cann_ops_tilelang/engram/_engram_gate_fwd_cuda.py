"""CUDA kernel body of engram_gate_fwd (math, config and the prim_func signature: engram_gate_fwd_kernel.py)."""

# No `from __future__ import annotations`: TileLang reads the prim_func annotations at build time.

# This module does not import engram_gate_fwd_kernel.py (which imports it): the config comes as `cfg`, the
# prim_func signature as `prim_func`, and the constant the config checks too lives here.
CUDA_VEC = 8  # bf16 elements per 16-byte access: the unit ("chunk") a thread owns


def cuda_engram_gate_fwd_kernel(cfg, prim_func):
    """`cfg` is an EngramGateFwdConfig; `prim_func` the signature builder _engram_gate_fwd_prim_func."""
    import tilelang.language as T

    hc, hidden, save, has_mask = cfg.hc, cfg.hidden, cfg.save_for_backward, cfg.has_mask
    nt, nc, vec = cfg.threads, cfg.chunks, cfg.vec
    npb = cfg.persistent_blocks
    nw = nt // 32
    ve = CUDA_VEC
    guard = (hidden // ve) % nt != 0  # the last chunk of some threads is past the row
    inv_hidden = 1.0 / hidden
    scale = hidden**-0.5
    f32, bf16 = T.float32, T.bfloat16

    num_tokens = T.dynamic('num_tokens')
    kv_st = T.dynamic('kv_stride_t')
    kv_sh = T.dynamic('kv_stride_h')

    @T.macro
    def store_gated(out, x_l, v_l, st, t, h, col, c):
        for j0 in T.unroll(ve // vec):
            for j in T.vectorized(vec):
                out[t, h, col + j0 * vec + j] = T.cast(
                    T.cast(x_l[c * ve + j0 * vec + j], f32) + st[3] * T.cast(v_l[c * ve + j0 * vec + j], f32),
                    bf16,
                )

    @T.macro
    def body(x, kv, w, image_token_mask, out, dot_o, g_o, rx_o, rk_o, eps, clamp_value):
        with T.Kernel(hc * npb, threads=nt) as bid:
            # `red` is double-buffered by token parity: the one barrier below is all it needs.
            T.annotate_pass_configs({'tl.disable_thread_storage_sync': True})
            T.annotate_min_blocks_per_sm(cfg.blocks_per_core)
            # The host chose `vec` from kv's address and outer strides (engram_gate_fwd._launcher).
            T.evaluate(T.assume(kv_st % vec == 0))
            T.evaluate(T.assume(kv_sh % vec == 0))
            tid = T.get_thread_binding()
            h = bid % hc
            b = bid // hc
            w_l = T.alloc_local((nc * ve,), f32)
            x_l = T.alloc_local((nc * ve,), bf16)
            k_l = T.alloc_local((nc * ve,), bf16)
            v_l = T.alloc_local((nc * ve,), bf16)
            acc = T.alloc_local((3,), f32)
            tot = T.alloc_local((3,), f32)
            st = T.alloc_local((4,), f32)  # rstd_x, rstd_k, d, g
            red = T.alloc_shared((2, 3, nw), f32)

            # The weight row of branch h, once per block (kept in registers).
            for c in T.unroll(nc):
                col = (tid + c * nt) * ve
                if not guard or col < hidden:
                    for j in T.vectorized(ve):
                        w_l[c * ve + j] = w[h, col + j]
                else:
                    for j in T.unroll(ve):
                        w_l[c * ve + j] = 0.0

            for i in T.serial(T.ceildiv(num_tokens - b, npb)):
                t = b + i * npb
                # Issue every load of the row (x, k and v) before any use.
                for c in T.unroll(nc):
                    col = (tid + c * nt) * ve
                    if not guard or col < hidden:
                        for j0 in T.unroll(ve // vec):
                            for j in T.vectorized(vec):
                                x_l[c * ve + j0 * vec + j] = x[t, h, col + j0 * vec + j]
                        for j0 in T.unroll(ve // vec):
                            for j in T.vectorized(vec):
                                k_l[c * ve + j0 * vec + j] = kv[t, h, col + j0 * vec + j]
                        for j0 in T.unroll(ve // vec):
                            for j in T.vectorized(vec):
                                v_l[c * ve + j0 * vec + j] = kv[t, hc, col + j0 * vec + j]
                    else:
                        for j in T.unroll(ve):
                            x_l[c * ve + j] = T.cast(0, bf16)
                            k_l[c * ve + j] = T.cast(0, bf16)
                            v_l[c * ve + j] = T.cast(0, bf16)
                acc[0] = 0.0
                acc[1] = 0.0
                acc[2] = 0.0
                for c in T.unroll(nc):
                    for j in T.unroll(ve):
                        xf = T.cast(x_l[c * ve + j], f32)
                        kf = T.cast(k_l[c * ve + j], f32)
                        acc[0] += xf * xf
                        acc[1] += kf * kf
                        acc[2] += xf * w_l[c * ve + j] * kf
                for r in T.unroll(3):
                    tot[r] = T.warp_reduce_sum(acc[r])
                # Cross-warp reduction; `red` alternates by token parity so one barrier suffices.
                if tid % 32 == 0:
                    for r in T.unroll(3):
                        red[i % 2, r, tid // 32] = tot[r]
                T.sync_threads()
                for r in T.unroll(3):
                    tot[r] = red[i % 2, r, 0]
                    for q in T.unroll(1, nw):
                        tot[r] += red[i % 2, r, q]
                st[0] = T.rsqrt(tot[0] * inv_hidden + eps)
                st[1] = T.rsqrt(tot[1] * inv_hidden + eps)
                st[2] = tot[2] * st[0] * st[1] * scale
                st[3] = T.sqrt(T.max(T.abs(st[2]), clamp_value))
                st[3] = T.if_then_else(st[2] > 0, st[3], T.if_then_else(st[2] < 0, -st[3], T.float32(0)))
                st[3] = 1.0 / (1.0 + T.exp(-st[3]))
                if has_mask:  # noqa: SIM102 (a Python-level switch around a device-side condition)
                    if image_token_mask[t]:  # an image token: saved tensors 0, out = x (below)
                        tot[2] = 0.0
                        for r in T.unroll(4):
                            st[r] = 0.0
                if save:  # noqa: SIM102
                    if tid == 0:
                        dot_o[t, h] = tot[2]
                        g_o[t, h] = st[3]
                        rx_o[t, h] = st[0]
                        rk_o[t, h] = st[1]
                for c in T.unroll(nc):
                    col = (tid + c * nt) * ve
                    if not guard or col < hidden:
                        if has_mask:
                            if image_token_mask[t]:  # x itself, bit for bit (x + 0 * v would not be: -0, inf)
                                for j0 in T.unroll(ve // vec):
                                    for j in T.vectorized(vec):
                                        out[t, h, col + j0 * vec + j] = x_l[c * ve + j0 * vec + j]
                            else:
                                store_gated(out, x_l, v_l, st, t, h, col, c)
                        else:
                            store_gated(out, x_l, v_l, st, t, h, col, c)

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
