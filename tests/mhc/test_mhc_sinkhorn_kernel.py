"""Tests of mhc_sinkhorn_kernel.py's configuration: the chooser is pure and hashable, refuses what the operators'
contract refuses, and sizes the backward's blocks to its on-chip store; the CUDA kernels' Newton reciprocal
(lowered on the CPU, values on a GPU)."""

import dataclasses
import re

import pytest
import torch

from cann_ops_tilelang.kernel_target import Launcher
from cann_ops_tilelang.mhc.mhc_sinkhorn_kernel import (
    MAX_REPEAT,
    MhcSinkhornConfig,
    choose_mhc_sinkhorn_config,
    get_mhc_sinkhorn_kernel,
    make_mhc_sinkhorn_kernel,
    steps,
    store_bytes_per_token,
)
from tests.testing.generator import by_level, get_test_level
from tests.testing.lowering import assert_cuda_kernel_lowers
from tests.testing.numeric import assert_close

from .mhc_sinkhorn_bwd_ref import mhc_sinkhorn_bwd_ref
from .mhc_sinkhorn_fwd_ref import mhc_sinkhorn_fwd_ref
from .sinkhorn_cases import ATOL, EPS, RTOL, make_config, random_logits


def test_mhc_sinkhorn_config_is_pure_and_hashable():
    for backend in ('ascend', 'cuda'):
        first, second = make_config(backend, 'bwd', 4, 20), make_config(backend, 'bwd', 4, 20)
        assert first == second
        assert hash(first) == hash(second)
        with pytest.raises(dataclasses.FrozenInstanceError):
            first.tokens = 1


def test_mhc_sinkhorn_store_size():
    assert [steps(r) for r in (1, 2, 20)] == [1, 3, 39]
    assert store_bytes_per_token(4, 20) == 39 * 16 * 4
    assert store_bytes_per_token(8, MAX_REPEAT) <= 128 * 1024 < store_bytes_per_token(8, MAX_REPEAT + 1)


def test_mhc_sinkhorn_ascend_rows_are_32_byte_aligned():
    assert [make_config('ascend', 'fwd', m, 1).row_words for m in range(1, 9)] == [8, 8, 16, 16, 32, 40, 56, 64]


def test_mhc_sinkhorn_config_rejects_what_the_contract_refuses():
    for backend in ('ascend', 'cuda'):
        with pytest.raises(ValueError, match=r'mhc_mult must be in 1\.\.8, got 9'):
            make_config(backend, 'fwd', 9, 3)
        with pytest.raises(ValueError, match='repeat 0 is out of range'):
            make_config(backend, 'fwd', 4, 0)
        with pytest.raises(ValueError, match='direction must be one of'):
            choose_mhc_sinkhorn_config(backend=backend, num_cores=8, direction='both', mhc_mult=4, repeat=3)


def test_mhc_sinkhorn_bwd_config_fits_the_store():
    """Tokens per block shrink as the store per token grows, down to one token at MAX_REPEAT and mhc_mult 8;
    the forward's blocks do not depend on repeat."""
    for backend in ('ascend', 'cuda'):
        small, middle, largest = (make_config(backend, 'bwd', m, r) for m, r in ((2, 1), (8, 20), (8, MAX_REPEAT)))
        assert make_config(backend, 'fwd', 2, 1).tokens == make_config(backend, 'fwd', 8, 10**6).tokens
        assert small.tokens > middle.tokens > largest.tokens == 1
        with pytest.raises(ValueError, match='repeat 257 is out of range for the bwd kernel'):
            make_config(backend, 'bwd', 4, MAX_REPEAT + 1)
        with pytest.raises(ValueError, match='2 tokens of the backward overflow its 131072 B store'):
            MhcSinkhornConfig(backend, 'bwd', 8, MAX_REPEAT, 8, 2, 1)


