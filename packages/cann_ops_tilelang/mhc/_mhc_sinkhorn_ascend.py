"""Ascend 950 kernels of mhc_sinkhorn_fwd and mhc_sinkhorn_bwd (configuration: mhc_sinkhorn_kernel.py).

A persistent loop over blocks of `cfg.tokens` tokens on the vector cores: the block GM -> UB (each token's
matrix on a 32-byte aligned UB row), a SIMT VF of one thread per token running the routine of
_mhc_sinkhorn_routine.py on UB, the result UB -> GM. SIMT rather than SIMD: a token's row and column sums are
then sums over its own registers for any mhc_mult, where 64-lane registers would need cross-lane gathers per
reduction. The backward keeps its iterates in a UB store, each thread its own column.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local variables.

from ._mhc_sinkhorn_routine import make_sinkhorn_routines


def ascend_mhc_sinkhorn_fwd_kernel(cfg):
    """`cfg` is a MhcSinkhornConfig (backend "ascend", direction "fwd")."""
    import tilelang.ascend.language as T

    mm, tokens, repeat, width = cfg.mhc_mult * cfg.mhc_mult, cfg.tokens, cfg.repeat, cfg.row_words
    num_cores, stages = cfg.num_cores, cfg.num_stages
    routine = make_sinkhorn_routines(T, cfg.mhc_mult)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def mhc_sinkhorn_fwd_kernel(
        comb_res_mix: T.Tensor((num_tokens, mm), T.float32),
        comb_res_mix_out: T.Tensor((num_tokens, mm), T.float32),
        eps: T.float32,
    ):
        with T.Kernel(num_cores) as core_id:
            in_ub = T.alloc_shared((tokens, width), T.float32)
            out_ub = T.alloc_shared((tokens, width), T.float32)
            for block in T.Persistent([T.ceildiv(num_tokens, tokens)], num_cores, core_id, group_size=1,
                                      num_stages=stages):  # fmt: skip
                start = block * tokens
                count = T.min(tokens, num_tokens - start)
                T.copy(comb_res_mix[start : start + count, :], in_ub[0:count, 0:mm])
                with T.SimtVF(threads=tokens):
                    thread = T.get_thread_binding(0)
                    if thread < count:
                        a = T.alloc_local((mm,), T.float32)
                        routine.read(a, in_ub, thread)
                        routine.forward(a, eps, repeat)
                        routine.write(out_ub, thread, a)
                T.copy(out_ub[0:count, 0:mm], comb_res_mix_out[start : start + count, :])

    return mhc_sinkhorn_fwd_kernel


def ascend_mhc_sinkhorn_bwd_kernel(cfg):
    """`cfg` is a MhcSinkhornConfig (backend "ascend", direction "bwd")."""
    import tilelang.ascend.language as T

    mm, tokens, repeat, width = cfg.mhc_mult * cfg.mhc_mult, cfg.tokens, cfg.repeat, cfg.row_words
    num_cores, stages = cfg.num_cores, cfg.num_stages
    routine = make_sinkhorn_routines(T, cfg.mhc_mult)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def mhc_sinkhorn_bwd_kernel(
        grad_output: T.Tensor((num_tokens, mm), T.float32),
        x: T.Tensor((num_tokens, mm), T.float32),
        grad_input: T.Tensor((num_tokens, mm), T.float32),
        eps: T.float32,
    ):
        with T.Kernel(num_cores) as core_id:
            grad_ub = T.alloc_shared((tokens, width), T.float32)
            x_ub = T.alloc_shared((tokens, width), T.float32)
            out_ub = T.alloc_shared((tokens, width), T.float32)
            store = T.alloc_shared((2 * repeat - 1, mm, tokens), T.float32)
            for block in T.Persistent([T.ceildiv(num_tokens, tokens)], num_cores, core_id, group_size=1,
                                      num_stages=stages):  # fmt: skip
                start = block * tokens
                count = T.min(tokens, num_tokens - start)
                T.copy(grad_output[start : start + count, :], grad_ub[0:count, 0:mm])
                T.copy(x[start : start + count, :], x_ub[0:count, 0:mm])
                with T.SimtVF(threads=tokens):
                    thread = T.get_thread_binding(0)
                    if thread < count:
                        logits = T.alloc_local((mm,), T.float32)
                        scratch = T.alloc_local((mm,), T.float32)
                        grad = T.alloc_local((mm,), T.float32)
                        routine.read(logits, x_ub, thread)
                        routine.read(grad, grad_ub, thread)
                        routine.backward(grad, scratch, logits, store, thread, eps, repeat)
                        routine.write(out_ub, thread, grad)
                T.copy(out_ub[0:count, 0:mm], grad_input[start : start + count, :])

    return mhc_sinkhorn_bwd_kernel
