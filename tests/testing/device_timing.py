"""Device timing of the performance reports (tests/<domain>/perf_report.py): do_bench medians under its L2 flush
(CUPTI, else CUDA events), rounds that alternate between the timed calls, the copy that moves the same bytes,
and the clean-L2 timing the Engram report also gives. CUDA only; nothing here runs in the test tiers (the
reports' CPU tests replace `_timed`)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import statistics
import sys
from collections.abc import Callable, Iterable

import torch

COPY_BYTES = 1 << 30  # 1 GiB source: far beyond the L2 cache
FLUSH_BYTES = 256 << 20  # do_bench's flush buffer: several times the H200's L2


def bench_us(fn: Callable[[], object], *, warmup: int = 25, rep: int = 100) -> tuple[float, str]:
    """Median device time of fn() in microseconds, and the do_bench backend that measured it (`warmup`, `rep`:
    do_bench's milliseconds of warm-up and of timed calls)."""
    from tilelang.profiler.bench import do_bench

    try:
        ms = do_bench(fn, warmup=warmup, rep=rep, backend='cupti', return_mode='median')
        if ms > 0:
            return ms * 1e3, 'cupti'
    except Exception as exc:  # CUPTI missing or unusable in this torch build
        print(f'(CUPTI unavailable: {type(exc).__name__}: {exc}; using CUDA events)', file=sys.stderr)
    return do_bench(fn, warmup=warmup, rep=rep, backend='event', return_mode='median') * 1e3, 'event'


def _device_activities(prof) -> list:
    """The device-side events (kernels, copies) a torch profiler recorded, without user annotations."""
    return [
        e
        for e in prof.events()
        if getattr(getattr(e, 'device_type', None), 'name', '') == 'CUDA' and not e.is_user_annotation
    ]


def _profiled(calls: Callable[[], None]):
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        calls()
        torch.cuda.synchronize()
    return prof


class CleanL2Flush:
    """A flush that leaves the L2 full of clean lines: it reads FLUSH_BYTES (evicting, and so writing back,
    whatever the previous call left dirty) instead of zeroing them. `kernel_names` are its kernels, which
    clean_l2_bench_us leaves out of the time (found by profiling it alone, which also starts CUPTI)."""

    def __init__(self, device: torch.device) -> None:
        self._buf = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
        self._sum = torch.empty((), dtype=torch.int64, device=device)
        self.kernel_names = frozenset(e.name for e in _device_activities(_profiled(self.flush)))

    def flush(self) -> None:
        torch.sum(self._buf, dim=0, dtype=torch.int64, out=self._sum)


def clean_l2_bench_us(fn: Callable[[], object], flush: CleanL2Flush) -> float:
    """Mean device time (CUPTI, through the torch profiler) of fn() in microseconds, each call after
    `flush`: every device event of the profiled calls but the flush's kernels, over the calls (do_bench's
    warm-up and repeat counts: 25 ms and 100 ms worth of calls)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.flush()
        fn()
    end.record()
    end.synchronize()
    estimate_ms = start.elapsed_time(end) / 5
    for _ in range(max(1, int(25 / estimate_ms))):
        fn()
    repeat = max(1, int(100 / estimate_ms))

    def calls() -> None:
        for _ in range(repeat):
            flush.flush()
            fn()

    events = _device_activities(_profiled(calls))
    us = sum(e.self_device_time_total for e in events if e.name not in flush.kernel_names) / repeat
    if not us > 0:
        raise RuntimeError(f'the profiler recorded {us} us of device time for the call')
    return us


def _copy_moving(nbytes: int, device: torch.device) -> Callable[[], object]:
    """A device-to-device copy that moves `nbytes` (half read, half written)."""
    src = torch.ones(max(1, nbytes // 2), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def same_size_copy_us(nbytes: int, device: torch.device, flush: CleanL2Flush) -> float:
    """Clean-L2 time of a device-to-device copy moving `nbytes` (half read, half written)."""
    return clean_l2_bench_us(_copy_moving(nbytes, device), flush)


def copy_ceiling(device: torch.device) -> tuple[float, float]:
    """(GB/s, us) of a device-to-device copy of COPY_BYTES, counting bytes read + written."""
    src = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    us, _ = bench_us(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / us / 1e3, us


def _timed(fn: Callable[[], object], **timing) -> tuple[float | None, str]:
    try:
        return bench_us(fn, **timing)
    except Exception as exc:
        return None, f'{type(exc).__name__}: {exc}'


def alternating_medians(
    fns: list[Callable[[], object] | None], rounds: int, **timing
) -> list[tuple[float | None, str]]:
    """(median us, timer) of each fn over `rounds` rounds that time every fn in turn, so that a drift of the
    device's speed during the row falls on all of them alike; (None, why) for a fn that is None or fails
    (a failed fn is not timed again). `timing`: bench_us's warm-up and repeat times."""
    times: list[list[float]] = [[] for _ in fns]
    failed: dict[int, str] = {i: 'not timed' for i, fn in enumerate(fns) if fn is None}
    timer = 'n/a'
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            if i in failed:
                continue
            us, timer = _timed(fn, **timing)
            if us is None:
                failed[i] = timer
            else:
                times[i].append(us)
    return [(None, failed[i]) if i in failed else (statistics.median(times[i]), timer) for i in range(len(fns))]


def same_traffic_floors(nbytes: int, device: torch.device) -> tuple[float, float]:
    """(us of a copy moving `nbytes`, half read and half written; us of a read of `nbytes` by torch.sum),
    both under do_bench's flush: what plain kernels that move the same bytes take under the same timer."""
    copy_us, _ = bench_us(_copy_moving(nbytes, device))
    data = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    total = torch.empty((), dtype=torch.float32, device=device)
    read_us, _ = bench_us(lambda: torch.sum(data, dim=0, out=total))
    return copy_us, read_us


def compile_in_workers(warm: Callable[[object], str | None], work: Iterable[object], jobs: int) -> None:
    """Run `warm(item)` for every item in `jobs` spawned processes, so that each kernel a report times is compiled
    in parallel into TileLang's disk cache before the timing process loads it; `warm` is a module-level function
    that makes one small call of every kernel of its item and returns an error text or None (printed)."""
    context = multiprocessing.get_context('spawn')
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for error in pool.map(warm, list(work)):
            if error:
                print(f'(compile: {error})', file=sys.stderr)


def agreement(ours, theirs, *, rtol: float = 1e-5, atol: float = 1e-6) -> str:
    """'equal' (bit for bit), 'close' (floating results within rtol / atol, the others equal) or 'DIFF' between
    two results (a tensor or a tuple of them)."""
    ours, theirs = _comparable(ours), _comparable(theirs)
    if len(ours) != len(theirs) or any(a.shape != b.shape for a, b in zip(ours, theirs, strict=True)):
        return 'DIFF (shapes)'
    if all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)):
        return 'equal'
    close = all(
        torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol, equal_nan=True)
        if a.is_floating_point()
        else torch.equal(a, b)
        for a, b in zip(ours, theirs, strict=True)
    )
    return 'close' if close else 'DIFF'


