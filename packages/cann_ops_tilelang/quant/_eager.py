"""The eager path every cast of x (T, H) to e4m3 shares (per_token_cast, per_block_cast and their halves): the fast
path's key, the checked plan otherwise, the outputs (out= or new tensors of the declared layout), the launch.

The three forms differ only in what the kernel takes and writes: 'cast' (x, data, sf), 'sf_only' (x, sf),
'precomputed' (x, sf, data). UE8M0 scales reach the kernels as bytes (a uint8 view of the int32 words);
column-major scales (use_tma_aligned_col_major_sf, where the operator has them) as their transpose sf.T, rows of
the padded buffer (of UE8M0 bytes: sf.T.view(torch.uint8))."""

from __future__ import annotations

from collections.abc import Callable

import torch

from cann_ops_tilelang.operator import Operator

from ._quant_tensor import QuantTensor
from .cast_kernel import SEED_LIMIT, draw_seed, key_argument, seed_key

_UNSUPPORTED = ('x_block_size', 'use_tma_aligned_col_major_sf')  # if declared


def kernel_sf(sf: torch.Tensor, packed: bool, transposed: bool) -> torch.Tensor:
    """Output scales as the cast kernels take them: transposed when column-major, bytes when packed UE8M0."""
    sf = sf.T if transposed else sf
    return sf.view(torch.uint8) if packed else sf


def cast_eager(
    op: Operator,
    mode: str,
    block_arg: str,
    *,
    col_major: bool = False,
    token_class: Callable[[int], object] | None = None,
) -> Callable:
    """The eager function of `op`, a cast of mode 'cast', 'sf_only' or 'precomputed' whose arguments are x, fmt,
    the block (`block_arg`), options, the out buffer(s), and after them keyword-only scalars (`seed`). Fast path,
    without out= and TileKernels' options these kernels do not have: by (H, dtype, CUDA index, fmt, block, round_sf,
    packed, E4M3 scales, column-major scales, stochastic rounding); round_sf does not change a 'precomputed' kernel
    (the inverse is 1 / sf either way), so it is not part of that key. Stochastic rounding (`stochastic_cast`, where
    declared, with its `seed`): a kernel and key of its own; the kernel takes the data as e4m3 bits (FP4: its int8
    bytes) and, last, the
    seed's key, the seed drawn per call where None (cast_kernel.draw_seed). A key is cached only after a fully
    checked call with it succeeded, so an unsupported fmt never takes the fast path. `col_major`: the operator
    writes use_tma_aligned_col_major_sf's column-major scales (its outputs' layout from the declaration's
    `results`); otherwise that option is one it refuses. `token_class`: where the operator's choice depends on the
    number of tokens, the class of a count it chooses by (part of the fast path's key)."""
    index = {a.name: i for i, a in enumerate(op.args)}
    block_at, round_at, packed_at = index[block_arg], index['round_sf'], index['use_packed_ue8m0']
    col_major_at = index['use_tma_aligned_col_major_sf'] if col_major else None
    unsupported = [index[name] for name in _UNSUPPORTED if name in index and index[name] != col_major_at]
    sf_at = index.get('sf')
    e4m3_sf_at = index.get('use_e4m3_sf')
    out_at = op.out_index
    stochastic_at, seed_at = index.get('stochastic_cast'), index.get('seed')

    def eager(*args):
        x, fmt, out = args[0], args[1], args[out_at]
        packed = args[packed_at]
        transposed = col_major_at is not None and args[col_major_at]
        stochastic = stochastic_at is not None and args[stochastic_at]
        seed = None if seed_at is None else args[seed_at]
        key = None
        # A seed only with stochastic rounding, of the type and range the full check takes (the key holds neither).
        seed_ok = seed is None or (stochastic is True and type(seed) is int and 0 <= seed < SEED_LIMIT)
        if out is None and seed_ok and not any(args[i] for i in unsupported):
            shape = op.fast_ok(*args)
            # Contiguous x only: strided rows (per_token_cast's) take the full check, their alignment included.
            if shape is not None and shape[0] and (shape[0] == 1 or x.stride(0) == shape[1]):
                round_sf = args[round_at] and mode != 'precomputed'
                e4m3_sf = e4m3_sf_at is not None and args[e4m3_sf_at]
                tokens = None if token_class is None else token_class(shape[0])
                key = (shape[1], x.dtype, x.get_device(), fmt, args[block_at], round_sf, packed, e4m3_sf, transposed,
                       stochastic, tokens)  # fmt: skip
        launcher, fast = op.prepare(key, args)
        outputs = op.new_outputs(x, *args) if out is None else out
        if mode == 'cast':
            data, sf = outputs
            if stochastic:  # the e4m3 bits (FP4: its int8 bytes), and the key of the seed (drawn per call where None)
                key_arg = key_argument(seed_key(draw_seed() if seed is None else seed))
                bits = data if data.dtype == torch.int8 else data.view(torch.uint8)
                launch_args = (x, bits, kernel_sf(sf, packed, transposed), key_arg)
            else:
                launch_args = (x, data, kernel_sf(sf, packed, transposed))
            result = QuantTensor(data, sf)
        elif mode == 'sf_only':
            result = outputs[0] if out is None else out
            launch_args = (x, kernel_sf(result, packed, transposed))
        else:
            result = outputs[0] if out is None else out
            launch_args = (x, args[sf_at], result)
        op.finish(launcher, fast, key, launch_args, args, empty=not x.shape[0])
        return result

    return eager
