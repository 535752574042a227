"""CPU test of the mhc perf report's host table (the timed parts run on a CUDA host only): the calls and the host
timer are stubbed, so nothing here launches a kernel."""

import pytest
import torch

from tests.mhc import perf_report
from tests.testing import host_timing


def test_the_host_table_has_a_row_per_case_with_the_median_round_ratio(monkeypatch, capsys):
    made = []

    def recompute_calls(tk, T, M, H, device, L):
        made.append((T, H, L))
        return (lambda: 'ours'), (lambda: 'peer'), 0, 'equal'

    # Per case, 3 rounds of (ours, peer): round ratios 0.5, 2.0 (a slow round, ours first) and 0.5.
    figures = iter([10.0, 20.0, 30.0, 15.0, 12.0, 24.0] * len(perf_report.RECOMPUTE_HOST_CASES))
    monkeypatch.setattr(perf_report, '_recompute_calls', recompute_calls)
    monkeypatch.setattr(host_timing, 'host_time_us', lambda fn, sync, **sizes: next(figures))
    monkeypatch.setattr(torch.cuda, 'synchronize', lambda: None)
    perf_report.report_host(None, 4, torch.device('cpu'), rounds=3)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith('| mhc_')]
    assert made == list(perf_report.RECOMPUTE_HOST_CASES)
    assert rows == [
        f'| mhc_multilayer_recompute | {T} | {H} | {L} | equal | 10.0 | 15.0 | 0.50 |'
        for T, H, L in perf_report.RECOMPUTE_HOST_CASES
    ]


def test_the_pre_big_fuse_rows_call_meets_the_contract():
    """The report's mhc_pre_big_fuse_fwd call (inputs, buffers, scalars in the peer's order) passes the whole
    contract: on CPU tensors only the device guard refuses it."""
    from cann_ops_tilelang.mhc import mhc_pre_big_fuse_fwd

    T, M, H = 4, 4, 256
    inputs = perf_report.big_fuse_inputs(T, M, H, torch.device('cpu'))
    buffers = perf_report.big_fuse_buffers(T, M, H, torch.device('cpu'))
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        mhc_pre_big_fuse_fwd(*inputs, *buffers, *perf_report.BIG_FUSE_SCALARS)
