"""Ascend kernels this project did not write, Ascend C emulated on CPU, against torch references written here.

They are loaded from where they live (`../shared/examples/ascend` next to the checkout: small Ascend kernels
written outside this project for TileLang 0.1.15); nothing of them is copied into the repository.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import cann_ops_ascend_emu as emu
import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2].parent / 'shared' / 'examples' / 'ascend'

pytestmark = pytest.mark.skipif(
    not (EXAMPLES / 'lowerutil.py').exists(), reason=f'the shared Ascend examples are not at {EXAMPLES}'
)


def _example(module: str):
    if str(EXAMPLES) not in sys.path:
        sys.path.append(str(EXAMPLES))  # the examples import their helper as a top-level `lowerutil`
    return importlib.import_module(module)


def _bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    mag = t.abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(mag)) - 7)


def test_mul_simd_tail():
    hc, hidden = 3, 1100  # 1100 = 2 * 512 + 76: a tail task per row
    kernel = emu.compile_prim_func(_example('k_a_mul').mul_simd(hc=hc, hidden=hidden, blk=512, num_cores=8))
    a = torch.randn(hc, hidden).to(torch.bfloat16)
    b = torch.randn(hc, hidden).to(torch.bfloat16)
    out = torch.full((hc, hidden), float('nan'))
    kernel(a, b, out)
    assert torch.equal(out, a.float() * b.float())  # one exact product per element


def test_mul_simt_tail():
    hc, hidden = 2, 1000
    kernel = emu.compile_prim_func(
        _example('k_a_mul').mul_simt(hc=hc, hidden=hidden, blk=512, num_cores=4, threads=256)
    )
    a = torch.randn(hc, hidden).to(torch.bfloat16)
    b = torch.randn(hc, hidden).to(torch.bfloat16)
    out = torch.full((hc, hidden), float('nan'))
    kernel(a, b, out)
    assert torch.equal(out, a.float() * b.float())
    assert kernel.last_report.total('simt_threads') > 0


@pytest.mark.parametrize('num_tokens', [1, 7])
def test_rstd_simd_masked_tail(num_tokens):
    hc, hidden = 3, 200  # 200 = 3 * 64 + 8: update_mask tail with MODE_MERGING
    kernel = emu.compile_prim_func(_example('k_b_rstd_tail').rstd_simd_tail(hc=hc, hidden=hidden, num_cores=8))
    x = torch.randn(num_tokens, hc, hidden).to(torch.bfloat16)
    rstd = torch.full((num_tokens, hc), float('nan'))
    kernel(x, rstd)
    ref = torch.rsqrt(x.double().square().mean(-1) + 1e-6)
    # fp32 sums of 200 squares in another order, then fp32 sqrt and divide: a few 1e-7 relative
    torch.testing.assert_close(rstd.double(), ref, rtol=1e-5, atol=0)


def test_column_reduce_simd_tail():
    num_partials, hc, hidden = 5, 2, 1100
    kernel = emu.compile_prim_func(
        _example('k_c_colreduce').colred_simd(P=num_partials, hc=hc, hidden=hidden, D=512, num_cores=8)
    )
    partial = torch.randn(num_partials, hc, hidden)
    w = torch.randn(hc, hidden).to(torch.bfloat16)
    out = torch.randn(hc, hidden)
    before = out.clone()
    kernel(partial, w, out)
    exact = before.double() + (partial.double() * w.double()).sum(0)
    scale = before.double().abs() + (partial.double() * w.double()).abs().sum(0)
    # recursive fp32 summation of P + 1 terms (products rounded or fused): (P + 2) * 2^-24 of the scale, twice
    assert bool(((out.double() - exact).abs() <= 2 * (num_partials + 2) * 2.0**-24 * scale).all())


def test_fused_rmsnorm_simd():
    n, hidden = 5, 1024
    kernel = emu.compile_prim_func(_example('k_fused_rmsnorm').rmsnorm_simd(hidden=hidden, R=2, num_cores=8))
    x = torch.randn(n, hidden).to(torch.bfloat16)
    w = torch.randn(hidden).to(torch.bfloat16)
    y = torch.empty(n, hidden, dtype=torch.bfloat16)
    rstd = torch.full((n,), float('nan'))
    kernel(x, w, y, rstd)
    ref_rstd = torch.rsqrt(x.double().square().mean(-1) + 1e-6)
    torch.testing.assert_close(rstd.double(), ref_rstd, rtol=1e-5, atol=0)
    ref_y = x.double() * ref_rstd[:, None] * w.double()
    # one bf16 rounding of an fp32 value within ~1e-5 relative of the exact one
    assert bool(((y.double() - ref_y).abs() <= _bf16_ulp(ref_y) + 2e-5 * ref_y.abs()).all())


def test_softmax_simd():
    n, cols = 6, 256
    kernel = emu.compile_prim_func(_example('k_softmax').softmax_simd(cols=cols, R=2, num_cores=8))
    x = 3 * torch.randn(n, cols)
    y = torch.full((n, cols), float('nan'))
    kernel(x, y)
    torch.testing.assert_close(y.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-7)
