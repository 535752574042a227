"""The token counters of engram_gate_bwd's claiming kernel: CUDA launch plumbing, not interface.

The resident CUDA kernel's blocks claim tokens from an int32 counter (engram_gate_bwd_kernel.COUNTER_WORDS)
that must be zero when the kernel starts. Which buffer a launch gets depends on the stream it goes to and on
whether that stream captures a CUDA graph: a matter of how the launch runs, which no argument, check or
configuration of the operator shows, so it lives here rather than in the operator's declaration.
"""

from __future__ import annotations

import torch

from .engram_gate_bwd_kernel import COUNTER_WORDS

# The claiming kernels' counters, one per (device index, raw CUDA stream): see token_counter.
COUNTERS: dict[tuple, torch.Tensor] = {}
# What the kernels that claim nothing get as token_counter (never read or written), one per device.
UNUSED_COUNTERS: dict[torch.device, torch.Tensor] = {}


def launch_stream(index: int) -> int | None:
    """The raw current CUDA stream of device `index`, where the launch goes; None while it captures a graph."""
    if torch._C._cuda_getDevice() != index:  # tensors on another GPU than the current one: ask that one
        with torch.cuda.device(index):
            return launch_stream(index)
    if torch._C._cuda_isCurrentStreamCapturing():
        return None
    return torch._C._cuda_getCurrentRawStream(index)


def token_counter(x: torch.Tensor, index: int | None) -> torch.Tensor:
    """The token_counter of a kernel that claims tokens, on x's device (index): zero when the kernel starts.

    Eagerly one buffer per (device, stream), zero-filled when first used: the kernel leaves it at zero
    (_engram_gate_bwd_cuda.py) and launches on one stream run one after another, so the next launch there
    finds zeros without a fill of its own, which would be a second launch per call (as much host time as the
    kernel's). Launches on different streams may overlap, hence one buffer each. While the stream captures a
    CUDA graph, a fresh zero-filled buffer per call instead (its memset captured before the kernel, in the
    graph's private memory): a replay may run on any stream, concurrently with eager calls, so it must share
    no buffer with them (nor with another graph). Keyed by the raw stream handle, which a stream destroyed and
    another created could share; PyTorch's pooled streams are never destroyed.
    """
    stream = launch_stream(index)
    if stream is None:
        return x.new_zeros((COUNTER_WORDS,), dtype=torch.int32)
    key = (index, stream)
    counter = COUNTERS.get(key)
    if counter is None:  # allocated and zero-filled on this very stream, so ordered before the kernel
        counter = COUNTERS[key] = x.new_zeros((COUNTER_WORDS,), dtype=torch.int32)
    return counter


def unused_counter(x: torch.Tensor) -> torch.Tensor:
    """token_counter for the kernels that claim nothing: any int32 (COUNTER_WORDS,) of x's device, kept."""
    counter = UNUSED_COUNTERS.get(x.device)
    if counter is None:
        counter = UNUSED_COUNTERS[x.device] = x.new_empty(COUNTER_WORDS, dtype=torch.int32)
    return counter
