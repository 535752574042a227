"""CUDA kernel of moe_swiglu_forward and its fused per-token cast (math and config: moe_swiglu_forward_kernel.py).

One thread block per (row, column tile). Without the expert layout the gate and up tiles are loaded into
registers at once (16-byte loads); with it, the block first finds its row's expert by a binary search over psum
(a few cached loads), and a padding row reads nothing and writes zeros. y is computed in fp32 (bf16 widens
exactly) and stored as bf16 / fp32, or cast as per_token_cast's CUDA kernel casts its input: one |y| maximum per
block of channels, its scale and inverse (_scale_rules), y * inverse narrowed by the saturating conversion.
Clamp counts: per block of channels, the four counts (each <= 128) packed in the bytes of one int32, summed by a
register reduction, no atomics.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by moe_swiglu_forward_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
from cann_ops_tilelang.quant._scale_rules import col_major_scales, cuda_cast_scale_and_inverse, scale_index

from ._swiglu import align_rows, cuda_swiglu

_SEARCH_STEPS = 32  # binary search steps over psum: enough for any int32 expert count


def cuda_moe_swiglu_forward_kernel(cfg):
    """`cfg` is a MoeSwigluForwardConfig (backend "cuda")."""
    import tilelang.language as T

    f32, i32 = T.float32, T.int32
    hidden, bk, bs = cfg.hidden, cfg.block_k, cfg.block_size
    groups, n_tiles, padding, num_blocks = cfg.groups_per_tile, cfg.num_col_tiles, cfg.sf_padding, cfg.num_blocks
    in_dtype, out_dtype, fp8 = cfg.in_dtype, cfg.out_dtype, cfg.fp8
    counting, layout, weighted = cfg.count_clamp, cfg.with_layout, cfg.with_weight
    # A short last block (I = 64 * odd, 128-channel blocks): the last tile reaches past I, as per_token_cast's does;
    # there gate and up read as zeros (y = 0: no effect on the block's maximum, nothing counted) and nothing is
    # stored, a block wholly past I has no scale. Only these configurations carry the guards.
    short = cfg.short_block

    def inside(column):
        """Whether a column of the tile is one of the row's: True (a Python bool, no guard) unless a block is short."""
        return column < hidden if short else True

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

    def sf_at(t, k):
        """Row t's scale k (a UE8M0 byte when packed) in out_sf, row- or column-major."""
        return scale_index(t, k, col_major=col_major, packed=packed_sf)

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
        with T.Kernel(num_tokens, n_tiles, threads=cfg.threads) as (t, j):
            gate = T.alloc_fragment((groups, bs), in_dtype)
            up = T.alloc_fragment((groups, bs), in_dtype)
            y = T.alloc_fragment((groups, bs), f32)
            valid = T.alloc_var(T.bool, init=True)
            if layout:
                # The first expert e with psum[e] > t (psum non-decreasing); t is its row past its aligned start.
                low = T.alloc_var(i32, init=0)
                high = T.alloc_var(i32, init=num_experts)
                for _ in T.serial(_SEARCH_STEPS):
                    if low < high:
                        middle = (low + high) // 2
                        if psum[middle] <= t:
                            low = middle + 1
                        else:
                            high = middle
                if low >= num_experts:
                    valid = False
                elif low > 0:
                    valid = t >= align_rows(psum[low - 1], cfg.alignment)
            weight = T.alloc_var(f32, init=1.0)
            if valid:
                for g, k in T.Parallel(groups, bs):
                    if short:
                        column = j * bk + g * bs + k
                        gate[g, k] = T.if_then_else(column < hidden, x[t, column], T.cast(0, in_dtype))
                        up[g, k] = T.if_then_else(column < hidden, x[t, hidden + column], T.cast(0, in_dtype))
                    else:
                        gate[g, k] = x[t, j * bk + g * bs + k]
                        up[g, k] = x[t, hidden + j * bk + g * bs + k]
                if weighted:
                    weight = topk_weights[t] * routed_scaling_factor
            for g, k in T.Parallel(groups, bs):
                value = cuda_swiglu(T, T.cast(gate[g, k], f32), T.cast(up[g, k], f32),
                                    clamp_value if cfg.clamp else None)  # fmt: skip
                if weighted:
                    value = value * weight
                y[g, k] = T.if_then_else(valid, value, T.float32(0.0))
            if counting:
                packed = T.alloc_fragment((groups, bs), i32)
                per_block = T.alloc_fragment((groups,), i32)
                for g, k in T.Parallel(groups, bs):
                    # One byte per count: gate > c, up > c, up < -c, elements of a non-padding row.
                    g32 = T.cast(gate[g, k], f32)
                    u32 = T.cast(up[g, k], f32)
                    packed[g, k] = T.if_then_else(
                        valid,
                        T.cast(g32 > clamp_value, i32)
                        + (T.cast(u32 > clamp_value, i32) << 8)
                        + (T.cast(u32 < -clamp_value, i32) << 16)
                        + (T.cast(j * bk + g * bs + k < hidden, i32) << 24 if short else 1 << 24),
                        0,
                    )
                T.reduce_sum(packed, per_block, dim=1)
                for g in T.Parallel(groups):
                    counts[(t * n_tiles + j) * groups + g] = per_block[g]
            if fp8:
                amax = T.alloc_fragment((groups,), f32)
                inverse = T.alloc_fragment((groups,), f32)
                T.reduce_absmax(y, amax, dim=1)
                for g in T.Parallel(groups):
                    if inside((j * groups + g) * bs):  # a block wholly past I has no scale to store
                        out_sf[sf_at(t, j * groups + g)], inverse[g] = cuda_cast_scale_and_inverse(
                            T, amax[g], fmt='e4m3', round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0,
                            e4m3_sf=False,
                        )  # fmt: skip
                for g, k in T.Parallel(groups, bs):
                    # __nv_fp8_e4m3's conversion: nearest even, saturating to +-448, NaN kept.
                    if inside(j * bk + g * bs + k):
                        out[t, j * bk + g * bs + k] = T.cast(y[g, k] * inverse[g], T.float8_e4m3fn)
                if padding > 0 and j == n_tiles - 1:
                    for p in T.serial(padding):
                        out_sf[sf_at(t, num_blocks + p)] = T.uint8(0)
            else:
                for g, k in T.Parallel(groups, bs):
                    out[t, j * bk + g * bs + k] = T.cast(y[g, k], out_dtype)

    return moe_swiglu_forward_kernel
