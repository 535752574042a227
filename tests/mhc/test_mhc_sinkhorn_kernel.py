"""Tests of mhc_sinkhorn_kernel.py's configuration: the chooser is pure and hashable, refuses what the operators'
contract refuses, and sizes the backward's blocks to its on-chip store."""

import dataclasses

import pytest

from cann_ops_tilelang.mhc.mhc_sinkhorn_kernel import (
    MAX_REPEAT,
    MhcSinkhornConfig,
    choose_mhc_sinkhorn_config,
    steps,
    store_bytes_per_token,
)

from .sinkhorn_cases import make_config


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
        small, peer, largest = (make_config(backend, 'bwd', m, r) for m, r in ((2, 1), (4, 20), (8, MAX_REPEAT)))
        assert small.tokens == make_config(backend, 'fwd', 2, 1).tokens == make_config(backend, 'fwd', 8, 10**6).tokens
        assert small.tokens > peer.tokens > largest.tokens == 1
        with pytest.raises(ValueError, match='repeat 257 is out of range for the bwd kernel'):
            make_config(backend, 'bwd', 4, MAX_REPEAT + 1)
        with pytest.raises(ValueError, match='2 tokens of the backward overflow its 131072 B store'):
            MhcSinkhornConfig(backend, 'bwd', 8, MAX_REPEAT, 8, 2, 1)