def test_mhc_sinkhorn_reciprocal_is_a_cuda_choice():
    """CUDA takes the Newton reciprocal and 16-token blocks in both directions (measured faster, the same bits as
    IEEE division there; the backward fewer tokens where its store needs it); Ascend the IEEE division."""
    for direction in ('fwd', 'bwd'):
        cfg = make_config('cuda', direction, 4, 3)
        assert (cfg.reciprocal, cfg.tokens) == ('newton', 16)
    assert make_config('cuda', 'bwd', 8, 20).tokens == 8
    assert make_config('ascend', 'fwd', 4, 3).reciprocal == make_config('ascend', 'bwd', 4, 3).reciprocal == 'ieee'
    dataclasses.replace(make_config('cuda', 'bwd', 4, 3), reciprocal='ieee')
    with pytest.raises(ValueError, match=r"reciprocal must be one of \('ieee',\) on ascend"):
        dataclasses.replace(make_config('ascend', 'fwd', 4, 3), reciprocal='newton')
    with pytest.raises(ValueError, match='reciprocal must be one of'):
        dataclasses.replace(make_config('cuda', 'fwd', 4, 3), reciprocal='fast')


# (mhc_mult, repeat, tokens) of the CUDA reciprocals' device check: from level 1 (level 0 compiles only what calls
# launch; the Newton reciprocal is the CUDA default, which the operators' tests check there).
RECIPROCAL_CASES = by_level(get_test_level(), core=[], default=[(4, 20, 130), (8, 3, 33), (1, 2, 65)])


def _cuda_config(direction, mhc_mult, repeat, reciprocal):
    return dataclasses.replace(make_config('cuda', direction, mhc_mult, repeat), reciprocal=reciprocal)


@pytest.mark.parametrize('direction', ['fwd', 'bwd'])
def test_mhc_sinkhorn_newton_reciprocal_lowers_without_division(direction):
    """The Newton configuration's steps take __fdividef's reciprocal, refined by fused multiply-adds; no IEEE
    division is left (the IEEE configuration divides once per row)."""
    name = f'mhc_sinkhorn_{direction}_kernel'
    sources = {}
    for reciprocal in ('ieee', 'newton'):
        cfg = dataclasses.replace(make_config('cuda', direction, 4, 3), reciprocal=reciprocal)
        lowered = assert_cuda_kernel_lowers(lambda cfg=cfg: make_mhc_sinkhorn_kernel(cfg), key=cfg, kernel_name=name)
        sources[reciprocal] = re.sub(r'/\*.*?\*/', '', lowered.source)  # no comments: '/' is a division
    division = re.compile(r'[)\w] / [(\w]')
    assert division.search(sources['ieee'])
    assert not division.search(sources['newton'])
    assert '__fdividef(' in sources['newton']
    assert '__fmaf_rn(' in sources['newton']


@pytest.mark.npu
@pytest.mark.parametrize('reciprocal', ['ieee', 'newton'])
@pytest.mark.parametrize(('mhc_mult', 'repeat', 'tokens'), RECIPROCAL_CASES)
def test_mhc_sinkhorn_cuda_reciprocal_values(mhc_mult, repeat, tokens, reciprocal, device):
    """The CUDA kernels with either reciprocal against the float64 references (the operators' tolerance)."""
    if device.type != 'cuda':
        pytest.skip('the reciprocal is a CUDA configuration')
    mm = mhc_mult * mhc_mult
    x = random_logits((tokens, mhc_mult, mhc_mult), device)
    grad_output = torch.randn_like(x)
    out, grad_input = torch.full_like(x, float('nan')), torch.full_like(x, float('nan'))
    Launcher(get_mhc_sinkhorn_kernel, _cuda_config('fwd', mhc_mult, repeat, reciprocal), device).launch(
        x.view(tokens, mm), out.view(tokens, mm), EPS
    )
    Launcher(get_mhc_sinkhorn_kernel, _cuda_config('bwd', mhc_mult, repeat, reciprocal), device).launch(
        grad_output.view(tokens, mm), x.view(tokens, mm), grad_input.view(tokens, mm), EPS
    )
    assert_close(out.cpu().double(), mhc_sinkhorn_fwd_ref(x.cpu().double(), repeat, EPS), atol=ATOL, rtol=RTOL)
    expected = mhc_sinkhorn_bwd_ref(grad_output.cpu(), x.cpu(), repeat, EPS)
    assert_close(grad_input.cpu().double(), expected, atol=ATOL, rtol=RTOL)
