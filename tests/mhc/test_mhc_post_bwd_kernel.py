"""Tests of mhc_post_bwd's CUDA kernel configuration (mhc_post_bwd_kernel.py): CPU tier. The chooser's register
cap and cp.async pipeline, the checks of both fields, and that each form lowers as configured (values:
test_mhc_post_bwd.py)."""

import dataclasses

import pytest

from cann_ops_tilelang.mhc.mhc_post_bwd_kernel import (
    CUDA_CAPPED_MAX_MHC,
    CUDA_PIPELINE_STAGES,
    CUDA_RESIDENT_THREADS,
    choose_mhc_post_bwd_config,
    make_mhc_post_bwd_kernel,
)
from tests.testing.lowering import H200_SMS, assert_cuda_kernel_lowers

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
