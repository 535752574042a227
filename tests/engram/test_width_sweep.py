"""CPU tests of the gate width sweep: its grid, its byte counts (those of the operators' outputs), its table
from stubbed libraries and timer, and its usage without a GPU (the timed part runs on a CUDA host only)."""

import types
from collections import namedtuple

import pytest
import torch

from tests.engram import perf_report, width_sweep
from tests.testing.numeric import count_bytes

_Bwd = namedtuple('_Bwd', 'grad_hidden_states grad_kv grad_w_partial')


def test_the_default_grid_is_issue_36s():
    assert width_sweep.SWEEP_HC == (1, 2, 4, 6, 8)
    assert set(width_sweep.SWEEP_HIDDEN) == {*range(1024, 16385, 1024), 2560, 5120, 7168}
    assert list(width_sweep.SWEEP_HIDDEN) == sorted(width_sweep.SWEEP_HIDDEN)
    assert width_sweep.SWEEP_TOKENS == (4001, 32768)


@pytest.mark.parametrize(('num_tokens', 'hc', 'hidden', 'num_partials'), [(7, 4, 128, 132), (3, 8, 64, 66)])
def test_bytes_are_the_tensors_the_operators_read_and_write(num_tokens, hc, hidden, num_partials):
    inp = width_sweep._inputs(num_tokens, hc, hidden, 'cpu')
    fwd_out = [torch.empty(num_tokens, hc, hidden, dtype=torch.bfloat16)]
    fwd_out += [torch.empty(num_tokens, hc) for _ in range(4)]
    assert width_sweep._bytes('fwd', num_tokens, hc, hidden, num_partials) == count_bytes(
        inp['hidden_states'], inp['kv'], *fwd_out
    )
    bwd_out = (inp['hidden_states'], inp['kv'], torch.empty(num_partials, hc, hidden))  # same sizes as the grads
    read = [inp[n] for n in ('grad_out', 'hidden_states', 'kv', 'dot', 'gate_score', 'rstd_x', 'rstd_k')]
    assert width_sweep._bytes('bwd', num_tokens, hc, hidden, num_partials) == count_bytes(*read, *bwd_out)


def test_saved_values_keep_every_token_out_of_the_clamp():
    inp = width_sweep._inputs(64, 4, 256, 'cpu')
    d = inp['dot'] * inp['rstd_x'] * inp['rstd_k'] * 256**-0.5
    assert float(d.abs().min()) > 1e3 * width_sweep.CLAMP


class _FakeLib:
    """Records each call as (op, mask given) and returns outputs of the operators' kinds."""

    def __init__(self, log, num_partials):
        self.log, self.num_partials = log, num_partials

    def engram_gate_fwd(self, x, kv, w, eps, clamp, image_token_mask=None):
        self.log.append(('fwd', image_token_mask is not None))

    def engram_gate_bwd(self, grad_out, x, kv, w, dot, g, rx, rk, clamp, image_token_mask=None):
        self.log.append(('bwd', image_token_mask is not None))
        return _Bwd(None, None, torch.empty(self.num_partials, 1, 1))


def test_the_table_has_a_row_per_shape_with_ratios_of_the_timed_calls(monkeypatch):
    log = []
    libs = {'ours': _FakeLib(log, 66), 'tk': _FakeLib([], 132)}
    monkeypatch.setattr(width_sweep, '_libraries', lambda with_tk: libs)
    monkeypatch.setattr(width_sweep, 'compile_all', lambda *args, **kwargs: None)
    rounds_seen = []

    def medians(fns, rounds, **timing):  # ours: 10 us, ours with a mask: 11 us, TileKernels: 20 us
        rounds_seen.append((rounds, timing))
        for fn in fns[:2]:
            fn()
        times = (10.0, 11.0, 20.0)
        return [(None, 'not timed') if fn is None else (us, 'cupti') for fn, us in zip(fns, times, strict=True)]

    monkeypatch.setattr(perf_report, 'alternating_medians', medians)
    args = types.SimpleNamespace(
        tilekernels=True, sweep_hc=[1, 4], sweep_hidden=[1024], sweep_tokens=[5], jobs=1, rounds=3
    )
    lines = []
    width_sweep.report(args, 'cpu', 1000.0, lines.append)
    rows = [line for line in lines if line.startswith('| 1 |') or line.startswith('| 4 |')]
    assert len(rows) == 2
    hc1, hc4 = ([cell.strip() for cell in row.strip('|').split('|')] for row in rows)
    fwd_gbs = width_sweep._bytes('fwd', 5, 1, 1024, 66) / 10.0 / 1e3
    bwd_gbs = width_sweep._bytes('bwd', 5, 4, 1024, 66) / 10.0 / 1e3  # P from ours' own output
    assert hc1[3:7] == [f'{fwd_gbs:.0f}', f'{100 * fwd_gbs / 1000:.1f}', '1.100', '-']  # no TileKernels at hc 1
    assert hc4[7:] == [f'{bwd_gbs:.0f}', f'{100 * bwd_gbs / 1000:.1f}', '1.100', '2.00']
    assert rounds_seen[:2] == [(1, {'warmup': 5, 'rep': 20})] * 2  # one round where nothing alternates
    assert rounds_seen[2:] == [(3, {'warmup': 5, 'rep': 20})] * 2
    # per row: ours' P (one bwd call), then the timed calls without and with the all-False mask
    assert log == [('bwd', False), ('fwd', False), ('fwd', True), ('bwd', False), ('bwd', True)] * 2


def test_without_a_gpu_it_says_so(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert width_sweep.main([]) == 2
    assert 'needs a CUDA GPU' in capsys.readouterr().err
