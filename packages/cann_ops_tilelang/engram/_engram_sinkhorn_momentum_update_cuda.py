"""CUDA kernel of engram_sinkhorn_momentum_update.

Math, block shapes and config: engram_sinkhorn_momentum_update_kernel.py.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.

# Imported by engram_sinkhorn_momentum_update_kernel.py, never the other way round (no import circle): the config comes
# as `cfg`, and the access width, which the config checks too, lives here.
CUDA_CHUNK = 4  # elements per thread and access (16-byte fp32, 8-byte bf16)


def cuda_engram_sinkhorn_momentum_update_kernel(cfg):
    """`cfg` is an EngramSinkhornMomentumUpdateConfig (backend "cuda")."""
    import tilelang.language as T

    blk, nt, nesterov = cfg.block, cfg.threads, cfg.nesterov
    vc = CUDA_CHUNK
    chunks = blk // (nt * vc)  # chunks per thread
    f32, bf16 = T.float32, T.bfloat16
    gdt = bf16 if cfg.grad_dtype == 'bfloat16' else f32
    mdt = bf16 if cfg.momentum_dtype == 'bfloat16' else f32
    numel = T.dynamic('numel')

    @T.prim_func
    def engram_sinkhorn_momentum_update_kernel(
        grad: T.Tensor((numel,), gdt),
        momentum_buffer: T.Tensor((numel,), mdt),
        sinkhorn_input: T.Tensor((numel,), f32),
        beta1: T.float32,
        one_minus_beta1: T.float32,
    ):
        with T.Kernel(T.ceildiv(numel, blk), threads=nt) as bx:
            tid = T.get_thread_binding()
            g_l = T.alloc_local((chunks * vc,), gdt)
            m_l = T.alloc_local((chunks * vc,), mdt)
            o_l = T.alloc_local((chunks * vc,), f32)
            mn = T.alloc_var(f32)
            e0 = bx * blk
            if e0 + blk <= numel:
                # Full block: thread `tid` owns the 4-element chunks e0 + (q * nt + tid) * 4, q = 0 .. chunks - 1;
                # all its loads are issued before the first use.
                for q in T.unroll(chunks):
                    base = e0 + (q * nt + tid) * vc
                    for j in T.vectorized(vc):
                        g_l[q * vc + j] = grad[base + j]
                    for j in T.vectorized(vc):
                        m_l[q * vc + j] = momentum_buffer[base + j]
                for i in T.unroll(chunks * vc):
                    s = one_minus_beta1 * T.cast(g_l[i], f32)
                    mn = T.ieee_fmaf(T.cast(m_l[i], f32), beta1, s)
                    m_l[i] = T.cast(mn, mdt)
                    o_l[i] = T.ieee_fmaf(mn, beta1, s) if nesterov else mn
                for q in T.unroll(chunks):
                    base = e0 + (q * nt + tid) * vc
                    for j in T.vectorized(vc):
                        momentum_buffer[base + j] = m_l[q * vc + j]
                    for j in T.vectorized(vc):
                        sinkhorn_input[base + j] = o_l[q * vc + j]
            else:
                # The last, partial block: element-wise, guarded (at most blk - 1 elements).
                for i in T.serial(chunks * vc):
                    e = e0 + i * nt + tid
                    if e < numel:
                        s = one_minus_beta1 * T.cast(grad[e], f32)
                        mn = T.ieee_fmaf(T.cast(momentum_buffer[e], f32), beta1, s)
                        momentum_buffer[e] = T.cast(mn, mdt)
                        sinkhorn_input[e] = T.ieee_fmaf(mn, beta1, s) if nesterov else mn

    return engram_sinkhorn_momentum_update_kernel
