"""CUDA kernel of moe_swiglu_backward and moe_swiglu_backward_and_per_token_cast (math and configuration:
moe_swiglu_backward_kernel.py).

One thread block per token. Every thread finds whether the slot is padding (_swiglu_backward_common.token_kept_macro,
a few cached reads of psum) and the token's weight; then per column tile each thread loads its run of consecutive
channels of both halves and of act_x_grad (16-byte loads), computes in fp32 and stores the gradients (and act_out).
The weight gradient's products stay in a per-thread fragment over the tiles and are reduced once per token by the
block (a fixed tree: no atomics, the same sum on every run). With the cast, each tile's fp32 gradients are reduced to
one |x| maximum per block of channels and cast as per_token_cast's CUDA kernel casts (quant/_scale_rules.py).

Straddling blocks (cfg.straddles: H = 64 * odd, 128-channel blocks, one block across the halves): the tiles are whole
blocks of the 2 H row, and each position p of a tile computes its own gradient, of the gate at column p or of the up
at column p - H (that column's gate, up and act_x_grad loaded for either), so every block's maximum is a reduction
within the tile, the block across the halves included. act_out and the weight gradient come from the gate's
positions only; a packed scale row ends in zero bytes up to a whole word. Only these configurations carry the
position guards.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by moe_swiglu_backward_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
from ..quant._scale_rules import cuda_cast_scale_and_inverse, scale_index
from ._swiglu_backward_common import argument_shapes, token_kept_macro, x_grad_sf_type


def cuda_moe_swiglu_backward_kernel(cfg):
    """`cfg` is a MoeSwigluBackwardConfig (backend "cuda")."""
    import tilelang.language as T

    f32, i32 = T.float32, T.int32
    hidden, bk, n_tiles, threads = cfg.hidden, cfg.block_k, cfg.num_col_tiles, cfg.threads
    x_dtype, grad_dtype, out_dtype = cfg.x_dtype, cfg.grad_dtype, cfg.out_dtype
    cast, with_weight, use_clamp, recompute = cfg.cast, cfg.with_weight, cfg.use_clamp, cfg.do_recompute
    num_blocks, sf_dtype = cfg.num_blocks, cfg.sf_dtype
    straddles, row_blocks, padding = cfg.straddles, cfg.row_blocks, cfg.sf_padding
    # Fragments are (groups, block): scale blocks of the cast, else rows of 64 channels (the layout only).
    block = cfg.block_size if cast else 64
    groups = bk // block
    kept = token_kept_macro(T, num_experts=cfg.num_experts, alignment=cfg.alignment) if cfg.num_experts else None

    def sf_at(t, k):
        """Token t's scale k (a UE8M0 byte when packed) in x_grad_sf, row- or column-major."""
        return scale_index(t, k, col_major=cfg.col_major_sf, packed=cfg.packed_ue8m0)

    num_tokens = T.dynamic('num_tokens')
    shapes = argument_shapes(T, cfg, num_tokens)
    sf_type = x_grad_sf_type(T, cfg, shapes, num_tokens)

    @T.prim_func
    def moe_swiglu_backward_kernel(
        x: T.Tensor(shapes['x'], x_dtype),
        x_sf: T.Tensor(shapes['x_sf'], f32),
        act_x_grad: T.Tensor(shapes['act_x_grad'], grad_dtype),
        topk_weights: T.Tensor(shapes['topk_weights'], f32),
        psum: T.Tensor(shapes['psum'], i32),
        x_grad: T.Tensor(shapes['x_grad'], out_dtype),
        weight_grad: T.Tensor(shapes['weight_grad'], f32),
        act_out: T.Tensor(shapes['act_out'], out_dtype),
        x_grad_fp8: T.Tensor(shapes['x_grad_fp8'], T.float8_e4m3fn),
        x_grad_sf: sf_type,
        routed_scaling_factor: f32,
        clamp_value: f32,
    ):
        with T.Kernel(num_tokens, threads=threads) as t:
            keep = 1
            if kept is not None:
                keep = kept(psum, t)
            weight = T.alloc_var(f32)
            weight = 1.0
            if with_weight:
                # 0 on a padding slot, whatever its weight holds (act_out = 0 * weight there).
                weight = T.if_then_else(keep != 0, topk_weights[t] * routed_scaling_factor, 0.0)
            a = T.alloc_fragment((groups, block), f32)
            b = T.alloc_fragment((groups, block), f32)
            g = T.alloc_fragment((groups, block), f32)
            s = T.alloc_fragment((groups, block), f32)
            da = T.alloc_fragment((groups, block), f32)  # straddling blocks: each position's gradient, gate's or up's
            if not straddles:
                db = T.alloc_fragment((groups, block), f32)
            if with_weight:
                acc = T.alloc_fragment((groups, block), f32)
                row_sums = T.alloc_fragment((groups,), f32)
                total = T.alloc_fragment((1,), f32)
                T.clear(acc)
            if cast:
                amax = T.alloc_fragment((groups,), f32)
                inverse = T.alloc_fragment((groups,), f32)
            if straddles:
                for j in T.serial(n_tiles):
                    # A tile of the 2 H row: position p, its column h (the gate's for p < H, the up's after).
                    for r, k in T.Parallel(groups, block):
                        p = j * bk + r * block + k
                        h = T.if_then_else(p < hidden, p, p - hidden)
                        a[r, k] = T.cast(x[t, h], f32) * x_sf[t, h // block]
                        b[r, k] = T.cast(x[t, hidden + h], f32) * x_sf[t, (hidden + h) // block]
                        g[r, k] = T.cast(act_x_grad[t, h], f32)
                    for r, k in T.Parallel(groups, block):
                        if use_clamp:
                            # The position's mask (the gate's a > c, the up's |b| > c) from the loaded values, in `da`.
                            loaded = T.if_then_else(j * bk + r * block + k < hidden, a[r, k], T.abs(b[r, k]))
                            da[r, k] = T.if_then_else(loaded > clamp_value, 0.0, 1.0)
                            a[r, k] = T.min(a[r, k], clamp_value)
                            b[r, k] = T.min(T.max(b[r, k], -clamp_value), clamp_value)
                        s[r, k] = 1.0 / (1.0 + T.exp(-a[r, k]))
                    for r, k in T.Parallel(groups, block):
                        gate = j * bk + r * block + k < hidden
                        gws = g[r, k] * weight * s[r, k]
                        grad = T.if_then_else(gate, gws * b[r, k] * (1.0 + a[r, k] * (1.0 - s[r, k])), gws * a[r, k])
                        if use_clamp:
                            grad = T.if_then_else(da[r, k] == 0.0, 0.0, grad)
                        da[r, k] = T.if_then_else(keep != 0, grad, 0.0)
                        # act, kept in `a`, 0 on a padding slot; the weight gradient sums the gate's positions only
                        a[r, k] = T.if_then_else(keep != 0, a[r, k] * s[r, k] * b[r, k], 0.0)
                        if with_weight:
                            acc[r, k] = acc[r, k] + T.if_then_else(gate, g[r, k] * a[r, k], 0.0)
                    for r, k in T.Parallel(groups, block):
                        x_grad[t, j * bk + r * block + k] = T.cast(da[r, k], out_dtype)
                    if recompute:
                        for r, k in T.Parallel(groups, block):
                            if j * bk + r * block + k < hidden:
                                act_out[t, j * bk + r * block + k] = T.cast(a[r, k] * weight, out_dtype)
                    T.reduce_absmax(da, amax, dim=1)
                    for r in T.Parallel(groups):
                        stored, inverse[r] = cuda_cast_scale_and_inverse(
                            T, amax[r], fmt='e4m3', round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0, e4m3_sf=False
                        )
                        x_grad_sf[sf_at(t, j * groups + r)] = T.if_then_else(keep != 0, stored, T.cast(0, sf_dtype))
                    for r, k in T.Parallel(groups, block):
                        x_grad_fp8[t, j * bk + r * block + k] = T.cast(da[r, k] * inverse[r], T.float8_e4m3fn)
                if padding > 0:  # packed UE8M0 (straddling blocks only): zero bytes to the row's last word
                    for q in T.serial(padding):
                        x_grad_sf[sf_at(t, row_blocks + q)] = T.uint8(0)
            else:
                for j in T.serial(n_tiles):
                    for r, k in T.Parallel(groups, block):
                        col = j * bk + r * block + k
                        if cast:
                            a[r, k] = T.cast(x[t, col], f32) * x_sf[t, j * groups + r]
                            b[r, k] = T.cast(x[t, hidden + col], f32) * x_sf[t, num_blocks + j * groups + r]
                        else:
                            a[r, k] = T.cast(x[t, col], f32)
                            b[r, k] = T.cast(x[t, hidden + col], f32)
                        g[r, k] = T.cast(act_x_grad[t, col], f32)
                    for r, k in T.Parallel(groups, block):
                        if use_clamp:
                            # The masks come from the loaded values, before the clamp.
                            da[r, k] = T.if_then_else(a[r, k] > clamp_value, 0.0, 1.0)
                            db[r, k] = T.if_then_else(T.abs(b[r, k]) > clamp_value, 0.0, 1.0)
                            a[r, k] = T.min(a[r, k], clamp_value)
                            b[r, k] = T.min(T.max(b[r, k], -clamp_value), clamp_value)
                        # A fragment, not a let: one exp per element (a let is inlined at each use).
                        s[r, k] = 1.0 / (1.0 + T.exp(-a[r, k]))
                    for r, k in T.Parallel(groups, block):
                        gws = g[r, k] * weight * s[r, k]
                        grad_a = gws * b[r, k] * (1.0 + a[r, k] * (1.0 - s[r, k]))
                        grad_b = gws * a[r, k]
                        if use_clamp:
                            grad_a = T.if_then_else(da[r, k] == 0.0, 0.0, grad_a)
                            grad_b = T.if_then_else(db[r, k] == 0.0, 0.0, grad_b)
                        da[r, k] = T.if_then_else(keep != 0, grad_a, 0.0)
                        db[r, k] = T.if_then_else(keep != 0, grad_b, 0.0)
                        # act, kept in `a` (no longer needed), 0 on a padding slot
                        a[r, k] = T.if_then_else(keep != 0, a[r, k] * s[r, k] * b[r, k], 0.0)
                        if with_weight:
                            acc[r, k] = acc[r, k] + g[r, k] * a[r, k]
                    # The stores apart from the math, so that each thread's run goes out in 16-byte stores.
                    for r, k in T.Parallel(groups, block):
                        col = j * bk + r * block + k
                        x_grad[t, col] = T.cast(da[r, k], out_dtype)
                        x_grad[t, hidden + col] = T.cast(db[r, k], out_dtype)
                    if recompute:
                        for r, k in T.Parallel(groups, block):
                            act_out[t, j * bk + r * block + k] = T.cast(a[r, k] * weight, out_dtype)
                    if cast:
                        for half, grad in ((0, da), (1, db)):
                            T.reduce_absmax(grad, amax, dim=1)
                            for r in T.Parallel(groups):
                                stored, inverse[r] = cuda_cast_scale_and_inverse(
                                    T, amax[r], fmt='e4m3', round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0,
                                    e4m3_sf=False,
                                )  # fmt: skip
                                # A padding slot's scales are 0 (TileKernels'), not the floor's.
                                x_grad_sf[sf_at(t, half * num_blocks + j * groups + r)] = T.if_then_else(
                                    keep != 0, stored, T.cast(0, sf_dtype)
                                )
                            for r, k in T.Parallel(groups, block):
                                # __nv_fp8_e4m3's conversion: nearest even, saturating to +-448.
                                x_grad_fp8[t, half * hidden + j * bk + r * block + k] = T.cast(
                                    grad[r, k] * inverse[r], T.float8_e4m3fn
                                )
            if with_weight:
                T.reduce_sum(acc, row_sums, dim=1)
                T.reduce_sum(row_sums, total, dim=0)
                weight_grad[t] = T.if_then_else(keep != 0, total[0] * routed_scaling_factor, 0.0)

    return moe_swiglu_backward_kernel
