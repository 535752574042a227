"""CUDA kernels of mhc_sinkhorn_fwd and mhc_sinkhorn_bwd (configuration: mhc_sinkhorn_kernel.py).

One thread per token, `cfg.tokens` per block; the last block masks the tail. The forward reads and writes each
token once; the backward keeps its iterates in shared memory, each thread its own column (no barrier).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.

from ._mhc_sinkhorn_routine import make_sinkhorn_routines


def newton_reciprocal(T):
    """1 / x for positive normal x without IEEE division's slow-path branch: the hardware's approximate reciprocal
    (__fdividef, within 2 ulp) refined by one Newton step, r + r * (1 - x * r) (within an ulp of 1 / x)."""

    def reciprocal(x):
        r = T.call_extern(T.float32, '__fdividef', T.float32(1.0), x)
        return T.ieee_fmaf(r, T.ieee_fmaf(-x, r, T.float32(1.0)), r)

    return reciprocal


def sinkhorn_routines(T, cfg):
    """The Sinkhorn routines of a CUDA configuration `cfg` (MhcSinkhornConfig): its mhc_mult and reciprocal (one
    home: the Sinkhorn kernels and the fused pre path's kernel)."""
    return make_sinkhorn_routines(T, cfg.mhc_mult, newton_reciprocal(T) if cfg.reciprocal == 'newton' else None)


def cuda_mhc_sinkhorn_fwd_kernel(cfg):
    """`cfg` is a MhcSinkhornConfig (backend "cuda", direction "fwd")."""
    import tilelang.language as T

    mm, tokens, repeat = cfg.mhc_mult * cfg.mhc_mult, cfg.tokens, cfg.repeat
    routine = sinkhorn_routines(T, cfg)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def mhc_sinkhorn_fwd_kernel(
        comb_res_mix: T.Tensor((num_tokens, mm), T.float32),
        comb_res_mix_out: T.Tensor((num_tokens, mm), T.float32),
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, tokens), threads=tokens) as block:
            token = block * tokens + T.get_thread_binding()
            a = T.alloc_local((mm,), T.float32)
            if token < num_tokens:
                routine.read(a, comb_res_mix, token)
                routine.forward(a, eps, repeat)
                routine.write(comb_res_mix_out, token, a)

    return mhc_sinkhorn_fwd_kernel


def cuda_mhc_sinkhorn_bwd_kernel(cfg):
    """`cfg` is a MhcSinkhornConfig (backend "cuda", direction "bwd")."""
    import tilelang.language as T

    mm, tokens, repeat = cfg.mhc_mult * cfg.mhc_mult, cfg.tokens, cfg.repeat
    routine = sinkhorn_routines(T, cfg)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def mhc_sinkhorn_bwd_kernel(
        grad_output: T.Tensor((num_tokens, mm), T.float32),
        x: T.Tensor((num_tokens, mm), T.float32),
        grad_input: T.Tensor((num_tokens, mm), T.float32),
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, tokens), threads=tokens) as block:
            thread = T.get_thread_binding()
            token = block * tokens + thread
            store = T.alloc_shared((2 * repeat - 1, mm, tokens), T.float32)
            logits = T.alloc_local((mm,), T.float32)
            scratch = T.alloc_local((mm,), T.float32)
            grad = T.alloc_local((mm,), T.float32)
            if token < num_tokens:
                routine.read(logits, x, token)
                routine.read(grad, grad_output, token)
                routine.backward(grad, scratch, logits, store, thread, eps, repeat)
                routine.write(grad_input, token, grad)

    return mhc_sinkhorn_bwd_kernel
