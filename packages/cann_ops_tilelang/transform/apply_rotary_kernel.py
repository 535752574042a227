"""Kernels of apply_rotary: rotary position embedding of x (batch, seqlen, heads, rot_dim), in place.

Semantics (those of TileKernels 2.1.0's `apply_rotary`, and of tests/transform/apply_rotary_ref.py): token (b, s)
reads the fp32 row `row` of cos_sin_cache (seqlen_ro, rot_dim), cos in its first half, sin in its second:

    row = clamp(positions[b, s] + seqlen_offset, 0, seqlen_ro - 1)     with positions (int32 / int64)
    row = s + seqlen_offset                                            without (the interface checks the range)

and every head rotates its rot_dim / 2 pairs (x1, x2), pair j by the angle of (cos[j], sin[j]):

    NeoX (interleaved False): x1 = x[j], x2 = x[j + rot_dim / 2];  GPT-J (interleaved True): x1 = x[2j], x2 = x[2j + 1]
    s = sin[j] * sin_sign   (sin_sign -1: the inverse rotation, conjugate=True)
    x1' = fma(x1, cos[j], -(x2 * s)),  x2' = fma(x2, cos[j], x1 * s)       (fp32, then rounded to x's dtype)

The same two fp32 roundings on both backends (a product, then a fused multiply-add). The row index is computed in
int64 and clamped, so positions outside the cache read its first or last row (no host sync, no fault).

Layout: x is a strided view (batch, seqlen, heads, rot_dim) with its last dimension contiguous and the other three
strides dynamic (T.StridedTensor): partial rotary views such as q[..., :rot_dim] or q[..., -rot_dim:] are taken
as they are. cos_sin_cache rows have a dynamic stride, positions (batch, seqlen) a dynamic row stride. batch and
seqlen are dynamic (one compiled kernel per configuration); heads and rot_dim are compile-time. seqlen_offset and
sin_sign are scalar arguments, so conjugate does not change the kernel.

rot_dim: a multiple of 32 in [32, 256] (ROT_DIMS; the peer: 64 and 128). Half a row is then a multiple of 16
elements: on Ascend every vector access to a head's halves starts 32-byte aligned in UB (16-bit and 32-bit
elements), on CUDA both halves split into whole 16-byte accesses.

One generator builds the Ascend 950 kernel (vector cores, SIMD: _apply_rotary_ascend.py) or the CUDA kernel
(_apply_rotary_cuda.py), chosen by `cfg.backend`. Arguments: (x, [key], cos_sin_cache, [positions], seqlen_offset,
sin_sign); batch * seqlen >= 1 per launch (the interface skips empty tensors). The CUDA kernel rotates query and
key in one launch (`key_heads` > 0: key is a second tensor of the same batch and seqlen, its own strides); the
Ascend kernel takes one tensor, and the interface launches it for query, then for key.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

import torch

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend kernels (they do not import this module: no import circle).
from ._apply_rotary_ascend import ascend_apply_rotary_kernel
from ._apply_rotary_cuda import cuda_apply_rotary_kernel, heads_per_thread

# torch dtype -> the name the kernels take
DTYPE_NAMES = {torch.bfloat16: 'bfloat16', torch.float16: 'float16', torch.float32: 'float32'}
ELEMENT_BYTES = {'bfloat16': 2, 'float16': 2, 'float32': 4}
POSITION_DTYPES = {None: 'none', torch.int32: 'int32', torch.int64: 'int64'}
ROT_DIM_UNIT = 32
ROT_DIMS = tuple(range(ROT_DIM_UNIT, 257, ROT_DIM_UNIT))
ACCESS_BYTES = 16  # the widest CUDA access (one 16-byte vector)
_ASCEND_STAGE_BYTES = 48 * 1024  # x, rotated x and cos/sin rows of one task; two buffer versions
_ASCEND_MAX_X_BYTES = 16 * 1024  # x bytes of one token's head group
_ASCEND_MAX_TOKENS = 64  # tokens per task (one DMA per token and tensor)
_CUDA_MAX_THREADS = 256


@dataclasses.dataclass(frozen=True)
class ApplyRotaryConfig:
    backend: Backend
    dtype: str  # x's dtype: 'bfloat16', 'float16' or 'float32'
    rot_dim: int  # elements rotated per head (ROT_DIMS)
    heads: int  # heads of x
    interleaved: bool  # GPT-J pairs (2j, 2j + 1); else NeoX pairs (j, j + rot_dim / 2)
    positions: str  # 'none', 'int32' or 'int64': the positions argument and its dtype
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational)
    key_heads: int = 0  # CUDA: heads of the key rotated in the same launch (0: no key); Ascend: 0
    head_group: int = 1  # Ascend: heads of one task (divides heads)
    block_tokens: int = 1  # Ascend: tokens of one task
    num_stages: int = 1  # Ascend: buffer versions of the persistent loop
    vec: int = 1  # CUDA: elements per access of x (and key); their addresses and strides are multiples of it
    cs_vec: int = 1  # CUDA: elements per cos/sin access; the cache's address and row stride are multiples of it
    groups_per_block: int = 1  # CUDA: head groups (query's, then key's) of one token in a thread block
    tokens_per_block: int = 1  # CUDA: tokens of one thread block

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f'dtype must be one of {sorted(ELEMENT_BYTES)}, got {self.dtype!r}')
        if self.rot_dim not in ROT_DIMS:
            raise ValueError(f'rot_dim must be a multiple of {ROT_DIM_UNIT} in [32, 256], got {self.rot_dim}')
        if self.heads < 1 or self.key_heads < 0:
            raise ValueError(f'heads must be >= 1 and key_heads >= 0, got {self.heads}, {self.key_heads}')
        if self.positions not in POSITION_DTYPES.values():
            raise ValueError(f'positions must be one of {sorted(POSITION_DTYPES.values())}, got {self.positions!r}')
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if self.backend == 'ascend':
            if self.key_heads:
                raise ValueError('Ascend: one tensor per launch (key_heads must be 0)')
            if self.heads % self.head_group:
                raise ValueError(f'head_group {self.head_group} must divide heads {self.heads}')
            if self.block_tokens < 1 or self.num_stages < 1:
                raise ValueError(
                    f'block_tokens and num_stages must be >= 1, got {self.block_tokens}, {self.num_stages}'
                )
            if self.stage_bytes > _ASCEND_STAGE_BYTES:
                raise ValueError(f'Ascend: a task of {self.stage_bytes} bytes exceeds {_ASCEND_STAGE_BYTES}')
        else:
            widest = ACCESS_BYTES // ELEMENT_BYTES[self.dtype]
            if self.vec not in [widest >> i for i in range(widest.bit_length())]:
                raise ValueError(f'vec must be a power of two up to {widest} ({self.dtype}), got {self.vec}')
            if self.cs_vec not in (1, 2, 4) or self.vec % self.cs_vec:
                raise ValueError(f'cs_vec must be 1, 2 or 4 and divide vec {self.vec}, got {self.cs_vec}')
            if not 1 <= self.groups_per_block <= self.all_groups:
                raise ValueError(
                    f'groups_per_block must be in [1, {self.all_groups}] (head groups), got {self.groups_per_block}'
                )
            if not 1 <= self.threads <= 1024:
                raise ValueError(f'CUDA: {self.threads} threads per block, not in [1, 1024]')

    @property
    def half(self) -> int:
        """Pairs per head."""
        return self.rot_dim // 2

    @property
    def stage_bytes(self) -> int:
        """Ascend: UB bytes of one buffer version (x tile, rotated tile, cos/sin rows; without the over-read pad)."""
        x_bytes = self.block_tokens * self.head_group * self.rot_dim * ELEMENT_BYTES[self.dtype]
        return 2 * x_bytes + self.block_tokens * self.rot_dim * 4

    @property
    def units(self) -> int:
        """CUDA: threads per head of one token, `vec` pairs each."""
        return self.half // self.vec

    @property
    def groups(self) -> int:
        """CUDA: query head groups of one token, one per thread (heads h = i * groups + g, i < heads_per_thread)."""
        return self.heads // heads_per_thread(self.heads)

    @property
    def key_groups(self) -> int:
        """CUDA: key head groups of one token (after the query's)."""
        return self.key_heads // heads_per_thread(self.key_heads) if self.key_heads else 0

    @property
    def all_groups(self) -> int:
        return self.groups + self.key_groups

    @property
    def chunks(self) -> int:
        """CUDA: thread blocks per token tile, `groups_per_block` head groups each (the last may be partial)."""
        return -(-self.all_groups // self.groups_per_block)

    @property
    def threads(self) -> int:
        """CUDA threads per block."""
        return self.tokens_per_block * self.groups_per_block * self.units


def _largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of n not above max(1, limit)."""
    return next(d for d in range(min(n, max(1, limit)), 0, -1) if n % d == 0)


def choose_apply_rotary_config(
    *,
    backend: Backend,
    num_cores: int,
    dtype: torch.dtype | str,
    rot_dim: int,
    heads: int,
    interleaved: bool = False,
    positions: torch.dtype | str | None = None,
    key_heads: int = 0,
    vec: int | None = None,
    cs_vec: int = 4,
) -> ApplyRotaryConfig:
    """Pure choice of the compile-time parameters (no device query). `dtype`: bf16, fp16 or fp32 (torch dtype or
    name); `positions`: None, torch.int32 / torch.int64 or 'none' / 'int32' / 'int64'. CUDA: `key_heads` > 0 rotates
    a key of that many heads in the same launch (Ascend: 0 only); `vec` is the access width in elements that the
    addresses and strides of x and key are multiples of (16 bytes unless given), `cs_vec` that of the cache (at
    most 4 fp32). Invalid values raise ValueError."""
    name = DTYPE_NAMES.get(dtype, dtype)
    if name not in ELEMENT_BYTES:
        raise ValueError(f'dtype must be torch.bfloat16, torch.float16 or torch.float32, got {dtype!r}')
    pos = POSITION_DTYPES.get(positions, positions) if not isinstance(positions, str) else positions
    if pos not in POSITION_DTYPES.values():
        raise ValueError(f'positions must be None, torch.int32 or torch.int64, got {positions!r}')
    if rot_dim not in ROT_DIMS:
        raise ValueError(f'rot_dim must be a multiple of {ROT_DIM_UNIT} in [32, 256], got {rot_dim}')
    if heads < 1 or key_heads < 0:
        raise ValueError(f'heads must be >= 1 and key_heads >= 0, got {heads}, {key_heads}')
    if backend == 'ascend' and key_heads:
        raise ValueError('Ascend: one tensor per launch (key_heads must be 0)')
    make = functools.partial(
        ApplyRotaryConfig, backend, name, rot_dim, heads, bool(interleaved), pos, num_cores, key_heads
    )
    row_bytes = rot_dim * ELEMENT_BYTES[name]
    if backend == 'ascend':
        # The most heads of a token that fit the x tile, then as many tokens as the stage holds: x streams once,
        # so fewer, longer tasks per core.
        head_group = _largest_divisor(heads, _ASCEND_MAX_X_BYTES // row_bytes)
        token_bytes = 2 * head_group * row_bytes + rot_dim * 4
        block_tokens = max(1, min(_ASCEND_MAX_TOKENS, _ASCEND_STAGE_BYTES // token_bytes))
        return make(head_group=head_group, block_tokens=block_tokens, num_stages=2)
    if backend == 'cuda':
        widest = ACCESS_BYTES // ELEMENT_BYTES[name]
        vec = widest if vec is None else vec
        if vec not in [widest >> i for i in range(widest.bit_length())]:
            raise ValueError(f'vec must be a power of two up to {widest} ({name}), got {vec}')
        units = rot_dim // 2 // vec
        groups = heads // heads_per_thread(heads) + (key_heads // heads_per_thread(key_heads) if key_heads else 0)
        # A thread block holds the head groups (query's, then key's) of whole tokens where they fit in
        # _CUDA_MAX_THREADS threads, else a chunk of a token's groups.
        per_block = max(1, min(groups, _CUDA_MAX_THREADS // units))
        tokens = max(1, _CUDA_MAX_THREADS // (per_block * units))
        return make(vec=vec, cs_vec=min(cs_vec, vec), groups_per_block=per_block, tokens_per_block=tokens)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_apply_rotary_kernel(cfg: ApplyRotaryConfig):
    """The TileLang prim_func `apply_rotary_kernel` for `cfg.backend` (no compile).

    x: (batch, seqlen, heads, rot_dim) cfg.dtype, strides (dynamic, dynamic, dynamic, 1), rotated in place; key
    (CUDA, cfg.key_heads > 0): (batch, seqlen, key_heads, rot_dim), the same rules;
    cos_sin_cache: (seqlen_ro, rot_dim) float32, row stride dynamic; positions (cfg.positions != 'none'):
    (batch, seqlen) int32 / int64, row stride dynamic; seqlen_offset: int32; sin_sign: float32 (+1 or -1).
    batch * seqlen must be >= 1.
    """
    if cfg.backend == 'ascend':
        return ascend_apply_rotary_kernel(cfg)
    return cuda_apply_rotary_kernel(cfg)


@functools.cache
def get_apply_rotary_kernel(cfg: ApplyRotaryConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_apply_rotary_kernel(cfg), cfg.backend)
