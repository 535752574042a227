"""Five of the nine Engram operators' Ascend kernels, Ascend C emulated on CPU, against the fp32 references.

Tolerances are the device tests' own: their checking helpers are imported from tests/engram/test_*.py.
The kernels are called directly (prim_func argument order), not through the operators' public interfaces.
"""

from __future__ import annotations

import functools

import cann_ops_ascend_emu as emu
import pytest
import torch

from cann_ops_tilelang.engram import EngramGateBwdResult, EngramGateFwdResult
from cann_ops_tilelang.engram import engram_fused_weight_kernel as fw_k
from cann_ops_tilelang.engram import engram_gate_bwd_kernel as gb_k
from cann_ops_tilelang.engram import engram_gate_fwd_kernel as gf_k
from cann_ops_tilelang.engram import engram_grad_w_reduce_kernel as gw_k
from cann_ops_tilelang.engram import engram_hash_kernel as hk_k
from tests.engram.engram_fused_weight_ref import engram_fused_weight_ref
from tests.engram.engram_grad_w_reduce_ref import engram_grad_w_reduce_error_scale, engram_grad_w_reduce_ref
from tests.engram.engram_hash_ref import engram_hash_ref
from tests.engram.test_engram_gate_bwd import _check_result as check_gate_bwd
from tests.engram.test_engram_gate_bwd import _inputs as gate_bwd_inputs
from tests.engram.test_engram_gate_fwd import _assert_matches_reference as check_gate_fwd
from tests.engram.test_engram_grad_w_reduce import _assert_reduced
from tests.testing.numeric import assert_equal

CORES = 64  # the CPU tier lowers Ascend kernels for the 950PR's 64 vector cores


def call_by_name(kernel: emu.EmulatedKernel, **named) -> None:
    """Call `kernel` with its prim_func's parameters taken by name (buffer names, scalar names) from `named`."""
    pf = kernel.prim_func
    names = [pf.buffer_map[p].name if p in pf.buffer_map else p.name for p in pf.params]
    missing = [n for n in names if n not in named]
    assert not missing, f'no argument for {missing}'
    kernel(*(named[n] for n in names))


@functools.cache
def fused_weight_kernel(hc, hidden):
    cfg = fw_k.choose_engram_fused_weight_config(backend='ascend', hc=hc, hidden=hidden, num_cores=CORES)
    return emu.compile_prim_func(fw_k.make_engram_fused_weight_kernel(cfg))


@functools.cache
def gate_fwd_kernel(hc, hidden, save_for_backward):
    cfg = gf_k.choose_engram_gate_fwd_config(
        backend='ascend', hc=hc, hidden=hidden, num_cores=CORES, save_for_backward=save_for_backward
    )
    return emu.compile_prim_func(gf_k.make_engram_gate_fwd_kernel(cfg))


@functools.cache
def gate_bwd_kernel(hc, hidden):
    cfg = gb_k.choose_engram_gate_bwd_config(backend='ascend', hc=hc, hidden=hidden, num_cores=CORES)
    return cfg, emu.compile_prim_func(gb_k.make_engram_gate_bwd_kernel(cfg))


@functools.cache
def grad_w_reduce_kernel(hc, hidden):
    cfg = gw_k.choose_engram_grad_w_reduce_config(backend='ascend', hc=hc, hidden=hidden, num_cores=CORES)
    return emu.compile_prim_func(gw_k.make_engram_grad_w_reduce_kernel(cfg))


@functools.cache
def hash_kernel(num_layers, max_ngram, num_tables):
    cfg = hk_k.choose_engram_hash_config(
        backend='ascend', num_layers=num_layers, max_ngram=max_ngram, num_tables=num_tables, num_cores=CORES
    )
    return emu.compile_prim_func(hk_k.make_engram_hash_kernel(cfg))


@pytest.mark.parametrize(('hc', 'hidden'), [(4, 256), (3, 192)])
def test_fused_weight_bit_exact(hc, hidden):
    wh = (1.0 + 0.5 * torch.randn(hc, hidden)).to(torch.bfloat16)
    we = (1.0 + 0.5 * torch.randn(hc, hidden)).to(torch.bfloat16)
    out = torch.full((hc, hidden), float('nan'))
    kernel = fused_weight_kernel(hc, hidden)
    kernel(wh, we, out)
    assert_equal(out, engram_fused_weight_ref(wh, we))
    rep = kernel.last_report
    assert rep.total('ub2gm_bytes') == out.numel() * 4
    assert rep.total('gm2ub_bytes') == 2 * wh.numel() * 2


def _gate_fwd_inputs(num_tokens, hc, hidden):
    x = torch.randn(num_tokens, hc, hidden).to(torch.bfloat16)
    kv = torch.randn(num_tokens, hc + 1, hidden).to(torch.bfloat16)
    w = (1.0 + 0.5 * torch.randn(hc, hidden)).to(torch.bfloat16).float()
    return x, kv, w


def _fwd_args(x, kv, w, out, saved):
    named = dict(x=x, kv=kv, w=w, out=out, eps=1e-6, clamp_value=1e-6)
    if saved is not None:
        named.update(zip(('dot_o', 'g_o', 'rx_o', 'rk_o'), saved, strict=True))
    return named


