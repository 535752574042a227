"""batched_transpose_weight_sf's kernels: the configuration and task split (CPU), lowering for both backends (CPU
tier), and the kernel called directly against the exact reference (device tier: an accelerator, or the Ascend
kernel on the emulator with --ascend-emulator)."""

from __future__ import annotations

import pytest
import torch

from cann_ops_tilelang.config import backend_of, get_num_cores
from cann_ops_tilelang.kernel_target import launch_kernel
from cann_ops_tilelang.quant.batched_transpose_weight_sf_kernel import (
    BLOCK_SIZES,
    CHUNK_WORDS,
    WEIGHT_FIELDS,
    BatchedTransposeWeightSfConfig,
    choose_batched_transpose_weight_sf_config,
    chunk_cols,
    get_batched_transpose_weight_sf_kernel,
    make_batched_transpose_weight_sf_kernel,
    tasks_per_group,
)
from tests.quant.batched_transpose_weight_sf_ref import power_of_two_scales, transpose_weight_sf_ref
from tests.testing.lowering import (
    ASCEND_950_VECTOR_CORES,
    H200_SMS,
    assert_ascend_kernel_lowers,
    assert_cuda_kernel_lowers,
)

KERNEL_NAME = 'batched_transpose_weight_sf_kernel'


# ---------------------------------------------------------------- CPU: configuration


@pytest.mark.parametrize('backend', ['ascend', 'cuda'])
@pytest.mark.parametrize('block_size', BLOCK_SIZES)
def test_config_choice(backend, block_size):
    cfg = choose_batched_transpose_weight_sf_config(backend=backend, num_cores=7, block_size=block_size)
    assert (cfg.backend, cfg.block_size, cfg.num_cores) == (backend, block_size, 7)
    assert cfg.num_stages == (2 if backend == 'ascend' else 1)
    assert cfg.chunk_cols * block_size == CHUNK_WORDS
    assert cfg.chunk_cols % 4 == 0  # whole sf0 words per task


def test_config_rejects():
    with pytest.raises(ValueError, match='block_size'):
        choose_batched_transpose_weight_sf_config(backend='cuda', num_cores=1, block_size=64)
    with pytest.raises(ValueError, match='backend'):
        choose_batched_transpose_weight_sf_config(backend='cpu', num_cores=1, block_size=32)
    with pytest.raises(ValueError, match='num_cores'):
        BatchedTransposeWeightSfConfig('ascend', 32, 0, 2)
    with pytest.raises(ValueError, match='num_stages'):
        BatchedTransposeWeightSfConfig('ascend', 32, 1, 0)


@pytest.mark.parametrize(
    ('block_size', 'sf_rows', 'sf_cols', 'tasks'),
    [
        (128, 56, 16, 14 * 1),  # 7168 x 2048: 14 quads of rows, one chunk of 32 columns
        (128, 16, 56, 4 * 2),  # 2048 x 7168: two chunks (32 + 24 columns)
        (32, 224, 64, 56 * 1),  # 7168 x 2048 in 32-blocks: chunks of 128 columns
        (32, 6, 129, 2 * 2),  # a quad of 2 rows and a chunk of one column at the ends
        (128, 1, 1, 1),
    ],
)
def test_tasks_per_group(block_size, sf_rows, sf_cols, tasks):
    assert chunk_cols(block_size) == CHUNK_WORDS // block_size
    assert tasks_per_group(block_size, sf_rows, sf_cols) == tasks


# ---------------------------------------------------------------- CPU tier: kernels lower


@pytest.mark.parametrize('block_size', BLOCK_SIZES)
def test_ascend_lowers(block_size):
    cfg = choose_batched_transpose_weight_sf_config(
        backend='ascend', num_cores=ASCEND_950_VECTOR_CORES, block_size=block_size
    )
    lowered = assert_ascend_kernel_lowers(
        lambda: make_batched_transpose_weight_sf_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert 'vsts_pack_quarter' in lowered.source  # sf0's words: one exponent byte per lane, packed
    assert 'vlds_brc' in lowered.source  # the broadcast of every word over its block


@pytest.mark.parametrize('block_size', BLOCK_SIZES)
def test_cuda_lowers(block_size):
    cfg = choose_batched_transpose_weight_sf_config(backend='cuda', num_cores=H200_SMS, block_size=block_size)
    lowered = assert_cuda_kernel_lowers(
        lambda: make_batched_transpose_weight_sf_kernel(cfg), key=cfg, kernel_name=KERNEL_NAME
    )
    assert '__syncthreads' in lowered.source  # one barrier: the exponent bytes staged in shared memory
    assert 'atomic' not in lowered.source  # every word written once


# ---------------------------------------------------------------- device tier: the kernel called directly


def _launch(cfg, sf_list, device):
    """The kernel on a batch laid out by hand (one weight table row per weight): returns the flat output."""
    rows, task_weight, num_sf, num_words, first_task = [], [], 0, 0, 0
    for i, s in enumerate(sf_list):
        groups, sf_rows, sf_cols = s.shape
        n, k = sf_rows * cfg.block_size, sf_cols * cfg.block_size
        sf0_words = groups * -(-sf_cols // 4) * n
        rows.append((first_task, groups, sf_rows, sf_cols, num_sf, num_words, num_words + sf0_words))
        tasks = groups * tasks_per_group(cfg.block_size, sf_rows, sf_cols)
        task_weight += [i] * tasks
        first_task += tasks
        num_sf += s.numel()
        num_words += sf0_words + groups * -(-sf_rows // 4) * k
    weights = torch.tensor(rows, dtype=torch.int32, device=device)
    assert weights.shape[1] == len(WEIGHT_FIELDS)
    # A poisoned output: every word must be written.
    out = torch.full((num_words,), -0x5A5A5A5B, dtype=torch.int32, device=device)
    sf_flat = torch.cat([s.reshape(-1) for s in sf_list]).to(device)
    task_map = torch.tensor(task_weight, dtype=torch.int32, device=device)
    launch_kernel(get_batched_transpose_weight_sf_kernel, cfg, device, sf_flat, weights, task_map, out)
    return out.cpu(), [r[5:] for r in rows]


@pytest.mark.npu
@pytest.mark.parametrize('block_size', BLOCK_SIZES)
def test_kernel_matches_reference(device, block_size):
    cfg = choose_batched_transpose_weight_sf_config(
        backend=backend_of(device), num_cores=get_num_cores(device), block_size=block_size
    )
    gen = torch.Generator().manual_seed(block_size)
    # Tails: a quad of 2 scale rows, a partial last column chunk, a padded sf0 word (128: 5 columns).
    shapes = [(1, 2 * 128 // block_size + 2, 5), (3, 4, chunk_cols(block_size) + 4)]
    sf_list = [power_of_two_scales(shape, gen) for shape in shapes]
    out, regions = _launch(cfg, sf_list, device)
    for s, (sf0_at, sf1_at) in zip(sf_list, regions, strict=True):
        sf0_ref, sf1_ref = transpose_weight_sf_ref(s, block_size, transpose_sf1=True)
        sf0 = out[sf0_at : sf0_at + sf0_ref.numel()].view(sf0_ref.shape[0], sf0_ref.shape[2], sf0_ref.shape[1])
        sf1 = out[sf1_at : sf1_at + sf1_ref.numel()].view(sf1_ref.shape)
        assert torch.equal(sf0.transpose(1, 2), sf0_ref)
        assert torch.equal(sf1, sf1_ref)
