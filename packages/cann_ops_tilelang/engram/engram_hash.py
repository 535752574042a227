"""engram_hash: n-gram token ids -> rows of the Engram hashed embedding tables."""

from __future__ import annotations

import torch

from cann_ops_tilelang.config import require_accelerator
from cann_ops_tilelang.operator import Operator, traced
from cann_ops_tilelang.validation import (
    PLAIN_TENSOR_TYPES,
    check_contiguous,
    check_image_token_mask,
    check_out,
    check_shape,
    check_tensor,
)

from .engram_hash_kernel import choose_engram_hash_config, get_engram_hash_kernel

MAX_NGRAM = 16  # N: ids per token (hashes of orders 2..N)
MAX_LAYERS = 32  # L
MAX_COLS = 256  # (N - 1) * E: rows per token and layer


def _check(ids, mults, sizes, offsets, mask=None, out=None, *, memory=True):
    """(backend, shape) of valid arguments, shape the output's (L, T, (N - 1) * E)."""
    check_tensor('ngram_token_ids', ids, dtype=torch.int32, ndim=2)
    check_tensor('multipliers', mults, dtype=torch.int64, ndim=2)
    check_tensor('vocab_sizes', sizes, dtype=torch.int32, ndim=3)
    check_tensor('offsets', offsets, dtype=torch.int32, ndim=2)
    num_tokens, max_ngram = ids.shape
    num_layers, num_tables = mults.shape[0], sizes.shape[2]
    if not 2 <= max_ngram <= MAX_NGRAM:
        raise ValueError(
            f'{OP.name}: ngram_token_ids must have N in 2..{MAX_NGRAM} columns (ids per n-gram), got {max_ngram}'
        )
    if not 1 <= num_layers <= MAX_LAYERS:
        raise ValueError(f'{OP.name}: multipliers must have L in 1..{MAX_LAYERS} rows (layers), got {num_layers}')
    if num_tables < 1:
        raise ValueError(f'{OP.name}: vocab_sizes must have E >= 1 tables per n-gram order, got {num_tables}')
    num_cols = (max_ngram - 1) * num_tables
    if num_cols > MAX_COLS:
        raise ValueError(f'{OP.name}: (N - 1) * E must be at most {MAX_COLS}, got ({max_ngram} - 1) * {num_tables}')
    check_shape('multipliers', mults, (num_layers, max_ngram))
    check_shape('vocab_sizes', sizes, (num_layers, max_ngram - 1, num_tables))
    check_shape('offsets', offsets, (num_layers, num_cols))
    inputs = {'ngram_token_ids': ids, 'multipliers': mults, 'vocab_sizes': sizes, 'offsets': offsets}
    for name, value in inputs.items():
        check_contiguous(name, value)
    if mask is not None:
        inputs['image_token_mask'] = check_image_token_mask(mask, num_tokens)
    shape = (num_layers, num_tokens, num_cols)
    if out is not None:
        check_out('out', out, shape=shape, dtype=torch.int32, device=ids.device, inputs=inputs, memory=memory)
    backend = require_accelerator(*inputs.values(), *(() if out is None else (out,)))
    # A zero size divides by zero in the kernels (SIGFPE on the emulator). Reading the sizes costs a device
    # sync, so only sizes in host memory (the emulator's tensors) are read.
    if memory and sizes.is_cpu and not sizes.all():
        raise ValueError(f'{OP.name}: vocab_sizes must be nonzero (each is the divisor of a hash), got a 0')
    return backend, shape


OP = Operator('engram_hash', _check, choose_engram_hash_config, get_engram_hash_kernel)


def _plan(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask=None, out=None):
    backend, _ = OP.check(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out)
    layers, orders, tables = vocab_sizes.shape
    choice = {'num_layers': layers, 'max_ngram': orders + 1, 'num_tables': tables}
    return OP.launcher(backend, ngram_token_ids.device, **choice, has_mask=image_token_mask is not None)