@pytest.mark.parametrize('num_tokens', [1, 130])
def test_gate_fwd_saved_outputs(num_tokens):
    hc, hidden = 4, 256
    x, kv, w = _gate_fwd_inputs(num_tokens, hc, hidden)
    out = torch.empty(num_tokens, hc, hidden, dtype=torch.bfloat16)
    saved = [torch.empty(num_tokens, hc) for _ in range(4)]
    call_by_name(gate_fwd_kernel(hc, hidden, True), **_fwd_args(x, kv, w, out, saved))
    check_gate_fwd(EngramGateFwdResult(out, *saved), x, kv[:, :hc], kv[:, hc], w)


def test_gate_fwd_without_saved_outputs_strided_kv():
    num_tokens, hc, hidden = 70, 4, 256
    x, _, w = _gate_fwd_inputs(num_tokens, hc, hidden)
    # kv a view with padded rows and a token stride of its own: the kernel addresses it through its strides
    kv = torch.randn(num_tokens, hc + 2, hidden + 64).to(torch.bfloat16)[:, 1:, 32 : 32 + hidden]
    out = torch.empty(num_tokens, hc, hidden, dtype=torch.bfloat16)
    call_by_name(gate_fwd_kernel(hc, hidden, False), **_fwd_args(x, kv, w, out, None))
    saved = [torch.empty(num_tokens, hc) for _ in range(4)]
    call_by_name(gate_fwd_kernel(hc, hidden, True), **_fwd_args(x, kv, w, torch.empty_like(out), saved))
    check_gate_fwd(EngramGateFwdResult(out, *saved), x, kv[:, :hc], kv[:, hc], w)


# EngramGateBwdResult field -> the kernel's buffer holding it
_BWD_FIELDS = {'grad_hidden_states': 'grad_x', 'grad_kv': 'grad_kv', 'grad_w_partial': 'grad_w_partial'}


@pytest.mark.parametrize('num_tokens', [130])
def test_gate_bwd(num_tokens):
    hc, hidden = 4, 256
    cfg, kernel = gate_bwd_kernel(hc, hidden)
    inputs = gate_bwd_inputs(num_tokens, hc, hidden, 'cpu')
    grad_out, x, kv, w, dot, g, rx, rk = inputs  # kv packed (T, hc + 1, H): the kernel takes it whole
    alloc = torch.zeros if cfg.accumulates_into_partials else torch.empty
    named = dict(
        grad_out=grad_out, hidden_states=x, kv=kv, weight_fused=w, dot=dot, gate_score=g, rstd_x=rx, rstd_k=rk,
        grad_x=torch.empty(num_tokens, hc, hidden, dtype=torch.bfloat16),
        grad_kv=torch.empty(num_tokens, hc + 1, hidden, dtype=torch.bfloat16),
        grad_w_partial=alloc(cfg.num_blocks, hc, hidden), clamp_value=1e-6,
        token_counter=torch.zeros(gb_k.COUNTER_WORDS, dtype=torch.int32),
    )  # fmt: skip
    call_by_name(kernel, **named)
    result = EngramGateBwdResult(*(named[_BWD_FIELDS[f]] for f in EngramGateBwdResult._fields))
    check_gate_bwd(result, inputs, clamp_value=1e-6, num_cores=cfg.num_blocks)


@pytest.mark.parametrize('num_partials', [1, 70])
def test_grad_w_reduce(num_partials):
    hc, hidden = 4, 256
    partial = torch.randn(num_partials, hc, hidden)
    wh = (1.0 + 0.5 * torch.randn(hc, hidden)).to(torch.bfloat16)
    we = (1.0 + 0.5 * torch.randn(hc, hidden)).to(torch.bfloat16)
    gwh, gwe = torch.randn(hc, hidden), torch.randn(hc, hidden)
    inputs = (partial, wh, we, gwh.clone(), gwe.clone())
    expected = engram_grad_w_reduce_ref(*inputs)
    scales = engram_grad_w_reduce_error_scale(*inputs)
    grad_w_reduce_kernel(hc, hidden)(partial, wh, we, gwh, gwe)
    for actual, exp, scale in zip((gwh, gwe), expected, scales, strict=True):
        _assert_reduced(actual, exp, scale, num_partials)


@pytest.mark.parametrize('num_tokens', [1, 130, 1000])
def test_hash_bit_exact(num_tokens):
    num_layers, max_ngram, num_tables = 2, 3, 8
    ids = torch.randint(0, 2**31 - 1, (num_tokens, max_ngram), dtype=torch.int32)
    mult = torch.randint(-(2**63), 2**63 - 1, (num_layers, max_ngram), dtype=torch.int64)
    vocab = torch.randint(1, 2**31 - 1, (num_layers, max_ngram - 1, num_tables), dtype=torch.int32)
    offsets = torch.randint(-(2**31), 2**31 - 1, (num_layers, (max_ngram - 1) * num_tables), dtype=torch.int32)
    out = torch.full((num_layers, num_tokens, (max_ngram - 1) * num_tables), -7, dtype=torch.int32)
    kernel = hash_kernel(num_layers, max_ngram, num_tables)
    kernel(ids, mult, vocab, offsets, out)
    assert_equal(out, engram_hash_ref(ids, mult, vocab, offsets))
    assert kernel.last_report.total('simt_vf_calls') == num_layers * -(-num_tokens // 512)
