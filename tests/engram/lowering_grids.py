"""Parameter grids of the Engram lowering tests that tests/engram/lowered_sources.py lowers too: one home for
both (this module imports no operator interface, as lowered_sources must not)."""

from __future__ import annotations


def gen_hash_configs(level: int) -> list[dict]:
    """(L, N, E): the compile-time sizes. Core: the Engram setting and the minimum; full: the maxima."""
    core = [dict(num_layers=2, max_ngram=3, num_tables=8), dict(num_layers=1, max_ngram=2, num_tables=1)]
    default = [dict(num_layers=1, max_ngram=3, num_tables=5), dict(num_layers=3, max_ngram=4, num_tables=2)]
    full = [dict(num_layers=32, max_ngram=16, num_tables=17), dict(num_layers=2, max_ngram=2, num_tables=256)]
    return core + (default if level >= 1 else []) + (full if level >= 2 else [])


def gen_sinkhorn_head_dim(level: int) -> list[int]:
    """head_dim (multiples of 64 up to 8192): minimum, the benchmark sizes, widths whose chunks do not fill
    the CUDA row groups (192, 1088), one of each CUDA row layout (512: two rows in flight per warp; 1024:
    several multi-warp row groups per block), the maximum."""
    core = [64, 256]
    default = [192, 512, 1024, 1088, 5120]
    full = [128, 4096, 8192]
    return list(dict.fromkeys(core + (default if level >= 1 else []) + (full if level >= 2 else [])))


# Variants the chooser does not pick by default (the H200 sweep tries them): several rows in flight with
# and without prefetch, groups of a whole warp or of 8 threads per row, row groups wider than a warp with
# several groups per block (barriers, `guard`).
STEP_CUDA_VARIANTS = [
    {'head_dim': 256, 'group_threads': 32, 'chunks': 2, 'rows_per_task': 8, 'rows_in_flight': 8, 'num_stages': 1},
    {'head_dim': 256, 'group_threads': 8, 'chunks': 8, 'rows_per_task': 16, 'rows_in_flight': 3, 'num_stages': 1},
    {'head_dim': 256, 'rows_per_task': 16, 'rows_in_flight': 1, 'num_stages': 2},
    {'head_dim': 256, 'rows_per_task': 16, 'rows_in_flight': 2, 'num_stages': 1},
    {'head_dim': 256, 'rows_per_task': 8, 'rows_in_flight': 8, 'num_stages': 1},
    {'head_dim': 256, 'rows_per_task': 12, 'rows_in_flight': 2, 'num_stages': 2},
    {'head_dim': 1088, 'rows_per_task': 4, 'rows_in_flight': 2, 'num_stages': 2},
    {'head_dim': 5120, 'rows_per_task': 1, 'rows_in_flight': 2, 'num_stages': 1},
]


# Variants the chooser does not pick by default (the H200 sweep tries them): one or several rows per
# group, several groups wider than a warp per block (the barrier outside the row conditions, `guard`).
FINALIZE_CUDA_VARIANTS = [
    {'head_dim': 256, 'group_threads': 32, 'chunks': 2, 'rows_per_task': 8, 'rows_in_flight': 2},
    {'head_dim': 256, 'rows_per_task': 8, 'rows_in_flight': 2},
    {'head_dim': 256, 'rows_per_task': 4, 'rows_in_flight': 4},
    {'head_dim': 1088, 'rows_per_task': 4, 'rows_in_flight': 2},
    {'head_dim': 5120, 'rows_per_task': 2, 'rows_in_flight': 2},
]


# engram_gate_bwd on CUDA beyond one resident CTA per token (16384: _contract.MAX_HIDDEN). Split over a cluster
# of 2 CTAs: the weight slice in shared memory, and read through L2.
GATE_BWD_CLUSTER_CUDA_SHAPES = [{'hc': 4, 'hidden': 8256}, {'hc': 4, 'hidden': 16384}]
# Wider than a split plan fits: the chunked variant (grad_out read twice).
GATE_BWD_CHUNKED_CUDA_SHAPES = [{'hc': 8, 'hidden': 16384}, {'hc': 5, 'hidden': 12288}]
