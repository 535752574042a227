"""Parameter sets shared by the tests of the norm_fn family (mhc_fn_normw_merge_*, mhc_reduce_partials_and_rmsnorm_*).

Each distinct (mhc_mult3, hidden) of the merges and (mhc_mult3, groups[, n_splits]) of the reductions is a kernel
configuration: level 0 holds two of each (one compile per configuration and backend), level 1 every mhc_mult
from 1 to 8, level 2 the production sizes. Token counts are runtime sizes and vary freely within a level.
"""

from tests.testing.generator import by_level

MHC_MULTS = tuple(range(1, 9))
BENCHMARK_MHC_MULT = 4  # the peer's
BENCHMARK_HIDDEN = (2560, 4096, 7168)
BENCHMARK_TOKENS = (4001, 8001)
BENCHMARK_SPLITS = 16  # the peer's split-K default of the fused pre path


def mhc_mult3(mhc_mult: int) -> int:
    """Rows of the mix projection: mhc_mult pre + mhc_mult post + mhc_mult**2 residual mixes."""
    return mhc_mult * (mhc_mult + 2)


def fn_shapes(level: int) -> list[dict]:
    """(M3, K) of fn: K = mhc_mult * hidden."""
    core = [{'m3': 3, 'k': 192}, {'m3': 24, 'k': 512}]
    default = [{'m3': mhc_mult3(m), 'k': 64 * m} for m in MHC_MULTS] + [{'m3': 24, 'k': 4 * 2560}]
    full = [{'m3': 24, 'k': 4 * h} for h in BENCHMARK_HIDDEN] + [{'m3': 80, 'k': 8 * 7168}]
    return by_level(level, core, default, full)


def reduce_fwd_shapes(level: int) -> list[dict]:
    """(n_splits, tokens, groups, M3) of the partials: tokens 0, 1, a tail of every task size."""
    core = [
        {'n_splits': 16, 'tokens': 130, 'groups': 1, 'm3': 24},
        {'n_splits': 16, 'tokens': 1, 'groups': 1, 'm3': 24},
        {'n_splits': 3, 'tokens': 9, 'groups': 2, 'm3': 35},
    ]
    default = [{'n_splits': 2, 'tokens': 257, 'groups': 1, 'm3': mhc_mult3(m)} for m in MHC_MULTS] + [
        {'n_splits': 1, 'tokens': 70, 'groups': 16, 'm3': 80},
        {'n_splits': 5, 'tokens': 1000, 'groups': 4, 'm3': 8},
    ]
    full = [{'n_splits': 16, 'tokens': t, 'groups': 1, 'm3': 24} for t in BENCHMARK_TOKENS]
    return by_level(level, core, default, full)


def reduce_bwd_shapes(level: int) -> list[dict]:
    """(tokens, groups, M3) of the RMS step's backward."""
    core = [
        {'tokens': 130, 'groups': 1, 'm3': 24},
        {'tokens': 1, 'groups': 1, 'm3': 24},
        {'tokens': 9, 'groups': 2, 'm3': 35},
    ]
    default = [{'tokens': 257, 'groups': 1, 'm3': mhc_mult3(m)} for m in MHC_MULTS] + [
        {'tokens': 70, 'groups': 16, 'm3': 80},
        {'tokens': 1000, 'groups': 4, 'm3': 8},
    ]
    full = [{'tokens': t, 'groups': 1, 'm3': 24} for t in BENCHMARK_TOKENS]
    return by_level(level, core, default, full)
