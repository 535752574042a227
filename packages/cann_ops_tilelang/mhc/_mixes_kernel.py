"""Kernels of the mix operators (mhc_head_compute_mix_fwd/_bwd, mhc_pre_split_mixes_fwd/_bwd): one family, one
configuration, five kernel kinds.

A token's mix row has `width` fp32 logits: M for the head mix, M pre, M post and M * M comb logits for the
split mixes (M = mhc_mult, 1 .. 8). Per logit, with the shared scale of its segment and its column's base:

    z = x * scale[segment] + base[column]
    pre = sigmoid(z) + eps,   post = sigmoid(z) * post_mult,   comb = z,   head = sigmoid(z) + eps

Kinds:
- 'head_fwd', 'split_fwd': one pass over tiles of `token_block` tokens (Ascend: a persistent loop over the
  vector cores; CUDA: one thread block per tile).
- 'head_bwd', 'split_bwd': dL/dz per logit, the input gradient dL/dz * scale, and per worker the partial sums
  of dL/dz (per column: the base gradient) and of dL/dz * x (per segment: the scale gradient). Worker w of
  `num_partials` takes the tiles w, w + P, w + 2P, ... in order, and each backend adds in a fixed order (its
  body says which): no atomics, the same bits on every run.
- 'split_reduce': the second pass of the split backward, sum over the P partial rows in row order.

Runtime sizes (tokens) are `T.dynamic`: one compile per configuration.
"""

import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._mixes_ascend import ascend_mhc_mixes_kernel
from ._mixes_common import MAX_MHC_MULT, MAX_PARTIALS, MAX_TOKEN_BLOCK, split_width
from ._mixes_cuda import cuda_mhc_mixes_kernel

KINDS = ('head_fwd', 'head_bwd', 'split_fwd', 'split_bwd', 'split_reduce')
_ASCEND_TOKEN_BLOCK = 64  # tokens per UB tile: a comb tile of 64 rows of 64 fp32 lanes is 16 KB
_ASCEND_MIN_TOKEN_BLOCK = 8  # a 64-lane register holds 8 rows of a pre / post tile: tiles are whole registers
_CUDA_TOKEN_BLOCK = 32  # tokens per thread block: 4001 tokens fill 126 blocks of the H200's 132 SMs
_CUDA_THREADS = 128
_ASCEND_SIMT_THREADS = 256  # the reduce's SIMT vector function
_ASCEND_REDUCE_PARTIAL_BYTES = 64 * 1024  # the reduce kernel holds all partial rows in UB


@dataclasses.dataclass(frozen=True)
class MhcMixesConfig:
    backend: Backend
    kind: str  # one of KINDS
    mhc_mult: int  # M
    num_cores: int  # Ascend: vector cores (the forward's persistent grid); CUDA: SMs (informational)
    token_block: int  # tokens per tile (unused by 'split_reduce')
    num_partials: int  # backward and reduce: partial rows, one per worker (0 for the forward kinds)
    threads: int  # CUDA threads per block / Ascend SIMT threads of the reduce
    num_stages: int  # Ascend buffer versions of the forward's persistent loop (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.kind not in KINDS:
            raise ValueError(f'kind must be one of {KINDS}, got {self.kind!r}')
        if not 1 <= self.mhc_mult <= MAX_MHC_MULT:
            raise ValueError(f'mhc_mult must be in [1, {MAX_MHC_MULT}], got {self.mhc_mult}')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        tb = self.token_block
        if not 1 <= tb <= MAX_TOKEN_BLOCK or tb & (tb - 1):
            raise ValueError(f'token_block must be a power of two in [1, {MAX_TOKEN_BLOCK}], got {tb}')
        backward = self.kind in ('head_bwd', 'split_bwd', 'split_reduce')
        if backward != (1 <= self.num_partials <= MAX_PARTIALS):
            raise ValueError(f'num_partials must be in [1, {MAX_PARTIALS}] exactly for the backward kinds, got {self}')
        if self.backend == 'ascend' and tb < _ASCEND_MIN_TOKEN_BLOCK:
            raise ValueError(f'Ascend: token_block must be >= {_ASCEND_MIN_TOKEN_BLOCK}, got {tb}')
        if self.backend == 'cuda' and self.width + 3 > self.threads:
            raise ValueError(f'CUDA: a thread per column and scale: {self.width + 3} threads, got {self.threads}')
        reduce_bytes = self.num_partials * (self.width + 3) * 4
        if self.kind == 'split_reduce' and self.backend == 'ascend' and reduce_bytes > _ASCEND_REDUCE_PARTIAL_BYTES:
            raise ValueError(f'Ascend reduce: {self.num_partials} partial rows do not fit UB')

    @property
    def split(self) -> bool:
        """The split mixes (pre, post, comb segments) rather than the head mix (one segment)."""
        return self.kind.startswith('split')

    @property
    def width(self) -> int:
        """fp32 logits of a token's input row."""
        return split_width(self.mhc_mult) if self.split else self.mhc_mult

    @property
    def num_scales(self) -> int:
        """Entries of mhc_scale: one per segment."""
        return 3 if self.split else 1


def choose_mhc_mixes_config(
    *, backend: Backend, num_cores: int, kind: str, mhc_mult: int, token_block_size: int = 0, num_partials: int = 0
) -> MhcMixesConfig:
    """Pure choice of the compile-time parameters (no device query). token_block_size 0: the backend's default
    (Ascend takes at least 8 tokens per tile);
    num_partials: the backward's worker count (mhc_head_compute_mix_bwd: num_sms; 0 for the split backward and
    its reduce: one worker per core)."""
    if kind in ('split_bwd', 'split_reduce') and num_partials == 0:
        num_partials = num_cores
    if token_block_size == 0:
        token_block_size = _ASCEND_TOKEN_BLOCK if backend == 'ascend' else _CUDA_TOKEN_BLOCK
    elif backend == 'ascend':
        token_block_size = max(token_block_size, _ASCEND_MIN_TOKEN_BLOCK)
    threads = _ASCEND_SIMT_THREADS if backend == 'ascend' else _CUDA_THREADS
    forward = kind in ('head_fwd', 'split_fwd')
    num_stages = 2 if backend == 'ascend' and forward else 1
    return MhcMixesConfig(backend, kind, mhc_mult, num_cores, token_block_size, num_partials, threads, num_stages)


def make_mhc_mixes_kernel(cfg: MhcMixesConfig):
    """The TileLang prim_func `mhc_<kind>_kernel` for `cfg.backend` (no compile)."""
    if cfg.backend == 'ascend':
        return ascend_mhc_mixes_kernel(cfg)
    return cuda_mhc_mixes_kernel(cfg)


@functools.cache
def get_mhc_mixes_kernel(cfg: MhcMixesConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_mixes_kernel(cfg), cfg.backend)
