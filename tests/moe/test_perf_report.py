"""CPU tests of the MoE perf report's host table and of its calls without out= (the timed parts run on a CUDA host
only): the host timer is stubbed, so nothing here launches a kernel."""

import types

import pytest
import torch

from tests.moe import perf_report
from tests.testing import host_timing


def _stub_library():
    """A stand-in for TileKernels' moe module: the gate returns (topk_idx, topk_weights) of zeros (the backward's
    rows are built from it), every other entry None."""

    def gate(logits, num_topk, *args, **kwargs):
        T = logits.shape[0]
        return torch.zeros(T, num_topk, dtype=torch.int64), torch.zeros(T, num_topk)

    nothing = lambda *args, **kwargs: None
    return types.SimpleNamespace(
        topk_gate=nothing, normalize_weight=nothing, moe_topk_gate=gate, moe_topk_gate_backward=nothing
    )


@pytest.fixture
def stub_host_timer(monkeypatch):
    """host_time_us replaced: ours takes 10 us a call, the peer (tagged is_peer) 20 us; every timed function is
    logged."""
    log = []

    def host_time_us(fn, sync, **sizes):
        log.append(fn)
        return 20.0 if getattr(fn, 'is_peer', False) else 10.0

    monkeypatch.setattr(host_timing, 'host_time_us', host_time_us)
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda: None)
    return log


def test_the_host_table_has_a_row_per_case_with_the_fastest_round(stub_host_timer, monkeypatch, capsys):
    calls = []
    real_calls = perf_report._calls

    def tagged_calls(case, tk, device, with_compiled=True, with_out=True):
        ours, peer, moved, compiled = real_calls(case, tk, device, with_compiled, with_out)
        calls.append(with_out)
        peer.is_peer = True
        return ours, peer, moved, compiled

    monkeypatch.setattr(perf_report, '_calls', tagged_calls)
    cases = [perf_report.Case(c.op, c.variant, 4, c.num_experts, c.num_topk) for c in perf_report.HOST_TABLE]
    perf_report.report_host(cases, _stub_library(), torch.device('cpu'), rounds=3)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith('| moe_')]
    assert [row.split(' | ')[0][2:] for row in rows] == [c.op for c in cases]
    assert all(row.endswith('| 10.0 | 20.0 | 0.50 |') for row in rows), rows
    assert calls == [False] * (len(cases) + 1)  # no out= buffers: ours allocates as the peer does; one warm-up
    assert len(stub_host_timer) == 2 + 2 * 3 * len(cases)  # the thrown-away pair, then 3 rounds of both


def test_the_host_ratio_is_the_median_of_the_rounds_own_ratios(monkeypatch, capsys):
    """A slow stretch of the host that falls on one round moves both of its figures, not the ratio: round
    ratios 0.5, 2.0 (the slow round, ours first) and 0.5 give 0.50, where the fastest figures' ratio is 0.67."""
    figures = iter([1.0, 1.0, 10.0, 20.0, 30.0, 15.0, 12.0, 24.0])  # the thrown-away pair, then 3 rounds
    monkeypatch.setattr(host_timing, 'host_time_us', lambda fn, sync, **sizes: next(figures))
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda: None)
    case = perf_report.HOST_TABLE[0]
    small = perf_report.Case(case.op, case.variant, 4, case.num_experts, case.num_topk)
    perf_report.report_host([small], _stub_library(), torch.device('cpu'), rounds=3)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith('| moe_'))
    assert row.endswith('| 10.0 | 15.0 | 0.50 |'), row


@pytest.mark.parametrize('case', perf_report.HOST_TABLE, ids=lambda c: f'{c.op}-{c.variant or "plain"}')
def test_without_out_our_call_passes_no_buffers(case, monkeypatch):
    """with_out=False: our operator gets no out= keyword (the peer's calls have none)."""
    seen = {}

    def record(name):
        def call(*args, **kwargs):
            seen[name] = kwargs
            return None

        return call

    for name in ('moe_topk', 'moe_normalize_weight', 'moe_topk_gate', 'moe_topk_gate_backward'):
        monkeypatch.setattr(perf_report.ops, name, record(name))
    small = perf_report.Case(case.op, case.variant, 4, case.num_experts, case.num_topk)
    tk = _stub_library()
    for with_out in (False, True):
        ours, _, _, _ = perf_report._calls(small, tk, torch.device('cpu'), with_compiled=False, with_out=with_out)
        ours()
        assert ('out' in seen[case.op]) is with_out