def _eager(ids, mults, sizes, offsets, mask, out) -> torch.Tensor:
    """Every check, then the launch. Fast path, without out=: by (vocab_sizes.shape, CUDA index, mask None), the
    argument types checked in Python."""
    plain = PLAIN_TENSOR_TYPES
    fast_key = None
    if (
        out is None
        and type(ids) in plain
        and type(mults) in plain
        and type(sizes) in plain
        and type(offsets) in plain
        and (mask is None or type(mask) in plain)
        and ids.is_cuda
        and ids.dim() == 2
    ):
        layers_orders_tables = sizes.shape
        fast_key = (layers_orders_tables, ids.get_device(), mask is None)
        launcher = OP.fast.get(fast_key)
        num_tokens = ids.shape[0]
        if launcher is not None and num_tokens:
            num_layers, ngram_orders, num_tables = layers_orders_tables
            result = ids.new_empty((num_layers, num_tokens, ngram_orders * num_tables))
            args = (ids, mults, sizes, offsets, result) if mask is None else (ids, mults, sizes, offsets, mask, result)
            OP.launch(launcher, args, ids, mults, sizes, offsets, mask, None)
            return result
    launcher = _plan(ids, mults, sizes, offsets, mask, out)
    num_layers, ngram_orders, num_tables = sizes.shape
    num_tokens = ids.shape[0]
    result = ids.new_empty((num_layers, num_tokens, ngram_orders * num_tables)) if out is None else out
    if num_tokens:  # T = 0: nothing to launch
        launcher.launch(ids, mults, sizes, offsets, *(() if mask is None else (mask,)), result)
        if fast_key is not None:
            OP.remember(fast_key, launcher)
    return result


def _fake(ids, mults, sizes, offsets, mask, out=None) -> torch.Tensor | None:
    """While torch traces: the checks that need no memory, then the int32 output (None with out=)."""
    _, shape = OP.check(ids, mults, sizes, offsets, mask, out, memory=False)
    return torch.empty(shape, dtype=torch.int32, device=ids.device) if out is None else None


_SIGNATURE = 'Tensor ngram_token_ids, Tensor multipliers, Tensor vocab_sizes, Tensor offsets, Tensor? image_token_mask'
_functional = OP.define('engram_hash', f'({_SIGNATURE}) -> Tensor', lambda *args: _eager(*args, None), _fake)
_into_out = OP.define('engram_hash_out', f'({_SIGNATURE}, Tensor(a!) out) -> ()', _eager, _fake)


@OP.public(_plan)
def engram_hash(
    ngram_token_ids: torch.Tensor,
    multipliers: torch.Tensor,
    vocab_sizes: torch.Tensor,
    offsets: torch.Tensor,
    image_token_mask: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Embedding-table rows of the hashed n-grams, per layer l, token t, order n = 2..N and table e:

        p_i = int64(ids[t, i]) * multipliers[l, i]          (int64, wrapping on overflow)
        h_n = p_0 ^ p_1 ^ ... ^ p_(n-1)
        out[l, t, (n-2)*E + e] = h_n % vocab_sizes[l, n-2, e] + offsets[l, (n-2)*E + e]

    where `%` takes the sign of the divisor (torch/Python semantics) and the int64 sum is wrapped to int32.

    Args:
        ngram_token_ids: (T, N) int32, contiguous; T >= 0 (T = 0 returns an empty result, no launch).
        multipliers: (L, N) int64, contiguous; any values.
        vocab_sizes: (L, N-1, E) int32, contiguous; nonzero (negative sizes follow the same `%` rule). A zero
            is a ValueError where the sizes are in host memory (CPU tensors: the Ascend emulator); on an NPU
            or GPU it is not checked, since reading the values would cost a device sync per call, and the
            rows it divides are unspecified (the kernels' integer division by zero).
        offsets: (L, (N-1)*E) int32, contiguous.
        image_token_mask: optional (T,) bool, contiguous: every row of an image token (True) is -1. None
            is its own compiled variant.
        out: optional (L, T, (N-1)*E) int32 contiguous buffer on the same device, not overlapping the inputs.

    Limits (ValueError): 2 <= N <= 16, 1 <= L <= 32, E >= 1 and (N-1)*E <= 256.

    Returns:
        (L, T, (N-1)*E) int32, exact.
    """
    if not traced(ngram_token_ids):
        return _eager(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out)
    args = (ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
    OP.check(*args, out, memory=False)
    if out is None:
        return _functional(*args)
    _into_out(*args, out)
    return out
