"""The eager fast path of every public operator keeps the contract (device tier).

Once a configuration has launched on a GPU, a call that finds its launcher in its Operator's `fast` table
checks in Python only what the compiled entry cannot, leaves rank, dtype, shapes, strides and devices to
the entry (kernel_target.Launcher.checks_arguments), and has `_check` explain a rejection
(operator.Operator.launch). Here every argument of every operator is spoiled in turn, and the call
with a warm fast path must end exactly as the same call that goes the full way: the same exception type and
message, or the same results.
"""

from __future__ import annotations

import math

import pytest
import torch

import cann_ops_tilelang
from tests.engram import host_overhead

# operator -> (its module, the host_overhead inputs it takes, in order, then its scalar arguments)
CALLS = {
    'fused_weight': ('engram_fused_weight', ('wh', 'we'), ()),
    'gate_fwd': ('engram_gate_fwd', ('x', 'kv', 'w'), (host_overhead.EPS, host_overhead.CLAMP)),
    'gate_bwd': (
        'engram_gate_bwd',
        ('grad_out', 'x', 'kv', 'w', 'dot', 'gate_score', 'rstd_x', 'rstd_k'),
        (host_overhead.CLAMP,),
    ),
    'grad_w_reduce': ('engram_grad_w_reduce', ('partial', 'wh', 'we', 'gwh', 'gwe'), ()),
    'hash': ('engram_hash', ('ids', 'multipliers', 'vocab_sizes', 'offsets'), ()),
    'sinkhorn_momentum_update': ('engram_sinkhorn_momentum_update', ('grad', 'momentum'), (0.9,)),
    'sinkhorn_step': ('engram_sinkhorn_step', ('matrix', 'row_scale', 'col_scale'), (host_overhead.EPS,)),
    'sinkhorn_step_reduce': ('engram_sinkhorn_step_reduce', ('col_sumsq_partial', 'col_sumsq'), ()),
    'sinkhorn_finalize': (
        'engram_sinkhorn_finalize',
        ('matrix', 'row_scale', 'col_scale'),
        (host_overhead.EPS, 1.0),
    ),
}
OTHER_DTYPE = {
    torch.float32: torch.bfloat16,
    torch.bfloat16: torch.float32,
    torch.int32: torch.int64,
    torch.int64: torch.int32,
    torch.bool: torch.uint8,
}


def _inputs(device) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    inputs = host_overhead.make_inputs(device)
    inputs.update(zip(('dot', 'gate_score', 'rstd_x', 'rstd_k'), inputs.pop('saved'), strict=True))
    return inputs


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t's values in a non-contiguous tensor of the same shape (every other element of a wider one)."""
    wide = torch.zeros((*t.shape, 2), dtype=t.dtype, device=t.device)
    wide[..., 0] = t
    return wide[..., 0]


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """t's values in a contiguous tensor one element past an aligned address."""
    storage = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = storage[1:].view(t.shape)
    view.copy_(t)
    return view


def _shorter(t: torch.Tensor) -> torch.Tensor:
    """t without its last element along the last dimension (a different extent)."""
    return t[..., :-1].contiguous() if t.dim() else t


TENSOR_SPOILERS = {
    'other dtype': lambda t: t.to(OTHER_DTYPE[t.dtype]),
    'extra dimension': lambda t: t.unsqueeze(0),
    'shorter': _shorter,
    'strided': _strided,
    'misaligned': _misaligned,
    'on the CPU': lambda t: t.cpu(),
    'a list': lambda t: [1.0, 2.0],
    'None': lambda t: None,
}
SCALAR_SPOILERS = {
    'an int': lambda s: 1,
    'NaN': lambda s: math.nan,
    'negative': lambda s: -abs(s) - 1.0,
    'infinite': lambda s: math.inf,
    'a string': lambda s: '1.0',
}


def _outcome(call, args):
    """('raised', type, message) or ('returned', the results, then every argument as it is after the call)."""
    try:
        result = call(*args)
    except Exception as exc:
        return ('raised', type(exc), str(exc))
    results = list(result) if isinstance(result, tuple) else [result]
    return ('returned', [a.cpu() if isinstance(a, torch.Tensor) else a for a in results + args])


def _same(fast, full, op_name: str) -> bool:
    if fast[0] != full[0] or fast[0] == 'raised':
        return fast == full
    for index, (a, b) in enumerate(zip(fast[1], full[1], strict=True)):
        if not isinstance(a, torch.Tensor):
            if a != b:
                return False
        elif op_name == 'gate_bwd' and index == 2:  # grad_w_partial: blocks claim their tokens at run time
            if not torch.allclose(a.sum(0), b.sum(0), rtol=1e-5, atol=1e-5):
                return False
        elif not torch.equal(a, b):
            return False
    return True


def _describe(outcome) -> str:
    return f'{outcome[1].__name__}: {outcome[2]}' if outcome[0] == 'raised' else 'returned'


class _NoStore(dict):
    """A fast-path table that keeps nothing: every call takes the full way."""

    def __setitem__(self, key, value) -> None:
        pass


