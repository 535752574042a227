"""Kernels of moe_topk: scores (T, E) fp32 -> topk_idx (T, K) int64, the stable top-k of each row.

Semantics (TileKernels 2.1.0's `topk_gate(scores, num_topk)`): row t's experts in descending order of
scores[t], ties to the lower index, as torch.sort(descending=True, stable=True); a NaN ranks below every
number (the peer stops the device with an assert there; these kernels need no host sync), -0.0 equals +0.0.

One warp per row on both backends (_topk_select.py): lane l holds the row's experts l*V .. l*V+V-1 of every
chunk of 32*V, K rounds of a lane maximum and two warp reductions; lane k writes the k-th index.

- CUDA (_moe_topk_cuda.py): `rows` warps per thread block, one row each, loaded straight from global memory
  into registers, V = 4 fp32 (16-byte loads) where E is a multiple of 4 and scores 16-byte aligned, else V = 1.
- Ascend 950 (_moe_topk_ascend.py): a persistent loop over blocks of `rows` rows on the vector cores:
  GM -> UB (one DMA per block), a SIMT VF of 32 * rows threads (one row per 32), UB -> GM.

Limits: 1 <= K <= min(E, 32) (a lane keeps one result: K <= WARP), E <= 512 (registers per lane: 16 fp32
keys; the UB tile), T * E < 2**31 (int32 element offsets). T is dynamic; T = 0 launches nothing.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations, which
# refer to the generator's local shape variables.
import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backends take the configuration as `cfg` and do not import this module: no import circle.
from ._moe_topk_ascend import ascend_moe_topk_kernel
from ._moe_topk_cuda import cuda_moe_topk_kernel
from ._topk_select import WARP, lane_slots

MAX_EXPERTS = 512  # 16 keys per lane; an Ascend block of 16 rows of 512 fp32 is 32 KiB of UB
MAX_TOPK = WARP  # lane k holds the k-th result
MAX_ELEMENTS = 2**31 - 1  # T * E: int32 element offsets
CUDA_VECTOR = 4  # fp32 per 16-byte load
_CUDA_ROWS = 4  # warps (rows) per thread block: 128 threads, enough blocks to fill 132 SMs at T >= 4001
_ASCEND_TILE_BYTES = 32 * 1024  # scores of one block of rows in UB (two buffer versions)
_ASCEND_MAX_ROWS = 32  # SIMT threads per VF: 32 * rows <= 1024


def check_topk_sizes(name: str, num_experts: int, num_topk: int) -> None:
    """1 <= num_topk <= min(num_experts, MAX_TOPK) and 1 <= num_experts <= MAX_EXPERTS, else ValueError."""
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f'{name}: the number of experts must be in 1..{MAX_EXPERTS}, got {num_experts}')
    if not 1 <= num_topk <= min(num_experts, MAX_TOPK):
        raise ValueError(
            f'{name}: num_topk must be in 1..min(num_experts, {MAX_TOPK}) = 1..{min(num_experts, MAX_TOPK)}, '
            f'got {num_topk}'
        )


@dataclasses.dataclass(frozen=True)
class MoeTopkConfig:
    backend: Backend
    num_experts: int  # E
    num_topk: int  # K
    num_cores: int  # Ascend: vector cores (persistent grid); CUDA: SMs (informational, the grid is ceil(T / rows))
    rows: int  # rows per CUDA thread block / per Ascend block (one warp of 32 lanes each)
    vector: int  # consecutive experts per lane and chunk (CUDA: one 16-byte load; Ascend: 1)
    num_stages: int  # Ascend buffer versions of the persistent loop (unused on CUDA)

    def __post_init__(self):
        if self.backend not in ('ascend', 'cuda'):
            raise ValueError(f'backend must be "ascend" or "cuda", got {self.backend!r}')
        check_topk_sizes('MoeTopkConfig', self.num_experts, self.num_topk)
        if self.num_cores < 1:
            raise ValueError(f'num_cores must be >= 1, got {self.num_cores}')
        if not 1 <= self.rows <= _ASCEND_MAX_ROWS:
            raise ValueError(f'rows must be in 1..{_ASCEND_MAX_ROWS}, got {self.rows}')
        if self.vector not in (1, CUDA_VECTOR) or self.num_experts % self.vector:
            raise ValueError(f'vector must be 1 or {CUDA_VECTOR} dividing num_experts, got {self.vector}')
        if self.backend == 'ascend' and (self.vector != 1 or self.num_stages < 1):
            raise ValueError('Ascend: vector must be 1 and num_stages >= 1')

    @property
    def slots(self) -> int:
        """Keys per lane."""
        return lane_slots(self.num_experts, self.vector)


def cuda_vector(num_experts: int, aligned: bool) -> int:
    """CUDA: fp32 per load, 16-byte loads where every row starts 16-byte aligned (the tensor's address and E)."""
    return CUDA_VECTOR if aligned and num_experts % CUDA_VECTOR == 0 else 1


def choose_moe_topk_config(
    *, backend: Backend, num_cores: int, num_experts: int, num_topk: int, aligned: bool = True
) -> MoeTopkConfig:
    """Pure choice of the compile-time parameters (no device query). aligned: the scores' address is a multiple
    of 16 bytes (CUDA's vector loads; a view that starts elsewhere takes the scalar-load kernel)."""
    check_topk_sizes('choose_moe_topk_config', num_experts, num_topk)
    if backend == 'cuda':
        vector = cuda_vector(num_experts, aligned)
        return MoeTopkConfig(backend, num_experts, num_topk, num_cores, _CUDA_ROWS, vector, 1)
    if backend == 'ascend':
        row_bytes = -(-num_experts // WARP) * WARP * 4
        rows = min(_ASCEND_MAX_ROWS, _ASCEND_TILE_BYTES // row_bytes)
        return MoeTopkConfig(backend, num_experts, num_topk, num_cores, rows, 1, 2)
    raise ValueError(f'backend must be "ascend" or "cuda", got {backend!r}')


def make_moe_topk_kernel(cfg: MoeTopkConfig):
    """The TileLang prim_func `moe_topk_kernel` for `cfg.backend` (no compile): arguments (scores (T, E) fp32,
    topk_idx (T, K) int64), T dynamic and >= 1."""
    if cfg.backend == 'ascend':
        return ascend_moe_topk_kernel(cfg)
    return cuda_moe_topk_kernel(cfg)


@functools.cache
def get_moe_topk_kernel(cfg: MoeTopkConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_moe_topk_kernel(cfg), cfg.backend)
