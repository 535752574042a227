"""engram_hash: n-gram token ids -> rows of the Engram hashed embedding tables."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, out, tensor

from .engram_hash_kernel import choose_engram_hash_config, get_engram_hash_kernel

MAX_NGRAM = 16  # N: ids per token (hashes of orders 2..N)
MAX_LAYERS = 32  # L
MAX_COLS = 256  # (N - 1) * E: rows per token and layer


def _limits(name, N, L, E):  # the docstring's symbols
    if not 2 <= N <= MAX_NGRAM:
        raise ValueError(f'{name}: ngram_token_ids must have N in 2..{MAX_NGRAM} columns (ids per n-gram), got {N}')
    if not 1 <= L <= MAX_LAYERS:
        raise ValueError(f'{name}: multipliers must have L in 1..{MAX_LAYERS} rows (layers), got {L}')
    if E < 1:
        raise ValueError(f'{name}: vocab_sizes must have E >= 1 tables per n-gram order, got {E}')
    if (N - 1) * E > MAX_COLS:
        raise ValueError(f'{name}: (N - 1) * E must be at most {MAX_COLS}, got ({N} - 1) * {E}')


def _choice(vocab_sizes, image_token_mask):
    # After every check (and the device's): a zero size divides by zero in the kernels (SIGFPE on the emulator).
    # Reading the sizes costs a device sync, so only sizes in host memory (the emulator's tensors) are read.
    if vocab_sizes.is_cpu and not vocab_sizes.all():
        raise ValueError('engram_hash: vocab_sizes must be nonzero (each is the divisor of a hash), got a 0')
    layers, orders, tables = vocab_sizes.shape
    return {
        'num_layers': layers,
        'max_ngram': orders + 1,
        'num_tables': tables,
        'has_mask': image_token_mask is not None,
    }


OP = Operator(
    'engram_hash',
    tensor('ngram_token_ids', torch.int32, 'T, N'),
    tensor('multipliers', torch.int64, 'L, N'),
    tensor('vocab_sizes', torch.int32, 'L, N - 1, E'),
    tensor('offsets', torch.int32, 'L, (N - 1) * E'),
    tensor('image_token_mask', torch.bool, 'T', optional=True),
    out('out', torch.int32, 'L, T, (N - 1) * E'),
    limits=_limits,
    choice=_choice,
    choose_config=choose_engram_hash_config,
    get_kernel=get_engram_hash_kernel,
)


def _eager(ids, mults, sizes, offsets, mask, out) -> torch.Tensor:
    """Every check, then the launch. Fast path, without out=: by (vocab_sizes.shape, CUDA index, mask None)."""
    key = launcher = None
    if (shape := OP.fast_ok(ids, mults, sizes, offsets, mask, out)) is not None:
        key = (sizes.shape, ids.get_device(), mask is None)
        launcher = OP.fast.get(key) if shape[0] else None
    fast = launcher is not None
    if not fast:
        launcher = OP.plan(ids, mults, sizes, offsets, mask, out)
    (num_layers, ngram_orders, num_tables), num_tokens = sizes.shape, ids.shape[0]
    result = ids.new_empty(num_layers, num_tokens, ngram_orders * num_tables) if out is None else out
    args = (ids, mults, sizes, offsets, result) if mask is None else (ids, mults, sizes, offsets, mask, result)
    if fast:
        OP.launch(launcher, args, (ids, mults, sizes, offsets, mask, None))
    elif num_tokens:  # T = 0: nothing to launch
        launcher.launch(*args)
        if key is not None:
            OP.remember(key, launcher)
    return result


def _fake(ids, mults, sizes, offsets, mask, out) -> torch.Tensor:
    return ids.new_empty(sizes.shape[0], ids.shape[0], sizes.shape[1] * sizes.shape[2])  # int32, as ids


@OP.public(_eager, returns='Tensor', fake=_fake)
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
