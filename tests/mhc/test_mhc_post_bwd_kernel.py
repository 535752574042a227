"""Tests of mhc_post_bwd's CUDA kernel configuration (mhc_post_bwd_kernel.py): CPU tier. The chooser's register
cap and cp.async pipeline, the checks of both fields, and that each form lowers as configured (values:
test_mhc_post_bwd.py); on a CUDA GPU (`npu`, level 1) the schedule variants against the chosen one."""

import dataclasses

import pytest
import torch

from cann_ops_tilelang.kernel_target import Launcher
from cann_ops_tilelang.mhc.mhc_post_bwd_kernel import (
    CUDA_CAPPED_MAX_MHC,
    CUDA_PIPELINE_STAGES,
    CUDA_RESIDENT_THREADS,
    choose_mhc_post_bwd_config,
    get_mhc_post_bwd_kernel,
    make_mhc_post_bwd_kernel,
)
from tests.testing.generator import by_level, get_test_level
from tests.testing.lowering import H200_SMS, assert_cuda_kernel_lowers

from .mhc_post_inputs import post_inputs

KERNEL_NAME = 'mhc_post_bwd_kernel'


def cuda_config(mhc: int, hidden: int):
    return choose_mhc_post_bwd_config(backend='cuda', mhc=mhc, hidden=hidden, num_cores=H200_SMS)


@pytest.mark.parametrize('mhc', [1, 4, 5, 8])
@pytest.mark.parametrize('hidden', [64, 2560, 7168, 8256])
def test_mhc_post_bwd_cuda_choice(mhc, hidden):
    """The register cap up to CUDA_CAPPED_MAX_MHC; the pipeline where the threads tile the row exactly."""
    cfg = cuda_config(mhc, hidden)
    expected_cap = CUDA_RESIDENT_THREADS // cfg.threads if mhc <= CUDA_CAPPED_MAX_MHC else 0
    assert cfg.min_blocks == expected_cap
    exact = cfg.threads * cfg.chunks * 8 == hidden
    assert cfg.pipelined == (CUDA_PIPELINE_STAGES if exact else 0)
    # 64: 8 chunks on 64 threads; 8256: 1032 chunks on 160 threads (some threads' last chunk past the row).
    assert exact == (hidden not in (64, 8256))


@pytest.mark.parametrize(
    ('change', 'match'),
    [
        ({'min_blocks': -1}, 'min_blocks'),
        ({'min_blocks': 17}, 'min_blocks'),
        ({'pipelined': 1}, 'pipeline'),
        ({'chunks': 8}, 'pipeline'),  # 128 * 8 * 8 > 7168: a chunk past the row
    ],
)
def test_mhc_post_bwd_cuda_config_rejects(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(cuda_config(4, 7168), **change)


@pytest.mark.parametrize(('stages', 'min_blocks'), [(0, 0), (0, 4), (3, 4), (2, 0)])
def test_mhc_post_bwd_cuda_forms_lower(stages, min_blocks):
    """Registers only or the cp.async pipeline, with or without the register cap."""
    cfg = dataclasses.replace(cuda_config(4, 7168), pipelined=stages, min_blocks=min_blocks)
    lowered = assert_cuda_kernel_lowers(lambda: make_mhc_post_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert ('cp_async' in lowered.source) == bool(stages)
    assert f'__launch_bounds__(128, {max(1, min_blocks)})' in lowered.source
    assert 'atomic' not in lowered.source.lower()


# The schedules that the device experiment of issue #33 times against the chosen one (ring depth, register cap,
# TileKernels' 64-thread width): name -> the config's changes. The arithmetic per chunk and the order of the
# partial sums' reduction depend on neither the ring nor the cap; the 64-thread width changes which thread holds
# a chunk and so the mix gradients' summation order: only d_x and d_residual must then keep the bits.
POST_VARIANTS = {
    'ring2_nocap': lambda cfg: {'pipelined': 2, 'min_blocks': 0},
    'ring3_nocap': lambda cfg: {'min_blocks': 0},
    'ring4_nocap': lambda cfg: {'pipelined': 4, 'min_blocks': 0},
    't64': lambda cfg: {'threads': 64, 'chunks': cfg.hidden // 512, 'min_blocks': CUDA_RESIDENT_THREADS // 64},
    't64_nocap': lambda cfg: {'threads': 64, 'chunks': cfg.hidden // 512, 'min_blocks': 0},
}


def post_variant(name, mhc, hidden):
    cfg = cuda_config(mhc, hidden)
    return dataclasses.replace(cfg, **POST_VARIANTS[name](cfg))


@pytest.mark.parametrize('name', list(POST_VARIANTS))
def test_mhc_post_bwd_cuda_variants_lower(name):
    cfg = post_variant(name, 4, 7168)
    lowered = assert_cuda_kernel_lowers(lambda: make_mhc_post_bwd_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME)
    assert 'cp_async' in lowered.source
    assert f'__launch_bounds__({cfg.threads}, {max(1, cfg.min_blocks)})' in lowered.source


# Level 1: (mhc_mult, hidden) of the device check (TileKernels' width differs from the chosen one at 7168).
VARIANT_SIZES = by_level(get_test_level(), core=[], default=[(4, 7168), (4, 2560)])


@pytest.mark.npu
@pytest.mark.parametrize('name', list(POST_VARIANTS))
@pytest.mark.parametrize('sizes', VARIANT_SIZES, ids=lambda s: f'mhc{s[0]}-h{s[1]}')
def test_mhc_post_bwd_cuda_variants_values(sizes, name, device):
    """d_x and d_residual equal the chosen schedule's bit for bit; the mix gradients too where the threads are
    the chosen ones (the same summation order)."""
    if device.type != 'cuda':
        pytest.skip('the schedule variants are CUDA configurations')
    mhc, hidden = sizes
    num_tokens = 67
    x, residual, post, comb, d_o = post_inputs((1, num_tokens), mhc, hidden, device, d_o=True)
    inputs = (x[0], residual[0], post[0, :, :, 0].contiguous(), comb[0], d_o[0])
    default = cuda_config(mhc, hidden)
    variant = post_variant(name, mhc, hidden)
    results = []
    for cfg in (default, variant):
        outs = (
            torch.full_like(x[0], float('nan')), torch.full_like(residual[0], float('nan')),
            torch.full((num_tokens, mhc), float('nan'), device=device),
            torch.full((num_tokens, mhc, mhc), float('nan'), device=device),
        )  # fmt: skip
        Launcher(get_mhc_post_bwd_kernel, cfg, device).launch(*inputs, *outs)
        results.append(outs)
    compared = 4 if variant.threads == default.threads else 2
    for ours, chosen in zip(results[1][:compared], results[0][:compared], strict=True):
        assert not chosen.isnan().any()
        assert torch.equal(ours, chosen)
    if compared == 2:  # another summation order: equal up to fp32 rounding
        for ours, chosen in zip(results[1][2:], results[0][2:], strict=True):
            torch.testing.assert_close(ours, chosen, rtol=1e-4, atol=1e-3)
