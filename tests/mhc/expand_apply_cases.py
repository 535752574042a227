"""Parameter sets, inputs and kernel configurations the tests of the streaming mHC operators share
(mhc_expand_fwd/_bwd, mhc_pre_apply_mix_fwd/_bwd and their kernel modules)."""

import torch

from cann_ops_tilelang.mhc.mhc_expand_kernel import choose_mhc_expand_config
from cann_ops_tilelang.mhc.mhc_pre_apply_mix_kernel import choose_mhc_pre_apply_mix_config
from tests.testing.generator import by_level, generate_samples, get_test_level
from tests.testing.lowering import ASCEND_950_VECTOR_CORES, H200_SMS

# (mhc_mult, hidden): one kernel configuration each. Level 0: the peer's mhc_mult 4 on a small row, and the
# widest mhc_mult on a row that the Ascend backward of pre_apply_mix walks in two hidden blocks. Level 1: every
# other mhc_mult (the peer's Ascend kernels take 4 only), with the smallest hidden, odd multiples of 64 and the
# peer's sizes; level 2: the peer's sizes with mhc_mult 4, and the widest row.
SIZES = by_level(
    get_test_level(),
    core=[(4, 256), (8, 4096)],
    default=[(1, 64), (2, 192), (3, 1088), (5, 2560), (6, 7168), (7, 5120)],
    full=[(4, 2560), (4, 4096), (4, 7168), (8, 16384)],
)
PARAMS = generate_samples(sizes=SIZES)
# Token counts of a values test (dynamic: no compile of their own): one token, and a count that no tile size
# divides (the last CUDA token tile is partial, the Ascend cores get unequal shares).
NUM_TOKENS = (1, 67)
# The peer's benchmark shapes: tokens 4001 / 8001, hidden 2560 .. 7168, mhc_mult 4.
BENCHMARK_PARAMS = generate_samples(num_tokens=[4001, 8001], hidden=[2560, 4096, 7168], mhc=[4])


def num_cores(backend: str) -> int:
    """The Ascend 950's vector cores or the H200's SMs: what the chooser gets on those devices."""
    return ASCEND_950_VECTOR_CORES if backend == 'ascend' else H200_SMS


def expand_config(backend: str, direction: str, mhc: int, hidden: int, cores: int | None = None):
    """The configuration the chooser gives for `cores` (default: the Ascend 950's or the H200's)."""
    cores = num_cores(backend) if cores is None else cores
    return choose_mhc_expand_config(backend=backend, num_cores=cores, direction=direction, mhc=mhc, hidden=hidden)


def pre_apply_mix_config(backend: str, direction: str, mhc: int, hidden: int, cores: int | None = None):
    """The configuration the chooser gives for `cores` (default: the Ascend 950's or the H200's)."""
    cores = num_cores(backend) if cores is None else cores
    return choose_mhc_pre_apply_mix_config(
        backend=backend, num_cores=cores, direction=direction, mhc=mhc, hidden=hidden
    )


def bf16(*shape: int, device) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float32, device=device).bfloat16()


def mix(num_tokens: int, mhc: int, device) -> torch.Tensor:
    """A pre-layer mix as mhc_pre_split_mixes makes it: sigmoid + eps, in (0, 1 + eps)."""
    return torch.rand(num_tokens, mhc, dtype=torch.float32, device=device)


def poisoned(*shape: int, device) -> torch.Tensor:
    """A bf16 output buffer full of NaN: an element a kernel does not write stays NaN."""
    return torch.full(shape, float('nan'), dtype=torch.bfloat16, device=device)


def assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, label: str) -> None:
    """|actual - expected| <= bound element-wise (float64; NaN never passes), with the worst element named."""
    excess = (actual.double().cpu() - expected.cpu()).abs() - bound.cpu()
    assert not excess.isnan().any(), f'{label}: NaN'
    worst = int(excess.argmax()) if excess.numel() else 0
    assert excess.numel() == 0 or excess.max() <= 0, (
        f'{label}: |actual - expected| exceeds its bound by {excess.max().item():.3g} at flat index {worst}'
    )
