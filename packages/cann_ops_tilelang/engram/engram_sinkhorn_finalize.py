"""engram_sinkhorn_finalize: the final row-normalised Sinkhorn matrix, scaled by alpha."""

from __future__ import annotations

import functools
import math

import torch

from cann_ops_tilelang._torch_library import op, traced
from cann_ops_tilelang.config import get_num_cores, require_accelerator
from cann_ops_tilelang.kernel_target import Launcher, launch_or_explain
from cann_ops_tilelang.validation import check_aligned, check_finite_float, check_out

from .engram_sinkhorn_finalize_kernel import (
    EngramSinkhornFinalizeConfig,
    choose_engram_sinkhorn_finalize_config,
    get_engram_sinkhorn_finalize_kernel,
)
from .engram_sinkhorn_step import check_sinkhorn_matrix, sinkhorn_operands_fast

_NAME = 'engram_sinkhorn_finalize'


# One launcher per (device, backend, head_dim): chosen and looked up once.
# (The core count is the device's, fixed for a process.)
_LAUNCHERS: dict[tuple, Launcher] = {}
# The fast path's launchers (their entries check every tensor's layout, Launcher.checks_arguments), by
# (head_dim, CUDA device index): found there, a call without out= whose operands pass
# sinkhorn_operands_fast and whose alpha is a finite float leaves the rest of the checks to the entry and
# the explanation of a rejection to _check.
_CHECKED: dict[tuple, Launcher] = {}


def _check(matrix, row_scale, col_scale, eps, alpha, out, *, memory) -> tuple[str, int, int, float, float]:
    """Validate the arguments (memory=False: fake tensors, see validation.may_overlap); (backend, rows,
    head_dim, eps, alpha)."""
    rows, head_dim, eps = check_sinkhorn_matrix(_NAME, matrix, row_scale, col_scale, eps, memory=memory)
    alpha = check_finite_float('alpha', alpha)
    if out is not None:
        check_out(
            'out',
            out,
            shape=(rows, head_dim),
            dtype=torch.float32,
            device=matrix.device,
            inputs={'matrix': matrix, 'row_scale': row_scale, 'col_scale': col_scale},
            memory=memory,
        )
        check_aligned('out', out, memory=memory)
    tensors = (matrix, row_scale, col_scale) if out is None else (matrix, row_scale, col_scale, out)
    return require_accelerator(*tensors), rows, head_dim, eps, alpha


_check_real = functools.partial(_check, memory=True)  # what explains a rejected fast-path launch


def _launcher(backend, device, head_dim) -> Launcher:
    key = (device, backend, head_dim)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        cfg = choose_engram_sinkhorn_finalize_config(
            backend=backend, head_dim=head_dim, num_cores=get_num_cores(device)
        )
        launcher = _LAUNCHERS[key] = Launcher(get_engram_sinkhorn_finalize_kernel, cfg, device)
    return launcher


def _eager(matrix, row_scale, col_scale, eps, alpha, out) -> torch.Tensor:
    """The call on real tensors: every check, then the launch (also the torch.library ops' kernel)."""
    if (
        out is None
        and type(alpha) is float
        and -math.inf < alpha < math.inf
        and sinkhorn_operands_fast(matrix, row_scale, col_scale, eps)
    ):
        shape = matrix.shape
        launcher = _CHECKED.get((shape[1], matrix.get_device()))
        if launcher is not None:
            result = torch.empty_like(matrix, memory_format=torch.contiguous_format)  # no size list to parse
            launch_or_explain(
                launcher,
                (matrix, row_scale, col_scale, result, eps, alpha),
                _check_real,
                matrix,
                row_scale,
                col_scale,
                eps,
                alpha,
                None,
            )
            return result
    backend, rows, head_dim, eps, alpha = _check(matrix, row_scale, col_scale, eps, alpha, out, memory=True)
    launcher = _launcher(backend, matrix.device, head_dim)
    result = matrix.new_empty((rows, head_dim)) if out is None else out  # fp32, its device
    if rows == 0:
        return result
    launcher.launch(matrix, row_scale, col_scale, result, eps, alpha)
    if out is None and launcher.checks_arguments:
        _CHECKED[(head_dim, matrix.get_device())] = launcher
    return result


def _fake(matrix, row_scale, col_scale, eps, alpha, out) -> torch.Tensor | None:
    """While torch traces: the checks that need no memory, then the (rows, head_dim) fp32 result (None with out=)."""
    _, rows, head_dim, _, _ = _check(matrix, row_scale, col_scale, eps, alpha, out, memory=False)
    return torch.empty((rows, head_dim), dtype=torch.float32, device=matrix.device) if out is None else None


def engram_sinkhorn_finalize(
    matrix: torch.Tensor,
    row_scale: torch.Tensor,
    col_scale: torch.Tensor,
    eps: float,
    alpha: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """alpha * (row_scale / (||I||_2 per row + eps))[:, None] * matrix * col_scale[None, :],
    with I = row_scale[:, None] * matrix * col_scale[None, :].

    Args:
        matrix: (rows, head_dim) fp32, contiguous, 16-byte aligned; any rows >= 0, head_dim a multiple of
            64 up to 8192.
        row_scale: (rows,) fp32, contiguous. Not modified.
        col_scale: (head_dim,) fp32, contiguous, 16-byte aligned.
        eps: a finite float added to each row norm.
        alpha: a finite float scaling the result.
        out: optional (rows, head_dim) fp32 contiguous, 16-byte aligned buffer on the same device, not
            overlapping any input (positional, as in the reference library).

    Returns:
        (rows, head_dim) fp32 (`out` when given). rows = 0 returns without a launch.

    The products run in the reference's order, ((alpha * r') * M) * c with r' the correctly rounded
    quotient; only the row norm is an fp32 sum in another order than torch's. The norm of a row is the
    one engram_sinkhorn_step computes for it (same accumulation), so alpha times the row_scale that the
    step stores reproduces this operator's scale bit for bit.
    """
    if traced(matrix):  # torch.compile, fake tensors, make_fx: the torch.library ops (_torch_ops.py)
        _check(matrix, row_scale, col_scale, eps, alpha, out, memory=False)
        if out is None:
            return op('engram_sinkhorn_finalize')(matrix, row_scale, col_scale, float(eps), float(alpha))
        op('engram_sinkhorn_finalize_out')(matrix, row_scale, col_scale, float(eps), float(alpha), out)
        return out
    return _eager(matrix, row_scale, col_scale, eps, alpha, out)


def engram_sinkhorn_finalize_config(
    matrix: torch.Tensor,
    row_scale: torch.Tensor,
    col_scale: torch.Tensor,
    eps: float,
    alpha: float,
    out: torch.Tensor | None = None,
) -> EngramSinkhornFinalizeConfig:
    """The kernel configuration engram_sinkhorn_finalize launches for these arguments (validated alike; no
    launch)."""
    backend, _, head_dim, _, _ = _check(matrix, row_scale, col_scale, eps, alpha, out, memory=True)
    return _launcher(backend, matrix.device, head_dim).cfg
