"""CPU tensors taken as CUDA ones, so that the CPU tier runs an operator's eager fast path: its flow (which calls
plan, which launch, which key), not its kernels."""

from __future__ import annotations

import pytest

from cann_ops_tilelang import config, operator
from cann_ops_tilelang.kernel_target import Launcher
from tests.testing.lowering import H200_SMS


def fast_ok_on_cpu(op: operator.Operator):
    """`op`'s generated fast_ok with its device test (the first tensor's `is_cuda`: a quantised tensor's data) taken
    out."""
    namespace = dict(op.fast_ok.__globals__)
    first = operator._items(op.args[0])[0].name
    exec(op.source.replace(f'{first}.is_cuda', 'True'), namespace)
    return namespace['fast_ok']


def stub_cuda_launches(monkeypatch: pytest.MonkeyPatch, *operators: operator.Operator) -> list[tuple]:
    """Each operator's fast_ok without its device test (the first tensor's `is_cuda`), empty launcher tables, one
    core count, and launches recorded as (cfg, args) instead of made; a launcher that has launched counts as
    checking its arguments, as a loaded kernel's entry does. Returns the list of launches."""
    launches = []
    for op in operators:
        monkeypatch.setattr(op, 'fast_ok', fast_ok_on_cpu(op))
        monkeypatch.setattr(op, 'fast', {})
        monkeypatch.setattr(op, '_launchers', {})

    def launch(self, *args):
        self.checks_arguments = True
        launches.append((self.cfg, args))

    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: H200_SMS)
    monkeypatch.setattr(Launcher, 'launch', launch)
    return launches


def count_plans(monkeypatch: pytest.MonkeyPatch, op: operator.Operator) -> list[tuple]:
    """The argument tuples of every full check-and-plan of `op` from now on (the calls that left the fast path)."""
    plans = []
    plan = op.plan
    monkeypatch.setattr(op, 'plan', lambda *args: plans.append(args) or plan(*args))
    return plans


def record_launchers(
    monkeypatch: pytest.MonkeyPatch, launchers: operator.Launchers, num_cores: int = H200_SMS
) -> tuple[list[tuple], list[tuple]]:
    """`launchers`' cache emptied, one core count, and its launchers recorded instead of made: returns (made,
    launched), made a (get_kernel, cfg, device) per launcher the cache makes, launched the arguments of each
    launch."""
    made, launched = [], []

    class Recording:
        def __init__(self, get_kernel, cfg, device):
            made.append((get_kernel, cfg, device))

        def launch(self, *args):
            launched.append(args)

    monkeypatch.setattr(operator, 'Launcher', Recording)
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: num_cores)
    monkeypatch.setattr(launchers, '_launchers', {})
    return made, launched
