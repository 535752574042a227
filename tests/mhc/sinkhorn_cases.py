"""Parameter sets and inputs shared by the tests of mhc_sinkhorn_fwd and mhc_sinkhorn_bwd.

A configuration is compiled per (direction, mhc_mult, repeat): level 0 holds four of them, each at several
token counts (0, one, a block tail, two blocks and leading dimensions), so every configuration compiles once.
"""

import torch

from cann_ops_tilelang.mhc.mhc_sinkhorn_kernel import choose_mhc_sinkhorn_config
from tests.testing.generator import by_level
from tests.testing.lowering import ASCEND_950_VECTOR_CORES, H200_SMS

EPS = 1e-6  # the peer's default in its reference
# fp32 kernels against the float64 reference: a few roundings per step, 2 * repeat - 1 steps; values are in [0, 1]
# (forward) and O(1) (backward, for randn logits and gradients).
ATOL, RTOL = 1e-5, 1e-4


def _cases(mhc_mult, repeat, *leading_shapes):
    return [{'mhc_mult': mhc_mult, 'repeat': repeat, 'shape': (*lead, mhc_mult, mhc_mult)} for lead in leading_shapes]


def gen_cases(level: int) -> list[dict]:
    """(mhc_mult, repeat, shape): the extremes of mhc_mult, repeat 1, the peer's mhc_mult 4; from level 1 every
    mhc_mult and the peer's repeats; at level 2 the peer's token counts."""
    core = [
        *_cases(4, 3, (1,), (130,), (2, 65)),
        *_cases(3, 1, (7,), (64,)),
        *_cases(8, 2, (5,), (129,)),
        *_cases(1, 2, (3,), (66,)),
    ]
    default = [
        *_cases(2, 10, (257,)),
        *_cases(5, 4, (100,)),
        *_cases(6, 7, (3, 11)),
        *_cases(7, 2, (65,)),
        *_cases(4, 20, (1000,)),
        *_cases(8, 20, (33,)),
    ]
    full = [*_cases(4, 10, (4001,)), *_cases(4, 20, (8001,)), *_cases(8, 64, (513,))]
    return by_level(level, core, default, full)


def make_config(backend: str, direction: str, mhc_mult: int, repeat: int):
    """The config the operator would choose on an Ascend 950 (64 vector cores) or an H200 (132 SMs)."""
    num_cores = ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS
    return choose_mhc_sinkhorn_config(
        backend=backend, num_cores=num_cores, direction=direction, mhc_mult=mhc_mult, repeat=repeat
    )


def distinct_configs(cases: list[dict]) -> list[dict]:
    """One case per (mhc_mult, repeat): the lowering tests need each configuration once."""
    seen, chosen = set(), []
    for case in cases:
        if (case['mhc_mult'], case['repeat']) not in seen:
            seen.add((case['mhc_mult'], case['repeat']))
            chosen.append({'mhc_mult': case['mhc_mult'], 'repeat': case['repeat']})
    return chosen


def random_logits(shape, device) -> torch.Tensor:
    """Logits of the spread a residual mix has (randn times 2: rows far from uniform)."""
    return torch.randn(shape, dtype=torch.float32, device=device) * 2
