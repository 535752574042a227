"""Host-inclusive timing for benchmarks: the wall time per call of back-to-back calls.

CUPTI and msprof measure the device: a call whose host path (validation, configuration, allocation,
the launch itself) outgrows its kernel is invisible to them. `host_time_us(fn, sync)` times HOST_CALLS
calls of `fn` back to back with the CPU clock, `sync()` (the device's synchronize) once at the end, and
returns the fastest of HOST_ROUNDS rounds per call, in microseconds: for a launch-bound call that is its
host time (the device keeps up), for a long kernel its device time. The fastest round, not the median:
other work on the host only ever slows a round down, so the minimum is the stable figure, and a slower
host path moves it all the same.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

HOST_CALLS = 200
HOST_ROUNDS = 7
HOST_TIMING_BACKEND = 'host'  # the timing_backend of host records
HOST_OPERATION_SUFFIX = '_host'  # operation of a host record: the device record's plus this, e.g. 'fwd_host'
# A host record is a regression only past these floors (on top of the run's thresholds): on the H200 a
# host record's fastest round moved by up to +77 % between a refresh and the verify that followed it,
# with no change (README, Performance); a slower host path that matters (a sleep, a device query, an
# extra launch per call) still shows, and a planted 200 us slowdown does (tests/engram/test_engram_host_time.py).
HOST_REGRESSION_THRESHOLD_FLOOR = 1.0  # slower by more than 100 %
HOST_MIN_DELTA_US_FLOOR = 10.0  # and by more than 10 us


def host_time_us(
    fn: Callable[[], object], sync: Callable[[], object], *, calls: int = HOST_CALLS, rounds: int = HOST_ROUNDS
) -> float:
    """Fastest round's wall time per call of `fn()` (us), `calls` back-to-back calls a round, after a warm-up."""
    if calls < 1 or rounds < 1:
        raise ValueError(f'calls and rounds must be >= 1, got {calls} and {rounds}')
    for _ in range(max(10, calls // 10)):  # compiles, fills the operators' and the allocator's caches
        fn()
    sync()
    best = float('inf')
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def paired_host_times(
    ours: Callable[[], object], peer: Callable[[], object], sync: Callable[[], object], *, rounds: int
) -> tuple[float, float, float]:
    """(ours us, peer us, ours / peer) of two calls timed in `rounds` rounds that alternate between them, one
    host_time_us round each: the fastest round of each, and the ratio as the median of the rounds' own ratios (a
    round's two figures are taken back to back, so a slow stretch of the host falls on both; the fastest figures
    of the two sides may come from different stretches)."""
    times = [[host_time_us(fn, sync, rounds=1) for fn in (ours, peer)] for _ in range(rounds)]
    ratio = statistics.median(ours_us / peer_us for ours_us, peer_us in times)
    return min(t[0] for t in times), min(t[1] for t in times), ratio
