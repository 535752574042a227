"""CUDA kernel of quant.cast (math and config: cast_kernel.py).

A streaming kernel: each element is read once into registers and written once. One thread block per tile of
`tile` consecutive elements (the grid is the tile count: thousands of blocks for the benchmark shapes, so every
SM streams and the last wave is a small part of the run). Each thread owns `steps` runs of `vector` consecutive
elements, `threads * vector` elements apart, so a warp's accesses are contiguous; a run is one 16-byte access
of the narrower side and one or more of the wider one. A thread issues all its loads before the first
conversion (steps x 16-32 bytes of input in flight per thread); at 29-48 registers per thread (ptxas, sm_90a,
no shared memory) 5-8 blocks of 256 threads are resident per SM. Runs that reach past the last element take
guarded scalar accesses instead (the tails); element indices fit int32 (cast_kernel.MAX_NUMEL). Whether this
reaches 90 % of the copy bandwidth is not measured here (no GPU in this session).

Conversions: plain casts go through fp32 (exact) to the output, to nearest even (TileLang's casts: bf16 / fp16 by
IEEE; e4m3 / e5m2 by cvt.rn.satfinite, +-inf and overflow to the largest finite value, NaN kept). Stochastic
rounding computes the element hash and the rounding of cast_kernel.py in uint32 and exact fp32 arithmetic
(`__fadd_rn` / `__fmul_rn`: no contraction into a fused multiply-add can change a bit), the same operations as
the Ascend kernel's, about 25-35 instructions per element: bf16 -> e4m3 may be bound by the integer pipes
rather than by memory (to be measured).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by cast_kernel.py, never the other way round (no import circle): the config comes as `cfg`, the
# constants of the casts as `recipe`.

_ACCESS_BYTES = 16
_BYTES = {'float32': 4, 'bfloat16': 2, 'float16': 2, 'float8_e4m3fn': 1, 'float8_e5m2': 1, 'uint16': 2, 'uint8': 1}
_SIGN = 0x80000000
_MAGNITUDE = 0x7FFFFFFF
_INF_BITS = 0x7F800000


def cuda_stochastic_macros(T, recipe):
    """The macros of the stochastic roundings (cast_kernel.py's rule) in uint32 and exact fp32 arithmetic: the
    element hash `random_bits(index, key)` and `round_bf16(bits, h)` / `round_e4m3(bits, h)`, fp32 bits to the
    output's bits (uint32). One home for every kernel that rounds stochastically (cast, per_token_cast's
    stochastic_cast); `recipe`: cast_kernel.CastRecipe."""
    f32, u32 = T.float32, T.uint32

    def u(value):
        return T.uint32(value)

    @T.macro
    def random_bits(index, key):
        """The element hash of `index` (each step a let binding; nvcc merges what TVM inlines)."""
        h = T.Cast('uint32', index) * u(recipe.index_step) + key
        h = h ^ (h >> u(recipe.shift1))
        h = h * u(recipe.mul1)
        h = h ^ key
        h = h ^ (h >> u(recipe.shift2))
        return h * u(recipe.mul2)

    @T.macro
    def round_bf16(bits, h):
        """Stochastic fp32 bits -> bf16 bits (uint32)."""
        mag = bits & u(_MAGNITUDE)
        rounded = (T.min(mag, u(recipe.bf16_max_bits)) + (h >> u(recipe.bf16_random_shift))) >> u(16)
        # Compared as int32 (mag < 2**31): TVM's bound analysis of a condition cannot negate uint32 literals.
        special = T.if_then_else(T.Cast('int32', mag) == _INF_BITS, u(_INF_BITS >> 16), u(0x7FC0))
        rounded = T.if_then_else(T.Cast('int32', mag) >= _INF_BITS, special, rounded)
        return rounded | ((bits >> u(16)) & u(_SIGN >> 16))

    @T.macro
    def round_e4m3(bits, h):
        """Stochastic fp32 bits -> e4m3 bits (uint32)."""
        mag = bits & u(_MAGNITUDE)
        a = T.min(T.reinterpret(mag, f32), T.float32(recipe.e4m3_max))
        lifted = T.call_extern(
            f32, '__fmul_rn', T.call_extern(f32, '__fadd_rn', a, T.float32(recipe.e4m3_min_normal)), T.float32(0.5)
        )
        carried = T.reinterpret(T.max(a, lifted), u32) + (h >> u(recipe.e4m3_random_shift))
        code = (carried - u(recipe.e4m3_code_base)) >> u(20)
        code = T.if_then_else(T.Cast('int32', mag) > _INF_BITS, u(0x7F), code)
        return code | ((bits >> u(24)) & u(0x80))

    return random_bits, round_bf16, round_e4m3


def cuda_cast_kernel(cfg, recipe):
    """`cfg` is a CastConfig (backend "cuda"), `recipe` the CastRecipe."""
    import tilelang.language as T

    f32, u32 = T.float32, T.uint32
    in_dtype, out_dtype, out_storage = cfg.in_dtype, cfg.out_dtype, cfg.out_storage
    threads, vec, steps, tile, stochastic = cfg.threads, cfg.vector, cfg.steps, cfg.tile, cfg.stochastic_rounding
    in_chunk = min(vec, _ACCESS_BYTES // _BYTES[in_dtype])  # elements of one 16-byte access
    out_chunk = min(vec, _ACCESS_BYTES // _BYTES[out_storage])

    numel = T.dynamic('numel')

    random_bits, round_bf16, round_e4m3 = cuda_stochastic_macros(T, recipe)

    @T.macro
    def body(x, out, key):
        with T.Kernel(T.ceildiv(numel, tile), threads=threads) as bid:
            tid = T.get_thread_binding()
            xv = T.alloc_local((steps, vec), in_dtype)
            ov = T.alloc_local((vec,), out_storage)
            for s in T.unroll(steps):
                first = bid * tile + s * threads * vec + tid * vec
                if first + vec <= numel:
                    for k in T.unroll(vec // in_chunk):
                        for e in T.vectorized(in_chunk):
                            xv[s, k * in_chunk + e] = x[first + k * in_chunk + e]
                else:
                    for e in T.unroll(vec):
                        if first + e < numel:
                            xv[s, e] = x[first + e]
            for s in T.unroll(steps):
                first = bid * tile + s * threads * vec + tid * vec
                for e in T.unroll(vec):
                    if stochastic:
                        h = random_bits(first + e, key)
                        bits = T.reinterpret(T.cast(xv[s, e], f32), u32)
                        rounded = round_bf16(bits, h) if out_dtype == 'bfloat16' else round_e4m3(bits, h)
                        ov[e] = T.Cast(out_storage, rounded)
                    else:
                        ov[e] = T.cast(T.cast(xv[s, e], f32), out_dtype)
                if first + vec <= numel:
                    for k in T.unroll(vec // out_chunk):
                        for e in T.vectorized(out_chunk):
                            out[first + k * out_chunk + e] = ov[k * out_chunk + e]
                else:
                    for e in T.unroll(vec):
                        if first + e < numel:
                            out[first + e] = ov[e]

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
