"""CPU tests of perf_report: its timing loop (rounds alternate between the timed calls, a failed call is
reported and not timed again), its usage errors, and its host table on host_overhead's stubbed launches
(the device part of the report runs on a CUDA host only)."""

import pytest

from tests.engram import perf_report
from tests.testing import device_timing


@pytest.fixture
def fake_timer(monkeypatch):
    """device_timing._timed replaced: each call's name is logged and its next planned time returned."""
    log, planned = [], {}

    def timed(fn):
        name = fn()
        log.append(name)
        us = planned[name].pop(0)
        return (None, f'{name} failed') if us is None else (us, 'cupti')

    monkeypatch.setattr(device_timing, '_timed', timed)
    return log, planned


def test_rounds_alternate_and_each_call_gets_the_median_of_its_rounds(fake_timer):
    log, planned = fake_timer
    planned.update(ours=[3.0, 1.0, 2.0], theirs=[9.0, 4.0, 5.0])
    results = perf_report.alternating_medians([lambda: 'ours', lambda: 'theirs'], rounds=3)
    assert log == ['ours', 'theirs'] * 3
    assert results == [(2.0, 'cupti'), (5.0, 'cupti')]


def test_a_failed_call_is_reported_and_not_timed_again(fake_timer):
    log, planned = fake_timer
    planned.update(ours=[1.0, 1.5], theirs=[None])
    results = perf_report.alternating_medians([lambda: 'ours', lambda: 'theirs', None], rounds=2)
    assert log == ['ours', 'theirs', 'ours']
    assert results == [(1.25, 'cupti'), (None, 'theirs failed'), (None, 'not timed')]


@pytest.mark.parametrize('rounds', ['0', '-2', 'three'])
def test_rounds_below_one_is_a_usage_error(rounds, capsys):
    with pytest.raises(SystemExit) as exit_info:
        perf_report.main(['--rounds', rounds])
    assert exit_info.value.code == 2
    assert '--rounds' in capsys.readouterr().err


def test_the_host_table_has_every_operator_timed_as_host_overhead_times_it(monkeypatch):
    from tests.engram import host_overhead

    monkeypatch.setattr(host_overhead, 'CALLS', 2)
    monkeypatch.setattr(host_overhead, 'ROUNDS', 1)
    lines = []
    with host_overhead.stubbed_launches() as device:
        perf_report.report_host(device, None, lines.append)
    rows = [line for line in lines if line.startswith('| ') and not line.startswith(('| op', '| ---'))]
    assert [row.split(' | ')[0][2:] for row in rows] == list(host_overhead.OPS)
    for row in rows:
        ours, theirs, ratio = row.strip(' |').split(' | ')[1:]
        assert float(ours) > 0, row
        assert (theirs, ratio) == ('-', '-'), row
