"""engram_hash: n-gram token ids -> rows of the Engram hashed embedding tables."""

from __future__ import annotations

import functools

import torch

from cann_ops_tilelang._torch_library import op, traced
from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.kernel_target import Launcher, launch_or_explain
from cann_ops_tilelang.validation import (
    PLAIN_TENSOR_TYPES,
    check_contiguous,
    check_image_token_mask,
    check_out,
    check_shape,
    check_tensor,
)

from .engram_hash_kernel import EngramHashConfig, choose_engram_hash_config, get_engram_hash_kernel

_NAME = 'engram_hash'
MAX_NGRAM = 16  # N: ids per token (hashes of orders 2..N)
MAX_LAYERS = 32  # L
MAX_COLS = 256  # (N - 1) * E: rows per token and layer


# One launcher per (device, backend, L, N, E, mask): chosen and looked up once.
# (The core count is the device's, fixed for a process.)
_LAUNCHERS: dict[tuple, Launcher] = {}
# The fast path's launchers (their entries check every tensor's layout, Launcher.checks_arguments), by
# (vocab_sizes.shape, CUDA device index, mask given): found there, a call without out= checks in Python only
# the argument types and leaves the explanation of a rejection to _check.
_CHECKED: dict[tuple, Launcher] = {}


def _check(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out, *, memory):
    """Validate the arguments (memory=False: fake tensors, see validation.may_overlap); (backend, shape),
    shape the output's (L, T, (N - 1) * E)."""
    check_tensor('ngram_token_ids', ngram_token_ids, dtype=torch.int32, ndim=2)
    check_tensor('multipliers', multipliers, dtype=torch.int64, ndim=2)
    check_tensor('vocab_sizes', vocab_sizes, dtype=torch.int32, ndim=3)
    check_tensor('offsets', offsets, dtype=torch.int32, ndim=2)
    num_tokens, max_ngram = ngram_token_ids.shape
    num_layers = multipliers.shape[0]
    num_tables = vocab_sizes.shape[2]
    if not 2 <= max_ngram <= MAX_NGRAM:
        raise ValueError(
            f'{_NAME}: ngram_token_ids must have N in 2..{MAX_NGRAM} columns (ids per n-gram), got {max_ngram}'
        )
    if not 1 <= num_layers <= MAX_LAYERS:
        raise ValueError(f'{_NAME}: multipliers must have L in 1..{MAX_LAYERS} rows (layers), got {num_layers}')
    if num_tables < 1:
        raise ValueError(f'{_NAME}: vocab_sizes must have E >= 1 tables per n-gram order, got {num_tables}')
    num_cols = (max_ngram - 1) * num_tables
    if num_cols > MAX_COLS:
        raise ValueError(f'{_NAME}: (N - 1) * E must be at most {MAX_COLS}, got ({max_ngram} - 1) * {num_tables}')
    check_shape('multipliers', multipliers, (num_layers, max_ngram))
    check_shape('vocab_sizes', vocab_sizes, (num_layers, max_ngram - 1, num_tables))
    check_shape('offsets', offsets, (num_layers, num_cols))
    for name, value in (
        ('ngram_token_ids', ngram_token_ids),
        ('multipliers', multipliers),
        ('vocab_sizes', vocab_sizes),
        ('offsets', offsets),
    ):
        check_contiguous(name, value)
    shape = (num_layers, num_tokens, num_cols)
    inputs = {
        'ngram_token_ids': ngram_token_ids,
        'multipliers': multipliers,
        'vocab_sizes': vocab_sizes,
        'offsets': offsets,
    }
    if image_token_mask is not None:
        check_image_token_mask(image_token_mask, num_tokens)
        inputs['image_token_mask'] = image_token_mask
    if out is not None:
        check_out(
            'out',
            out,
            shape=shape,
            dtype=torch.int32,
            device=ngram_token_ids.device,
            inputs=inputs,
            memory=memory,
        )

    tensors = list(inputs.values()) + ([] if out is None else [out])
    return require_accelerator(*tensors), shape


_check_real = functools.partial(_check, memory=True)  # what explains a rejected fast-path launch


