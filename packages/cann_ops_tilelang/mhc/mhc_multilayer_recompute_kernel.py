"""The fused kernel of mhc_multilayer_recompute, Ascend 950 and CUDA: up to LAYERS_PER_LAUNCH consecutive layers in
one launch, each residual kept on chip between its layers (the math: mhc_multilayer_recompute.py). The operator
takes it eagerly on both backends.

A launch reads the first residual once and per layer its output and mixes, and writes per layer its input and
residual: against the composition, each residual is neither read back for the layer input nor for the next
layer. The token count is dynamic (T.dynamic): one compiled kernel serves every T of a (M, H, layers, post
layers).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations.

import dataclasses
import functools

from cann_ops_tilelang.config import Backend
from cann_ops_tilelang.kernel_target import compile_kernel

# The backend takes the configuration as `cfg` and does not import this module: no import circle.
from ._mhc_multilayer_common import LAYERS_PER_LAUNCH
from ._mhc_multilayer_recompute_ascend import ascend_mhc_multilayer_recompute_kernel
from ._mhc_multilayer_recompute_cuda import cuda_mhc_multilayer_recompute_kernel
from ._mhc_post_common import ASCEND_LANES, ascend_tile, check_stream_config

# UB bytes for the big tiles (the residual buffers, the layer inputs and outputs); the mix rows take the rest.
ASCEND_UB_BUDGET = 160 * 1024
CUDA_THREADS = 64  # 2 warps a block, one 8-column chunk a thread (the H200's fastest of 32 to 256: docs/mhc.md)


@dataclasses.dataclass(frozen=True)
class MhcMultilayerRecomputeConfig:
    backend: Backend
    mhc: int  # M, branches
    hidden: int  # H
    layers: int  # L of this launch, 1..LAYERS_PER_LAUNCH
    post_layers: int  # L_post of this launch: layers or layers - 1
    num_cores: int  # Ascend: vector cores; CUDA: SMs (informational: the grid covers the chunks)
    tile: int = ASCEND_LANES  # Ascend hidden columns a task; divides H
    threads: int = CUDA_THREADS  # CUDA threads a block
    prefetch: int = 1  # CUDA: how many layers ahead of its computation a layer's reads are issued

    def __post_init__(self):
        check_stream_config(self)
        if not 1 <= self.layers <= LAYERS_PER_LAUNCH or self.post_layers not in (self.layers, self.layers - 1):
            raise ValueError(
                f'layers must be in 1..{LAYERS_PER_LAUNCH} and post_layers layers or layers - 1, '
                f'got {self.layers} and {self.post_layers}'
            )
        if not 0 <= self.prefetch < LAYERS_PER_LAUNCH:
            raise ValueError(f'prefetch must be in 0..{LAYERS_PER_LAUNCH - 1}, got {self.prefetch}')
        if ascend_ub_bytes(self.mhc, self.tile) > ASCEND_UB_BUDGET:
            raise ValueError(f'a tile of {self.tile} columns exceeds the UB budget at mhc {self.mhc}')


def ascend_ub_bytes(mhc: int, tile: int) -> int:
    """UB of the big tiles: LAYERS_PER_LAUNCH + 1 residual buffers (M, tile) and a layer input and output
    (tile,) a layer, bf16."""
    return tile * 2 * ((LAYERS_PER_LAUNCH + 1) * mhc + 2 * LAYERS_PER_LAUNCH)


def choose_mhc_multilayer_recompute_config(
    *, backend: Backend, mhc: int, hidden: int, layers: int, post_layers: int, num_cores: int
) -> MhcMultilayerRecomputeConfig:
    """Pure choice of the compile-time parameters (no device query): on Ascend the widest tile that fits."""
    common = (backend, mhc, hidden, layers, post_layers, num_cores)
    if backend == 'ascend':
        tile = ascend_tile(hidden, ascend_ub_bytes(mhc, 1), ASCEND_UB_BUDGET)
        return MhcMultilayerRecomputeConfig(*common, tile=tile)
    return MhcMultilayerRecomputeConfig(*common)


def make_mhc_multilayer_recompute_kernel(cfg: MhcMultilayerRecomputeConfig):
    """The TileLang prim_func `mhc_multilayer_recompute_kernel` for `cfg.backend` (no compile). Arguments, in
    order: the first residual (T, M, H) bf16; LAYERS_PER_LAUNCH slots each of pre mixes (T, M) fp32, layer
    outputs (T, H) bf16, post mixes (T, M) fp32, comb mixes (T, M * M) fp32, layer inputs (T, H) bf16 and
    residuals (T, M, H) bf16 (written); a slot past the configuration's layers (post layers) takes a (1,)
    placeholder of its dtype."""
    if cfg.backend == 'ascend':
        return ascend_mhc_multilayer_recompute_kernel(cfg)
    return cuda_mhc_multilayer_recompute_kernel(cfg)


@functools.cache
def get_mhc_multilayer_recompute_kernel(cfg: MhcMultilayerRecomputeConfig):
    """Compiled kernel for `cfg` (compiled on first use, for the current device)."""
    return compile_kernel(make_mhc_multilayer_recompute_kernel(cfg), cfg.backend)
