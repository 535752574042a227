"""What the SwiGLU backward kernels of both backends share: the scalar test that tells a token slot from a padding
slot, and the prim_func's argument shapes.

The expert layout (_swiglu.py, TileKernels 2.1.0's): psum_num_tokens_per_expert[e] is the end of expert e's
tokens in the expanded token dimension; they start at align(psum[e - 1], TOKEN_ALIGNMENT) (psum[-1] = 0). The
slots between psum[e - 1] and that aligned start, and every slot from psum[E - 1] on, are padding: the kernels
write zeros there. For slot t the kernels find e, the first expert whose end passes t, by a binary search over
psum (ceil(log2(E + 1)) reads of psum from global memory, no table per token), then keep t iff e < E and
t >= align(psum[e - 1]). psum is taken non-decreasing; other values give unspecified zeros, never a read outside
psum.

Imported by the kernel generators only; importing it compiles nothing.
"""

from cann_ops_tilelang.quant._scale_rules import col_major_scales


def token_kept_macro(T, *, num_experts: int, alignment: int):
    """A macro `kept(psum, t)` for scalar code of either backend (T: tilelang.language or
    tilelang.ascend.language): an int32 var, 1 for a token slot t of the layout and 0 for a padding slot,
    reading psum (E,) int32 from global memory."""
    steps = num_experts.bit_length()  # halvings of [0, E] down to one candidate

    @T.macro
    def kept(psum, t):
        keep = T.alloc_var(T.int32)
        low = T.alloc_var(T.int32)
        high = T.alloc_var(T.int32)
        start = T.alloc_var(T.int32)
        low = 0
        high = num_experts
        for _ in T.serial(steps):
            if low < high:
                middle = (low + high) // 2
                if psum[middle] <= t:
                    low = middle + 1
                else:
                    high = middle
        # low: the first expert whose end passes t; psum[low - 1] <= t, so t - start cannot overflow.
        start = 0
        if low > 0:
            start = psum[low - 1]
        keep = 0
        if low < num_experts and t - start >= (alignment - start % alignment) % alignment:
            keep = 1
        return keep

    return kept


def argument_shapes(T, cfg, num_tokens) -> dict:
    """The prim_func's tensor shapes (moe_swiglu_backward_kernel.make_moe_swiglu_backward_kernel) for `cfg`: an
    argument the configuration does not use has a dynamic length of its own (a one-element placeholder)."""

    def used(flag: bool, shape: tuple, name: str) -> tuple:
        return shape if flag else (T.dynamic(f'unused_{name}'),)

    hidden = cfg.hidden
    return {
        'x': (num_tokens, 2 * hidden),
        'x_sf': used(cfg.cast, (num_tokens, cfg.row_blocks), 'x_sf'),
        'act_x_grad': (num_tokens, hidden),
        'topk_weights': used(cfg.with_weight, (num_tokens,), 'topk_weights'),
        'psum': used(cfg.num_experts > 0, (max(cfg.num_experts, 1),), 'psum'),
        'x_grad': (num_tokens, 2 * hidden),
        'weight_grad': used(cfg.with_weight, (num_tokens,), 'weight_grad'),
        'act_out': used(cfg.do_recompute, (num_tokens, hidden), 'act_out'),
        'x_grad_fp8': used(cfg.cast, (num_tokens, 2 * hidden), 'x_grad_fp8'),
        'x_grad_sf': used(cfg.cast, (num_tokens, max(cfg.sf_cols, 1)), 'x_grad_sf'),
    }


def x_grad_sf_type(T, cfg, shapes: dict, num_tokens):
    """The prim_func's type of x_grad_sf: (T, sf_cols) row-major, or with cfg.col_major_sf the transposed view
    (sf_cols, T) of a row stride `sf_stride` >= T that is a launch argument (packed UE8M0 bytes: (sf_cols / 4, 4 T),
    token t's word w at [w, 4 t : 4 t + 4])."""
    if not cfg.col_major_sf:
        return T.Tensor(shapes['x_grad_sf'], cfg.sf_dtype)
    return col_major_scales(T, num_tokens, cfg.sf_cols, cfg.sf_dtype, packed=cfg.packed_ue8m0)
