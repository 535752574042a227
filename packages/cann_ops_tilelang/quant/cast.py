"""cast: a contiguous tensor cast element by element to another dtype, to nearest even or by seeded stochastic
rounding (the same bits on every backend for the same seed)."""

from __future__ import annotations

import torch

from cann_ops_tilelang.operator import Operator, out, scalar, tensor

from .cast_kernel import (
    DTYPE_NAMES,
    MAX_NUMEL,
    SEED_LIMIT,
    STOCHASTIC_BITS,
    STOCHASTIC_PAIRS,
    choose_cast_config,
    draw_seed,
    get_cast_kernel,
    key_argument,
    seed_key,
)

DTYPES = tuple(DTYPE_NAMES)  # the dtypes cast takes and gives
_DTYPE_LIST = ' or '.join(str(d) for d in DTYPES)
# CastConfig.out_storage -> the torch dtype of the kernel's out argument (an equal-size view of the result)
_STORAGE = {name: getattr(torch, name) for name in (*DTYPE_NAMES.values(), *STOCHASTIC_BITS.values())}


def _rules(name, x, dtype, stochastic_rounding, seed):
    """What the declaration cannot say: the target dtype, the element limit, the rounding's pairs and the seed."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f'{name}: dtype must be a torch.dtype, got {type(dtype).__name__}')
    if dtype not in DTYPE_NAMES:
        raise TypeError(f'{name}: dtype must be one of {_DTYPE_LIST}, got {dtype}')
    if x.numel() > MAX_NUMEL:
        raise ValueError(f'{name}: x must have at most {MAX_NUMEL} elements (int32 indices), got {x.numel()}')
    if stochastic_rounding:
        pair = (DTYPE_NAMES[x.dtype], DTYPE_NAMES[dtype])
        if pair not in STOCHASTIC_PAIRS:
            kind = 'a widening or same-width cast' if dtype.itemsize >= x.dtype.itemsize else 'this narrowing'
            raise ValueError(
                f'{name}: stochastic rounding is not defined for {kind} ({x.dtype} -> {dtype}); it casts '
                f'float32 -> bfloat16, float32 -> float8_e4m3fn and bfloat16 -> float8_e4m3fn'
            )
    if seed is not None:
        if not stochastic_rounding:
            raise ValueError(f'{name}: seed={seed} is used only with stochastic_rounding=True')
        if not 0 <= seed < SEED_LIMIT:
            raise ValueError(f'{name}: seed must be in [0, 2**32), got {seed}')


OP = Operator(
    'cast',
    tensor('x', DTYPES, aligned=True),
    scalar('dtype', 'any'),
    scalar('stochastic_rounding', 'bool'),
    scalar('seed', 'int', optional=True),
    out('out', aligned=True),
    extra=_rules,
    choice=lambda x, dtype, stochastic_rounding: {
        'in_dtype': x.dtype,
        'out_dtype': dtype,
        'stochastic_rounding': stochastic_rounding,
    },
    results=lambda x, dtype: ((tuple(x.shape), dtype),),
    choose_config=choose_cast_config,
    get_kernel=get_cast_kernel,
)


def _eager(x, dtype, stochastic_rounding, seed, out):
    """The eager path: the fast path's launcher by (dtypes, rounding, CUDA index), else the checked plan; the
    output (out= or a new tensor); the launch on the flattened tensors, none for an empty x."""
    if type(x) is torch.Tensor and x.dtype == dtype and not stochastic_rounding and seed is None:
        OP.check(x, dtype, stochastic_rounding, seed, out)  # the contract and the device guard, nothing to cast
        return x.clone() if out is None else out.copy_(x)
    key = None
    # A seed only with stochastic rounding (the key does not say whether one is given).
    if out is None and (seed is None or (stochastic_rounding and type(seed) is int and 0 <= seed < SEED_LIMIT)):
        shape = OP.fast_ok(x, dtype, stochastic_rounding, seed, out)
        # The flattening views below need a contiguous x; the element limit and dtype are not the entry's to check.
        if shape is not None and type(dtype) is torch.dtype and x.is_contiguous() and 0 < x.numel() <= MAX_NUMEL:
            key = (x.dtype, dtype, stochastic_rounding, x.get_device())
    launcher, fast = OP.prepare(key, (x, dtype, stochastic_rounding, seed, out))
    result = x.new_empty(x.shape, dtype=dtype) if out is None else out
    written = result.view(_STORAGE[launcher.cfg.out_storage]).view(-1)
    if stochastic_rounding:
        launch_args = (x.view(-1), written, key_argument(seed_key(draw_seed() if seed is None else seed)))
    else:
        launch_args = (x.view(-1), written)
    OP.finish(launcher, fast, key, launch_args, (x, dtype, stochastic_rounding, seed, out), empty=not x.numel())
    return result


def _fake(x, dtype, stochastic_rounding, seed):
    OP.check(x, dtype, stochastic_rounding, seed, None, memory=False)
    return x.new_empty(x.shape, dtype=dtype)


def _fake_out(x, dtype, stochastic_rounding, seed, out):
    OP.check(x, dtype, stochastic_rounding, seed, out, memory=False)


# The torch.library forms, defined here: the mechanism's generated forms cannot carry a dtype argument (kind 'any').
_FUNCTIONAL = OP.define(
    'cast',
    '(Tensor x, ScalarType dtype, bool stochastic_rounding, int? seed) -> Tensor',
    lambda x, dtype, stochastic_rounding, seed: _eager(x, dtype, stochastic_rounding, seed, None),
    _fake,
)
_INTO = OP.define(
    'cast_out',
    '(Tensor x, ScalarType dtype, bool stochastic_rounding, int? seed, Tensor(a!) out) -> ()',
    _eager,
    _fake_out,
)


def _traced(x, dtype, stochastic_rounding, seed, out):
    """While torch traces (after the memory-free check): the functional form, or the out= form."""
    if out is None:
        return _FUNCTIONAL(x, dtype, stochastic_rounding, seed)
    _INTO(x, dtype, stochastic_rounding, seed, out)
    return out


@OP.public(_eager, traced=_traced)
def cast(
    x: torch.Tensor,
    dtype: torch.dtype,
    stochastic_rounding: bool = False,
    *,
    seed: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x cast element by element to `dtype`, of x's shape (TileKernels 2.1.0's call, with `seed` and `out`).

    Plain casts (stochastic_rounding=False), between float32, bfloat16, float16, float8_e4m3fn and float8_e5m2
    in any direction: to nearest even, through fp32 (exact). To float8_e4m3fn / float8_e5m2 saturating at
    +-448 / +-57344 (+-inf too), NaN stays NaN; to bfloat16 / float16 IEEE: overflow -> +-inf, NaN stays NaN
    (payload unspecified). -0.0 stays -0.0; subnormals are ordinary values. dtype == x.dtype gives a copy (no
    kernel).

    Stochastic rounding (stochastic_rounding=True) for float32 -> bfloat16, float32 -> float8_e4m3fn and
    bfloat16 -> float8_e4m3fn: a finite value between two neighbours of `dtype` rounds up (in magnitude) with
    probability (distance to the lower neighbour) / (their spacing), so E[cast(x)] = x within the format's
    range. The fraction has 16 bits (bf16) or 20 bits (e4m3; below 2**-6, e4m3's subnormal range, the magnitude
    is first rounded to nearest even on a grid of 2**-29). The random bits are a fixed integer hash of (seed,
    element index in x's flattened order): the same seed gives the same bits on every backend and device;
    another seed other bits. Special values: finite values saturate (bf16: at the largest finite bf16; e4m3:
    at +-448, values past 448 and +-inf too); bf16 keeps +-inf and makes NaN the quiet NaN 0x7FC0 with x's sign;
    e4m3 makes NaN 0x7F with x's sign; -0.0 stays -0.0; fp32 subnormals round to 0 (bf16: to their own
    subnormal neighbours). Exact formulas: cast_kernel.py.

    Args:
        x: float32, bfloat16, float16, float8_e4m3fn or float8_e5m2, contiguous, any shape, 16-byte aligned; at most
            2**31 - 2**18 - 1 elements (int32 indices; 0 elements: an empty result, no launch).
        dtype: the result's dtype, one of the five above (TypeError otherwise).
        stochastic_rounding: the rounding above; on any other pair (a widening one included) ValueError.
        seed: in [0, 2**32), with stochastic_rounding only (ValueError otherwise). None: drawn from torch's
            default CPU generator (so torch.manual_seed reproduces a call), without a device synchronisation.
        out: optional result buffer, x's shape and `dtype`, contiguous, 16-byte aligned, on x's device, not
            overlapping x.

    Returns:
        The cast tensor (`out` when given).
    """
