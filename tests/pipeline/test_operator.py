"""Operator.launch: the fast path's launch, whose rejections the operator's contract explains."""

from __future__ import annotations

import pytest

from cann_ops_tilelang import operator


@pytest.fixture(autouse=True)
def _no_registration(monkeypatch):
    monkeypatch.setattr(operator, 'OPERATORS', {})  # the operators made here stay out of the package's registry


def _declared(check) -> operator.Operator:
    """An operator whose contract is `check` (no kernel: the launchers below stand in for compiled entries)."""
    return operator.Operator('test_op', check, None, None)


class _Rejecting:
    """A launcher whose entry refuses its arguments, as TileLang's generated host code does."""

    def __init__(self, error: Exception):
        self.error = error
        self.calls = 0

    def launch(self, *args):
        self.calls += 1
        raise self.error


def test_a_rejected_fast_launch_gets_the_contracts_typed_error():
    entry_error = RuntimeError('kernel k input x dtype mismatch, expected bfloat16')

    def explain(name, dtype):
        raise TypeError(f'{name} must have dtype torch.bfloat16, got {dtype}')

    launcher = _Rejecting(entry_error)
    with pytest.raises(TypeError, match='x must have dtype torch.bfloat16, got torch.float32') as info:
        _declared(explain).launch(launcher, (1, 2), 'x', 'torch.float32')
    assert info.value.__context__ is None, 'the typed error does not chain the entry error'
    assert launcher.calls == 1


def test_a_rejection_the_contract_does_not_explain_keeps_the_entrys_error():
    entry_error = RuntimeError('CUDA error: out of memory')
    with pytest.raises(RuntimeError, match='out of memory') as info:
        _declared(lambda: None).launch(_Rejecting(entry_error), ())
    assert info.value is entry_error


def test_an_accepted_launch_runs_no_explanation():
    launched = []

    class Accepting:
        def launch(self, *args):
            launched.append(args)

    _declared(lambda: pytest.fail('explained an accepted launch')).launch(Accepting(), (1, 2))
    assert launched == [(1, 2)]
