"""Each domain's perf report (tests/<domain>/perf_report.py, run on a GPU host as `python -m`) starts as a
script: its usage prints without a device or the peer installed."""

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPORTS = sorted(p.parent.name for p in TESTS.glob('*/perf_report.py'))


def test_every_domain_with_kernels_has_a_report():
    assert {'engram', 'moe', 'mhc', 'quant'} <= set(REPORTS)


@pytest.mark.parametrize('domain', REPORTS)
def test_perf_report_runs_as_a_module(domain):
    done = subprocess.run(
        [sys.executable, '-m', f'tests.{domain}.perf_report', '--help'],
        cwd=TESTS.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('usage:'), done.stdout


def test_quant_report_passes_each_operator_its_output_buffers():
    from cann_ops_tilelang import quant
    from tests.quant import perf_report

    # batched_transpose_weight_sf takes a list; per_token_cast_and_cast_back works in place
    ops = {case.op for case in perf_report.TABLE} - {'batched_transpose_weight_sf', 'per_token_cast_and_cast_back'}
    names = {op: perf_report.out_name(getattr(quant, op)) for op in ops}
    assert names['per_token_cast'] == 'out'  # seed follows it
    assert names['per_block_cast_with_sf_only'] == 'out_sf'
    assert all(name in ('out', 'out_sf') for name in names.values()), names
