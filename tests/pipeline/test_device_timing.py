"""The performance reports' shared table (device_timing.print_comparison, agreement) with the timers replaced."""

import torch

from tests.testing import device_timing


def test_agreement_tells_equal_close_and_different_results():
    a = torch.ones(3)
    assert device_timing.agreement(a, a.clone()) == 'equal'
    assert device_timing.agreement((a, torch.arange(3)), (a + 1e-7, torch.arange(3))) == 'close'
    assert device_timing.agreement(a, a + 1) == 'DIFF'
    assert device_timing.agreement((a, torch.arange(3)), (a, torch.arange(1, 4))) == 'DIFF'
    assert device_timing.agreement(a, torch.ones(4)) == 'DIFF (shapes)'
    e4m3 = a.to(torch.float8_e4m3fn)
    assert device_timing.agreement(e4m3, e4m3.clone()) == 'equal'
    assert device_timing.agreement(e4m3, (a * 2).to(torch.float8_e4m3fn)) == 'DIFF'


def test_print_comparison_rows(monkeypatch, capsys):
    monkeypatch.setattr(
        device_timing, 'alternating_medians', lambda fns, rounds: [(2.0, 't'), (4.0, 't') if fns[1] else (None, 'n')]
    )
    monkeypatch.setattr(device_timing, 'same_traffic_floors', lambda moved, device: (moved / 100, 0.0))

    def calls(case):
        if case == 'broken':
            raise ValueError('no such shape')
        return (lambda: None), (None if case == 'alone' else lambda: None), 150, 'equal' if case == 'pair' else None

    device_timing.print_comparison(
        ['pair', 'alone', 'broken'], calls, columns='case', cells=str, rounds=1, device=torch.device('cpu')
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == '| case | agree | ours us | peer us | copy us | ours / peer | % of copy |'
    assert lines[1] == '| --- | --- | --- | --- | --- | --- | --- |'
    assert lines[2] == '| pair | equal | 2.0 | 4.0 | 1.5 | 0.50 | 75 |'
    assert lines[3] == '| alone | - | 2.0 | - | 1.5 | - | 75 |'
    assert lines[4] == '| broken | failed: ValueError: no such shape |'
