"""EmulatedKernel's argument binding: the checks TileLang's host code makes, the grid, the report switch."""

from __future__ import annotations

import functools

import cann_ops_ascend_emu as emu
import pytest
import torch

from cann_ops_tilelang.engram import engram_fused_weight_kernel as fw_k
from cann_ops_tilelang.engram import engram_grad_w_reduce_kernel as gw_k


@functools.cache
def fused_weight():
    cfg = fw_k.choose_engram_fused_weight_config(backend='ascend', hc=4, hidden=256, num_cores=64)
    return emu.compile_prim_func(fw_k.make_engram_fused_weight_kernel(cfg))


@functools.cache
def grad_w_reduce():
    cfg = gw_k.choose_engram_grad_w_reduce_config(backend='ascend', hc=4, hidden=256, num_cores=64)
    return emu.compile_prim_func(gw_k.make_engram_grad_w_reduce_kernel(cfg))


def _fw_args():
    wh = torch.randn(4, 256).to(torch.bfloat16)
    return wh, wh.clone(), torch.empty(4, 256)


def test_source_and_grid_from_the_prim_func():
    kernel = fused_weight()
    assert 'extern "C" __global__ __vector__ void engram_fused_weight_kernel_kernel(' in kernel.get_kernel_source()
    kernel(*_fw_args())
    assert kernel.last_report.grid == 4  # T.Kernel(hc): one row per core
    assert sorted(kernel.last_report.order) == [0, 1, 2, 3]


def test_rejects_dtype_shape_stride_and_kinds():
    kernel = fused_weight()
    wh, we, out = _fw_args()
    with pytest.raises(emu.EmulatorError, match=r"argument 'weight_hidden' dtype mismatch, expected bfloat16"):
        kernel(wh.float(), we, out)
    with pytest.raises(emu.EmulatorError, match=r'weight_embed.shape\[1\] mismatch, expected 256, got 128'):
        kernel(wh, we[:, :128], out)
    with pytest.raises(emu.EmulatorError, match=r'out.strides\[0\] mismatch, expected 256, got 1'):
        kernel(wh, we, torch.empty(256, 4).t())
    with pytest.raises(emu.EmulatorError, match=r"argument 'out' ndim mismatch, expected 2, got 1"):
        kernel(wh, we, torch.empty(1024))
    with pytest.raises(TypeError, match=r'takes 3 arguments, got 2'):
        kernel(wh, we)
    with pytest.raises(TypeError, match=r"argument 'out' must be a torch tensor"):
        kernel(wh, we, 3.0)


def test_dynamic_sizes_bound_from_tensors_and_scalars_checked():
    kernel = grad_w_reduce()
    partial = torch.randn(5, 4, 256)
    wh = torch.randn(4, 256).to(torch.bfloat16)
    gwh, gwe = torch.zeros(4, 256), torch.zeros(4, 256)
    kernel(partial, wh, wh, gwh, gwe)  # num_partials = 5 from partial.shape[0]
    torch.testing.assert_close(gwh, partial.sum(0) * wh.float(), rtol=1e-6, atol=1e-6)
    with pytest.raises(emu.EmulatorError, match=r'dtype mismatch'):
        kernel(partial.double(), wh, wh, gwh, gwe)


def test_report_printed_when_the_environment_asks(monkeypatch, capsys):
    monkeypatch.setenv(emu.ENV_REPORT, '1')
    fused_weight()(*_fw_args())
    err = capsys.readouterr().err
    assert 'engram_fused_weight_kernel_kernel: 4 cores' in err
    assert 'Ascend C emulated on CPU' in err
    monkeypatch.setenv(emu.ENV_REPORT, '0')
    fused_weight()(*_fw_args())
    assert capsys.readouterr().err == ''


def test_seed_fixes_the_core_order():
    kernel = emu.EmulatedKernel(fused_weight().prim_func, source=fused_weight().get_kernel_source(), seed=3)
    kernel(*_fw_args())
    first = kernel.last_report.order
    kernel(*_fw_args())
    assert kernel.last_report.order == first
    assert kernel.last_report.seed == 3