def _launcher(backend, ngram_token_ids, vocab_sizes, image_token_mask) -> Launcher:
    device = ngram_token_ids.device
    num_layers, ngram_orders, num_tables = vocab_sizes.shape
    has_mask = image_token_mask is not None
    key = (device, backend, num_layers, ngram_orders, num_tables, has_mask)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        cfg = choose_engram_hash_config(
            backend=backend,
            num_layers=num_layers,
            max_ngram=ngram_orders + 1,
            num_tables=num_tables,
            num_cores=get_num_cores(device),
            has_mask=has_mask,
        )
        launcher = _LAUNCHERS[key] = Launcher(get_engram_hash_kernel, cfg, device)
    return launcher


def _eager(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out) -> torch.Tensor:
    """The call on real tensors: every check, then the launch (also the torch.library ops' kernel)."""
    plain = PLAIN_TENSOR_TYPES
    fast_key = None
    if (
        out is None
        and type(ngram_token_ids) in plain
        and type(multipliers) in plain
        and type(vocab_sizes) in plain
        and type(offsets) in plain
        and (image_token_mask is None or type(image_token_mask) in plain)
        and ngram_token_ids.is_cuda
        and ngram_token_ids.dim() == 2
    ):
        layers_orders_tables = vocab_sizes.shape
        fast_key = (layers_orders_tables, ngram_token_ids.get_device(), image_token_mask is None)
        launcher = _CHECKED.get(fast_key)
        num_tokens = ngram_token_ids.shape[0]
        if launcher is not None and num_tokens:
            num_layers, ngram_orders, num_tables = layers_orders_tables
            result = ngram_token_ids.new_empty((num_layers, num_tokens, ngram_orders * num_tables))
            mask = () if image_token_mask is None else (image_token_mask,)
            launch_or_explain(
                launcher,
                (ngram_token_ids, multipliers, vocab_sizes, offsets, *mask, result),
                _check_real,
                ngram_token_ids,
                multipliers,
                vocab_sizes,
                offsets,
                image_token_mask,
                None,
            )
            return result
    backend, shape = _check(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out, memory=True)
    launcher = _launcher(backend, ngram_token_ids, vocab_sizes, image_token_mask)
    result = ngram_token_ids.new_empty(shape) if out is None else out  # int32, its device
    if shape[1] == 0:
        return result
    if image_token_mask is None:
        launcher.launch(ngram_token_ids, multipliers, vocab_sizes, offsets, result)
    else:
        launcher.launch(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, result)
    if fast_key is not None and launcher.checks_arguments:
        _CHECKED[fast_key] = launcher
    return result


def _fake(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out) -> torch.Tensor | None:
    """While torch traces: the checks that need no memory, then the (L, T, (N-1)*E) int32 output (None with out=)."""
    _, shape = _check(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out, memory=False)
    return torch.empty(shape, dtype=torch.int32, device=ngram_token_ids.device) if out is None else None


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
        vocab_sizes: (L, N-1, E) int32, contiguous. Must be > 0: this is not checked (it would need a
            device sync); a zero size gives unspecified rows, negative sizes follow the same `%` rule.
        offsets: (L, (N-1)*E) int32, contiguous.
        image_token_mask: optional (T,) bool, contiguous: every row of an image token (True) is -1. None
            is its own compiled variant.
        out: optional (L, T, (N-1)*E) int32 contiguous buffer on the same device, not overlapping the inputs.

    Limits (ValueError): 2 <= N <= 16, 1 <= L <= 32, E >= 1 and (N-1)*E <= 256.

    Returns:
        (L, T, (N-1)*E) int32, exact.
    """
    if traced(ngram_token_ids):  # torch.compile, fake tensors, make_fx: the torch.library ops (_torch_ops.py)
        _check(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out, memory=False)
        if out is None:
            return op('engram_hash')(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
        op('engram_hash_out')(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out)
        return out
    return _eager(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out)


def engram_hash_config(
    ngram_token_ids: torch.Tensor,
    multipliers: torch.Tensor,
    vocab_sizes: torch.Tensor,
    offsets: torch.Tensor,
    image_token_mask: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
) -> EngramHashConfig:
    """The kernel configuration engram_hash launches for these arguments (validated alike; no launch)."""
    backend, _ = _check(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, out, memory=True)
    return _launcher(backend, ngram_token_ids, vocab_sizes, image_token_mask).cfg