def _comparable(result) -> tuple[torch.Tensor, ...]:
    """A result's tensors, FP8 ones as their bytes (torch compares no float8 values)."""
    tensors = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    return tuple(t.view(torch.uint8) if t.dtype.is_floating_point and t.element_size() == 1 else t for t in tensors)


def print_comparison(cases, calls, *, columns: str, cells, rounds: int, device: torch.device) -> None:
    """A markdown table of ours against a peer, one row per case: `cells(case)`, the leading cells under
    `columns` ('a | b'); then the peer's agreement ('-' where the case compares nothing), the device times of
    ours and the peer (alternating medians), the copy that moves the same bytes, ours / peer and ours' share
    of that copy. `calls(case)` gives (ours, peer or None, moved bytes, agreement text or None); a case whose
    calls fail prints why."""
    print(f'| {columns} | agree | ours us | peer us | copy us | ours / peer | % of copy |')
    print('|' + ' --- |' * (len(columns.split('|')) + 6))
    for case in cases:
        head = f'| {cells(case)} |'
        try:
            ours, peer, moved, agree = calls(case)
        except Exception as exc:  # the row says why; the others still run
            print(f'{head} failed: {type(exc).__name__}: {str(exc)[:160]} |', flush=True)
            continue
        (ours_us, why), (peer_us, _) = alternating_medians([ours, peer], rounds)
        if ours_us is None:
            print(f'{head} failed: {why} |', flush=True)
            continue
        copy_us, _ = same_traffic_floors(moved, device)
        peer_text, ratio = (f'{peer_us:.1f}', f'{ours_us / peer_us:.2f}') if peer_us else ('-', '-')
        print(
            f'{head} {agree or "-"} | {ours_us:.1f} | {peer_text} | {copy_us:.1f} | {ratio} | '
            f'{100 * copy_us / ours_us:.0f} |',
            flush=True,
        )
