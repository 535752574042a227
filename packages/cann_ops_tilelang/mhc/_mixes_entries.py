"""The entry points of the mix kernels, one home for both backends: each kind's prim_func signature (the argument
order the operators launch with) and which backend macro it calls with which arguments. The backends
(_mixes_ascend.py, _mixes_cuda.py) write the `forward` and `backward` macros; the split backward's reduce kernel is
each backend's own."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to this function's local shape variables.


def mixes_entry(T, cfg, num_tokens, forward, backward):
    """The prim_func of `cfg.kind` ('head_fwd', 'split_fwd', 'head_bwd' or 'split_bwd'), calling the backend's
    `forward(x, mhc_scale, mhc_base, pre, post, comb, post_mult, eps)` or `backward(pre_g, post_g, comb_g, x, post,
    mhc_scale, mhc_base, x_grad, scale_partial, base_partial, post_mult)` macro."""
    f32 = T.float32
    M, W, P = cfg.mhc_mult, cfg.width, cfg.num_partials
    M2 = M * M

    if cfg.kind == 'head_fwd':

        @T.prim_func
        def mhc_head_compute_mix_fwd_kernel(
            input_mix: T.Tensor((num_tokens, M), f32),
            mhc_scale: T.Tensor((1,), f32),
            mhc_base: T.Tensor((M,), f32),
            output_mix: T.Tensor((num_tokens, M), f32),
            mhc_pre_eps: T.float32,
        ):
            forward(input_mix, mhc_scale, mhc_base, output_mix, output_mix, output_mix, T.float32(1.0), mhc_pre_eps)

        return mhc_head_compute_mix_fwd_kernel

    if cfg.kind == 'split_fwd':

        @T.prim_func
        def mhc_pre_split_mixes_fwd_kernel(
            input_mixes: T.Tensor((num_tokens, W), f32),
            mhc_scale: T.Tensor((3,), f32),
            mhc_base: T.Tensor((W,), f32),
            pre_layer_mix: T.Tensor((num_tokens, M), f32),
            post_layer_mix: T.Tensor((num_tokens, M), f32),
            comb_res_mix: T.Tensor((num_tokens, M2), f32),
            mhc_post_mult_value: T.float32,
            mhc_pre_eps: T.float32,
        ):
            forward(
                input_mixes, mhc_scale, mhc_base, pre_layer_mix, post_layer_mix, comb_res_mix,
                mhc_post_mult_value, mhc_pre_eps,
            )  # fmt: skip

        return mhc_pre_split_mixes_fwd_kernel

    if cfg.kind == 'head_bwd':

        @T.prim_func
        def mhc_head_compute_mix_bwd_kernel(
            output_mix_grad: T.Tensor((num_tokens, M), f32),
            input_mix: T.Tensor((num_tokens, M), f32),
            mhc_scale: T.Tensor((1,), f32),
            mhc_base: T.Tensor((M,), f32),
            input_mix_grad: T.Tensor((num_tokens, M), f32),
            mhc_scale_grad_partial: T.Tensor((P, 1), f32),
            mhc_base_grad_partial: T.Tensor((P, M), f32),
        ):
            backward(
                output_mix_grad, output_mix_grad, output_mix_grad, input_mix, input_mix, mhc_scale, mhc_base,
                input_mix_grad, mhc_scale_grad_partial, mhc_base_grad_partial, T.float32(1.0),
            )  # fmt: skip

        return mhc_head_compute_mix_bwd_kernel

    if cfg.kind == 'split_bwd':

        @T.prim_func
        def mhc_pre_split_mixes_bwd_kernel(
            pre_layer_mix_grad: T.Tensor((num_tokens, M), f32),
            post_layer_mix_grad: T.Tensor((num_tokens, M), f32),
            comb_res_mix_grad: T.Tensor((num_tokens, M2), f32),
            input_mixes: T.Tensor((num_tokens, W), f32),
            post_layer_mix: T.Tensor((num_tokens, M), f32),
            mhc_scale: T.Tensor((3,), f32),
            mhc_base: T.Tensor((W,), f32),
            input_mixes_grad: T.Tensor((num_tokens, W), f32),
            mhc_scale_grad_partial: T.Tensor((P, 3), f32),
            mhc_base_grad_partial: T.Tensor((P, W), f32),
            mhc_post_mult_value: T.float32,
        ):
            backward(
                pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix, mhc_scale,
                mhc_base, input_mixes_grad, mhc_scale_grad_partial, mhc_base_grad_partial, mhc_post_mult_value,
            )  # fmt: skip

        return mhc_pre_split_mixes_bwd_kernel
    raise ValueError(f'mixes_entry: no entry point for kind {cfg.kind!r}')
