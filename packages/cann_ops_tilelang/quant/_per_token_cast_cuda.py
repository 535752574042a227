"""CUDA kernel of per_token_cast (math and config: per_token_cast_kernel.py).

One thread block per (token, column tile): the tile is read once into registers, reduced to one |x| maximum per
block, and each element is scaled in fp32 (bf16 widens exactly) and narrowed to float8_e4m3fn (the saturating
conversion), or rounded to an e2m1 code (fp4.cuda_e2m1_code: compares on the grid's midpoints, the same
rounding as the Ascend kernel; sm_90 has no FP4 conversion) and packed two codes a byte.
With cfg.stochastic the e4m3 narrowing is quant.cast's stochastic rounding instead (_cast_cuda.cuda_stochastic_macros:
the element hash of t * H + h, the key a launch argument), written as uint8 bits, and the e2m1 rounding is
fp4.cuda_e2m1_stochastic_code with the same hash (the packing unchanged); lowered in the CPU tier, not yet run on a
GPU. Mode 'sf_only' skips the data stores; mode 'precomputed' takes the IEEE reciprocals of the given scales (fp32 or
e4m3) instead of the reduction (the saturating narrowing caps what they overflow). Mode 'recast' (a quantised x)
differs in the tile load only: e4m3 codes, each widened (exact) and multiplied by its block's scale as cast_back's
CUDA kernel does (_cast_back_cuda.cuda_scale_of), one fp32 rounding, into the fp32 tile the rest reads as an fp32 x's.

Column-major scales (cfg.col_major_sf): the thread block of token t stores its scales at out_sf[k, t] of the
transposed view, so its `groups` stores are 4-byte (UE8M0 / E4M3: 1-byte) stores T_aligned elements apart instead
of one run. That is fine as it is: blockIdx.x is the token, so the blocks of neighbouring tokens run at the same
time and fill the same 32-byte sectors, which the write-back L2 merges before they reach DRAM (the DRAM traffic
stays the scale bytes); what grows is the L2 store requests, one per scale instead of one per 32 bytes, e.g. 56
per 7168-channel bf16 row (14 KiB read, 7 KiB written) with 128-channel blocks, about 1 % of the row's requests.
Several tokens per block would coalesce them, at the cost of the one-token tiling the chooser measured (docs/quant.md).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by per_token_cast_kernel.py, never the other way round (no import circle): the config comes as `cfg`.
import functools

from ._cast_back_cuda import cuda_scale_of, cuda_scales_type
from ._cast_cuda import cuda_stochastic_macros
from ._per_token_cast_signature import per_token_cast_prim_func
from ._scale_rules import cuda_cast_scale_and_inverse, cuda_inverse_of, scale_index
from .fp4 import cuda_e2m1_code, cuda_e2m1_stochastic_code


def cuda_per_token_cast_kernel(cfg, recipe):
    """`cfg` is a PerTokenCastConfig (backend "cuda"), `recipe` quant.cast's CastRecipe (the stochastic rounding's
    constants)."""
    import tilelang.language as T

    hidden, bk, bs = cfg.hidden, cfg.block_k, cfg.block_size
    groups, n_tiles = cfg.groups_per_tile, cfg.num_col_tiles
    padding, num_blocks = cfg.sf_padding, cfg.num_blocks
    in_dtype = cfg.in_dtype
    # Mode 'recast': x is e4m3 data whose tile loads widen each code and multiply it by its block's scale, the
    # product cast_back's fp32 output holds; the tile (in_dtype float32) then goes on as an fp32 x's.
    quantised_x = cfg.quantised_x
    x_dtype = 'float8_e4m3fn' if quantised_x else in_dtype
    fp4, stochastic = cfg.fp4, cfg.stochastic
    # A short last block (H = 64 * odd, 128-channel blocks): the last tile reaches past H, so its loads read zeros
    # there and its stores stop at H; a block wholly past H (the tiles' overhang) stores no scale. Only these
    # configurations carry the guards.
    short = cfg.short_block
    random_bits, _, round_e4m3 = cuda_stochastic_macros(T, recipe)
    # FP4: each thread owns runs of `run` consecutive elements (up to 16 bytes of x: one load), whose codes make
    # run / 2 consecutive bytes (one store); a fragment is indexed alike in every parallel loop, so a run is one
    # index. The runs of a tile must spread evenly over the threads (else shorter runs, down to a byte's pair).
    run = 16 // {'float8_e4m3fn': 1, 'bfloat16': 2, 'float32': 4}[x_dtype]
    while run > 2 and (bk // run) % cfg.threads:
        run //= 2
    runs = bs // run  # per block
    scale_and_inverse = functools.partial(
        cuda_cast_scale_and_inverse,
        T, fmt=cfg.fmt, round_sf=cfg.round_sf, packed_ue8m0=cfg.packed_ue8m0, e4m3_sf=cfg.e4m3_sf,
    )  # fmt: skip

    writes_data, computes_sf = cfg.writes_data, cfg.computes_sf
    num_tokens = T.dynamic('num_tokens')
    x_type = T.Tensor((num_tokens, hidden), x_dtype)
    x_sf_type = None if quantised_x is None else cuda_scales_type(T, quantised_x, num_tokens, 'x_sf_stride')
    if cfg.strided_rows:  # rows x_stride elements apart, each starting on 16 bytes (the interface checks it)
        x_stride = T.dynamic('x_stride')
        x_type = T.StridedTensor((num_tokens, hidden), (x_stride, 1), in_dtype)

    sf_at = functools.partial(scale_index, col_major=cfg.col_major_sf, packed=cfg.packed_ue8m0)

    def element(x, x_sf, t, column):
        """Element (t, column) of the tile: x's, or ('recast') the fp32 product of the e4m3 code and its block's
        scale, one rounding as in cast_back (the widenings are exact)."""
        if quantised_x is None:
            return x[t, column]
        bt, bc = quantised_x.block_tokens, quantised_x.block_channels
        block = column // bc
        if short:  # past H the product is discarded, but its scale is read unguarded: keep that read in x_sf
            block = T.min(block, quantised_x.num_blocks - 1)
        at = scale_index(t // bt, block, col_major=quantised_x.col_major_sf, packed=quantised_x.packed_ue8m0)
        return T.cast(x[t, column], T.float32) * cuda_scale_of(T, quantised_x, x_sf[at])

    def inside(column):
        """Whether a column of the tile is one of x's: True (a Python bool, no guard) unless the block is short."""
        return column < hidden if short else True

    @T.macro
    def load_runs(x, x_sf, t, j, xv):
        """FP4: the tile of (token t, column tile j) into the fragment xv (groups, runs, run)."""
        for g, r in T.Parallel(groups, runs):
            for e in T.vectorized(run):
                if short:  # a run lies wholly inside or past H (both multiples of 64)
                    xv[g, r, e] = T.if_then_else(
                        j * bk + g * bs + r * run < hidden,
                        element(x, x_sf, t, j * bk + g * bs + r * run + e),
                        T.cast(0, in_dtype),
                    )
                else:
                    xv[g, r, e] = element(x, x_sf, t, j * bk + g * bs + r * run + e)

    @T.macro
    def store_fp4_runs(out, t, j, codes, packed, load, inverse_of, key=None):
        """The FP4 bytes of run r of block g of column tile j, out[t, (j * bk + g * bs + r * run) / 2 + i] for
        i < run / 2 (the offset written in bytes, so the stores vectorize): the e2m1 codes of the run's elements
        (x's dtype, `load(g, r, e)`) scaled by `inverse_of(g)`, element 2 i in the low nibble of byte i. With a
        `key` (cfg.stochastic) the codes are the stochastic rounding's, hashing element t * H + h."""
        for g, r in T.Parallel(groups, runs):
            if inside(j * bk + g * bs + r * run):
                for e in T.unroll(run):
                    if key is None:
                        codes[e] = cuda_e2m1_code(T, T.cast(load(g, r, e), T.float32) * inverse_of(g))
                    else:
                        h = random_bits(t * hidden + j * bk + g * bs + r * run + e, key)
                        codes[e] = cuda_e2m1_stochastic_code(T, T.cast(load(g, r, e), T.float32) * inverse_of(g), h)
                for i in T.unroll(run // 2):
                    packed[i] = T.cast(codes[2 * i] | (codes[2 * i + 1] << T.uint32(4)), T.int8)
                for i in T.vectorized(run // 2):
                    out[t, j * (bk // 2) + g * (bs // 2) + r * (run // 2) + i] = packed[i]

    @T.macro
    def body(x, out, out_sf, sf, key):
        # Tokens on grid x (up to 2**31 - 1 blocks; y stops at 65535), column tiles on y.
        with T.Kernel(num_tokens, n_tiles, threads=cfg.threads) as (t, j):
            if cfg.strided_rows:  # so that the loads keep their 16-byte vectors
                T.evaluate(T.assume(x_stride % (16 // (2 if in_dtype == 'bfloat16' else 4)) == 0))
            if computes_sf:
                # The tile stays in x's dtype in registers (half the registers for bf16, so more tiles in flight per
                # SM); its |x| maximum is exact in any dtype and widens exactly.
                amax = T.alloc_fragment((groups,), in_dtype)
                inverse = T.alloc_fragment((groups,), T.float32) if writes_data else None
                if fp4 and writes_data:
                    xv = T.alloc_fragment((groups, runs, run), in_dtype)
                    run_max = T.alloc_fragment((groups, runs), in_dtype)
                    load_runs(x, sf, t, j, xv)
                    T.reduce_absmax(xv, run_max, dim=2)
                    T.reduce_max(run_max, amax, dim=1)
                else:
                    xv = T.alloc_fragment((groups, bs), in_dtype)
                    for g, k in T.Parallel(groups, bs):
                        if short:
                            xv[g, k] = T.if_then_else(
                                j * bk + g * bs + k < hidden,
                                element(x, sf, t, j * bk + g * bs + k),
                                T.cast(0, in_dtype),
                            )
                        else:
                            xv[g, k] = element(x, sf, t, j * bk + g * bs + k)
                    T.reduce_absmax(xv, amax, dim=1)
                for g in T.Parallel(groups):
                    if inside((j * groups + g) * bs):  # a block wholly past H has no scale to store
                        if writes_data:
                            out_sf[sf_at(t, j * groups + g)], inverse[g] = scale_and_inverse(T.cast(amax[g], T.float32))
                        else:
                            out_sf[sf_at(t, j * groups + g)] = scale_and_inverse(T.cast(amax[g], T.float32))[0]
                if writes_data:
                    if fp4:
                        codes = T.alloc_local((run,), T.uint32)
                        packed = T.alloc_local((run // 2,), T.int8)
                        store_fp4_runs(
                            out, t, j, codes, packed, lambda g, r, e: xv[g, r, e], lambda g: inverse[g],
                            key if stochastic else None,
                        )  # fmt: skip
                    elif stochastic:
                        for g, k in T.Parallel(groups, bs):
                            # quant.cast's stochastic rounding to e4m3 bits of element t * H + h (a product
                            # that is bit for bit the plain cast's), written as uint8.
                            if inside(j * bk + g * bs + k):
                                scaled = T.cast(xv[g, k], T.float32) * inverse[g]
                                h = random_bits(t * hidden + j * bk + g * bs + k, key)
                                code = round_e4m3(T.reinterpret(scaled, T.uint32), h)
                                out[t, j * bk + g * bs + k] = T.Cast('uint8', code)
                    else:
                        for g, k in T.Parallel(groups, bs):
                            # __nv_fp8_e4m3's conversion: nearest even, saturating to +-448, NaN kept.
                            if inside(j * bk + g * bs + k):
                                out[t, j * bk + g * bs + k] = T.cast(
                                    T.cast(xv[g, k], T.float32) * inverse[g], T.float8_e4m3fn
                                )
                if padding > 0 and j == n_tiles - 1:
                    for p in T.serial(padding):
                        out_sf[sf_at(t, num_blocks + p)] = T.uint8(0)
            elif fp4:
                # One streaming pass: the scale's load and reciprocal are the same for a thread's vector of a block.
                xv = T.alloc_fragment((groups, runs, run), in_dtype)  # the runs' 16-byte loads
                load_runs(x, None, t, j, xv)
                codes = T.alloc_local((run,), T.uint32)
                packed = T.alloc_local((run // 2,), T.int8)
                store_fp4_runs(
                    out, t, j, codes, packed, lambda g, r, e: xv[g, r, e],
                    lambda g: cuda_inverse_of(T, T.cast(sf[t, j * groups + g], T.float32)),
                )  # fmt: skip
            else:
                for g, k in T.Parallel(groups, bs):
                    if inside(j * bk + g * bs + k):
                        out[t, j * bk + g * bs + k] = T.cast(
                            T.cast(x[t, j * bk + g * bs + k], T.float32)
                            * cuda_inverse_of(T, T.cast(sf[t, j * groups + g], T.float32)),
                            T.float8_e4m3fn,
                        )

    return per_token_cast_prim_func(T, cfg, num_tokens, x_type, body, x_sf_type)