@pytest.mark.npu
@pytest.mark.parametrize('op_name', list(CALLS))
def test_fast_path_ends_every_spoiled_call_as_the_full_path_does(op_name, device, monkeypatch):
    if device.type != 'cuda':
        pytest.skip('the fast path is for kernels whose compiled entry checks its arguments (TileLang on CUDA)')
    module_name, names, scalars = CALLS[op_name]
    call = getattr(cann_ops_tilelang, module_name)
    declared = call.operator
    inputs = _inputs(device)

    def args_with(position=None, spoil=None):
        fresh = [inputs[name].clone() for name in names] + list(scalars)
        if position is not None:
            fresh[position] = spoil(fresh[position])
        return fresh

    call(*args_with())  # compiles, and puts the launcher into the fast path's table
    assert declared.fast, f'{module_name}: a launch on {device} did not enable the fast path'
    real_check, checks = declared.check, []
    monkeypatch.setattr(declared, 'check', lambda *a, **k: checks.append(a) or real_check(*a, **k))
    call(*args_with())
    assert checks == [], f'{module_name}: a valid warm call ran the Python checks'
    monkeypatch.setattr(declared, 'check', real_check)

    cases = [(i, kind, spoil) for i in range(len(names)) for kind, spoil in TENSOR_SPOILERS.items()]
    cases += [(len(names) + j, kind, spoil) for j in range(len(scalars)) for kind, spoil in SCALAR_SPOILERS.items()]
    fast_table = declared.fast
    mismatches = []
    for position, kind, spoil in cases:
        fast = _outcome(call, args_with(position, spoil))
        monkeypatch.setattr(declared, 'fast', _NoStore())
        full = _outcome(call, args_with(position, spoil))
        monkeypatch.setattr(declared, 'fast', fast_table)
        if not _same(fast, full, op_name):
            label = names[position] if position < len(names) else f'scalar {position - len(names)}'
            mismatches.append(f'{label}, {kind}: fast path {_describe(fast)}; full path {_describe(full)}')
    assert not mismatches, '\n'.join(mismatches)


def _grad_w_reduce_overlaps(partial, wh, we, gwh, gwe) -> dict:
    """Makers of grad_w_reduce's arguments, fresh tensors with the given values each call, where a gradient
    shares memory with another argument (and one case that shares a buffer without overlapping)."""
    hc, hidden = gwh.shape
    n = hc * hidden

    def into(storage: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        view = storage[: t.numel()].view(t.shape)
        view.copy_(t)
        return view

    def fresh(**given) -> list:
        names = {'partial': partial, 'wh': wh, 'we': we, 'gwh': gwh, 'gwe': gwe}
        return [given[name] if name in given else t.clone() for name, t in names.items()]

    def one_tensor():
        grad = gwh.clone()
        return fresh(gwh=grad, gwe=grad)

    def one_buffer(offset: int):
        def make():
            both = torch.zeros(n + offset, dtype=torch.float32, device=gwh.device)
            return fresh(gwh=into(both, gwh), gwe=into(both[offset:], gwe))

        return make

    def grad_over_weight(grad_name: str, weight_name: str, weight: torch.Tensor):
        def make():
            storage = torch.zeros(n, dtype=torch.float32, device=gwh.device)
            shared = into(storage.view(torch.bfloat16), weight)
            return fresh(**{weight_name: shared, grad_name: storage.view(hc, hidden)})

        return make

    def grad_over_partial_tail():
        storage = torch.zeros(partial.numel() + n // 2, dtype=torch.float32, device=gwh.device)
        return fresh(partial=into(storage, partial), gwe=storage[partial.numel() - n // 2 :].view(hc, hidden))

    return {
        'the two gradients, one tensor': one_tensor,
        'the two gradients, half overlapping': one_buffer(n // 2),
        'the two gradients, adjacent (no overlap)': one_buffer(n),
        'grad_weight_hidden over weight_hidden': grad_over_weight('gwh', 'wh', wh),
        'grad_weight_embed over weight_embed': grad_over_weight('gwe', 'we', we),
        'grad_weight_embed over the tail of grad_w_partial': grad_over_partial_tail,
    }


@pytest.mark.npu
def test_grad_w_reduce_fast_path_refuses_every_overlap_the_full_path_refuses(device, monkeypatch):
    if device.type != 'cuda':
        pytest.skip('the fast path is for kernels whose compiled entry checks its arguments (TileLang on CUDA)')
    inputs = _inputs(device)
    args = [inputs[name] for name in CALLS['grad_w_reduce'][1]]
    call = cann_ops_tilelang.engram_grad_w_reduce
    declared = call.operator
    call(*[a.clone() for a in args])  # puts the launcher into the fast path's table
    assert declared.fast
    fast_table, mismatches, refused = declared.fast, [], 0
    for kind, make in _grad_w_reduce_overlaps(*args).items():
        fast = _outcome(call, make())
        monkeypatch.setattr(declared, 'fast', _NoStore())
        full = _outcome(call, make())
        monkeypatch.setattr(declared, 'fast', fast_table)
        refused += full[0] == 'raised'
        if not _same(fast, full, 'grad_w_reduce'):
            mismatches.append(f'{kind}: fast path {_describe(fast)}; full path {_describe(full)}')
    assert not mismatches, '\n'.join(mismatches)
    assert refused == 5  # every case but the adjacent gradients
