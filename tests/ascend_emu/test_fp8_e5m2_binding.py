"""EmulatedKernel binds float8_e5m2 tensor arguments (kernel.py's dtype table), as it binds float8_e4m3fn ones:
through quant.cast's Ascend kernel of e5m2 -> fp32 (a load of one byte per 32-bit lane and vcvt, vector.h's
e5m2 -> fp32 pair), every one of the 256 codes against torch's widening; other dtypes are refused."""

from __future__ import annotations

import functools

import cann_ops_ascend_emu as emu
import pytest
import torch

from cann_ops_tilelang.quant.cast_kernel import choose_cast_config, make_cast_kernel


@functools.cache
def widen_e5m2():
    cfg = choose_cast_config(backend='ascend', num_cores=4, in_dtype='float8_e5m2', out_dtype='float32')
    return emu.compile_prim_func(make_cast_kernel(cfg))


def test_every_e5m2_code_widens_exactly():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(3)[:700]  # a tail past whole registers
    out = torch.full((700,), 7.0)
    widen_e5m2()(codes.view(torch.float8_e5m2), out)
    expected = codes.view(torch.float8_e5m2).float()
    nan = expected.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(out[~nan].view(torch.int32), expected[~nan].view(torch.int32))  # -0.0, subnormals, inf


def test_e5m2_argument_dtype_is_checked():
    kernel = widen_e5m2()
    codes = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(emu.EmulatorError, match=r"argument 'x' dtype mismatch, expected float8_e5m2, got torch.uint8"):
        kernel(codes, torch.empty(64))
    with pytest.raises(emu.EmulatorError, match=r'dtype mismatch, expected float8_e5m2, got torch.float8_e4m3fn'):
        kernel(codes.view(torch.float8_e4m3fn), torch.empty(64))
