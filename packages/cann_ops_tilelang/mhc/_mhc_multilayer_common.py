"""What the fused mhc_multilayer_recompute kernels of both backends share: the launch's layer slots and the shapes
of their arguments (configuration and generator: mhc_multilayer_recompute_kernel.py)."""

from __future__ import annotations

LAYERS_PER_LAUNCH = 4  # layers one launch recomputes: the signature's slots per list


def argument_shapes(cfg, num_tokens) -> dict[str, list[tuple]]:
    """Per list, the shape of each of its LAYERS_PER_LAUNCH slots: the layer's tensor where the launch has the
    layer (post layer), else a (1,) placeholder, never touched. The first residual is (num_tokens, M, H)."""
    T, M, H, L, L_post = num_tokens, cfg.mhc, cfg.hidden, cfg.layers, cfg.post_layers
    one = (1,)

    def slots(shape, count):
        return [shape if k < count else one for k in range(LAYERS_PER_LAUNCH)]

    return {
        'pre': slots((T, M), L),
        'layer_output': slots((T, H), L_post),
        'post': slots((T, M), L_post),
        'comb': slots((T, M * M), L_post),
        'layer_input': slots((T, H), L),
        'residual': slots((T, M, H), L_post),
    }
