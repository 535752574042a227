"""Longest tests first: a run starts its tests in the order their durations in the previous run suggest.

An xdist run is tail-bound when its longest tests start late: xdist hands out contiguous shares of the
collection (`--dist worksteal`: one N-th to each worker at the start, idle workers then steal the tail
half of the longest queue; `load`: a quarter of that, then batches of about that size from the front),
and tests/pipeline, whose tests start child processes, is collected last.

- Recording: the controller (or the single process) adds up each test's setup, call and teardown time
  from `pytest_runtest_logreport` and at the end of the session merges them into pytest's cache, one key,
  DURATIONS_KEY (node ID -> seconds). Tests that did not run keep their entry; tests whose file is gone
  lose it.
- Ordering (`pytest_collection_modifyitems`, after every other implementation, so it orders what is left
  after deselection): the unit is a test file, kept in its order, so module fixtures are set up once and
  parametrizations that share a kernel stay next to each other (compiled once, on one worker). A file
  weighs the sum of its tests' durations; a test without one counts as the mean of the known ones.
  Under xdist the files are dealt, heaviest first, to the shares the scheduler hands out (worksteal: N
  shares; load: shares of its batch size, about 4N), each to the lightest share with room. A file is split where
  a share is full, and a file heavier than a fair share (the total / the shares) before the test that would
  take it past one: no worker could finish it alone in time. The pieces of a share run heaviest first, so
  every worker starts on one of the longest pieces and what idle workers steal from a tail is short. A
  split file sets its module fixtures up once per piece. Without xdist (or with other `--dist` modes) the
  files simply run heaviest first.
- No durations for any collected test (a fresh clone, a cleared cache), one rule: the files that start
  child processes (the module imports `subprocess`, or a test requests `pytester`) first, the others
  after them, each group in collection order.
- Determinism: the order depends only on the collected items, the durations, the worker count and the
  dist mode. The controller reads the cache once and hands it and its dist mode to the workers
  (`workerinput`), so all of them compute the same order (xdist stops on collections that differ) even
  when another run in the checkout rewrites the cache meanwhile.

Nothing is recorded or reordered with `-p no:cacheprovider`, nothing reordered with `--ff` / `--nf` (the
user asked for that order); `-p no:tests.testing.plugins.longest_first` turns the plugin off.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence

import pytest

DURATIONS_KEY = 'cann_ops_tilelang/durations'
_WORKERINPUT_KEY = 'ops_tilelang_durations'
_durations_key = pytest.StashKey[dict[str, float]]()
_dist_key = pytest.StashKey[str]()


def valid_durations(value: object) -> dict[str, float]:
    """The usable entries of a cached value: a cache is a hint, so a damaged entry is dropped, not an error."""
    if not isinstance(value, dict):
        return {}
    return {
        k: float(v)
        for k, v in value.items()
        if isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
    }


def file_of(nodeid: str) -> str:
    return nodeid.split('::', 1)[0]


def pytest_configure(config: pytest.Config) -> None:
    cache = getattr(config, 'cache', None)
    if cache is None:  # -p no:cacheprovider
        return
    workerinput = getattr(config, 'workerinput', None)
    if workerinput is not None:
        if _WORKERINPUT_KEY in workerinput:  # the controller's reading; absent if it lacks the plugin
            config.stash[_durations_key] = workerinput[_WORKERINPUT_KEY]['durations']
            config.stash[_dist_key] = workerinput[_WORKERINPUT_KEY]['dist']
        return
    config.stash[_durations_key] = valid_durations(cache.get(DURATIONS_KEY, {}))
    config.pluginmanager.register(DurationRecorder(config), 'longest_first_recorder')


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Controller: every worker orders by the same durations and knows how xdist will hand them out."""
    config = node.config
    if _durations_key in config.stash:
        node.workerinput[_WORKERINPUT_KEY] = {'durations': config.stash[_durations_key], 'dist': config.option.dist}


class DurationRecorder:
    """Controller or single process: setup + call + teardown seconds per node ID, cached at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.measured: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.measured[report.nodeid] = self.measured.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        if not self.measured:  # --collect-only, nothing selected
            return
        cache = self.config.cache
        # Read again: a run that ended meanwhile in the same checkout may have added entries.
        durations = valid_durations(cache.get(DURATIONS_KEY, {}))
        durations.update((k, round(v, 3)) for k, v in self.measured.items())
        root = self.config.rootpath
        cache.set(DURATIONS_KEY, {k: v for k, v in sorted(durations.items()) if (root / file_of(k)).exists()})


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    result = yield  # after every other implementation: order exactly what is left to run
    durations = config.stash.get(_durations_key, None)
    if durations is not None and not config.getoption('failedfirst') and not config.getoption('newfirst'):
        items[:] = ordered(items, durations, initial_shares(config, len(items)))
    return result


def initial_shares(config: pytest.Config, count: int) -> list[int]:
    """How many tests each share holds: the shares are what xdist hands out, as its schedulers count them;
    [] when the run is not distributed that way (one process, a tiny collection, other modes)."""
    workerinput = getattr(config, 'workerinput', None)
    if workerinput is None:
        return []
    workers = workerinput['workercount']
    dist = config.stash.get(_dist_key, 'no')
    if dist == 'worksteal':  # WorkStealingScheduling: worker i starts with count // (workers - i) of the rest
        return even_shares(count, workers)
    if dist == 'load' and count >= 2 * workers:
        # LoadScheduling sends each worker a batch of a quarter of an even share (at least 2) first, then
        # batches of about that size from the front as tests end: shares of that size, each about as heavy
        # and starting with its heaviest piece, keep every batch balanced.
        batch = max(2, count // workers // 4)
        return even_shares(count, count // batch)
    return []


def even_shares(count: int, shares: int) -> list[int]:
    """`count` tests cut as xdist's work-stealing scheduler cuts them: each share `rest // shares left`."""
    sizes: list[int] = []
    for left in range(shares, 0, -1):
        sizes.append((count - sum(sizes)) // left)
    return sizes


def starts_child_processes(items: Sequence[pytest.Item]) -> bool:
    """The fresh-clone hint: the module imports subprocess, or a test requests pytester."""
    module = getattr(items[0], 'module', None)
    imports_subprocess = module is not None and 'subprocess' in vars(module)
    return imports_subprocess or any('pytester' in getattr(item, 'fixturenames', ()) for item in items)


def ordered(items: Sequence[pytest.Item], durations: Mapping[str, float], shares: Sequence[int]) -> list[pytest.Item]:
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(file_of(item.nodeid), []).append(item)
    groups = list(files.values())
    known = [durations[item.nodeid] for item in items if item.nodeid in durations]
    if not known:
        groups.sort(key=lambda group: not starts_child_processes(group))  # stable: collection order kept
        return [item for group in groups for item in group]
    mean = sum(known) / len(known)

    def weight(group: Sequence[pytest.Item]) -> float:
        return sum(durations.get(item.nodeid, mean) for item in group)

    if not shares:
        groups.sort(key=weight, reverse=True)  # stable, so equal weights keep collection order
        return [item for group in groups for item in group]
    dealt, rest = deal(groups, shares, weight)
    return [item for share in dealt for group in share for item in group] + [item for group in rest for item in group]


def deal(
    groups: Sequence[Sequence[pytest.Item]], shares: Sequence[int], weight: Callable[[Sequence[pytest.Item]], float]
) -> tuple[list[list[Sequence[pytest.Item]]], list[Sequence[pytest.Item]]]:
    """Heaviest group first, each to the lightest share with room (ties: the first); split where the share
    is full, or before the test that takes a group past a fair share. Returns the shares, each heaviest piece
    first (two pieces of one group in one share joined, in order), and what is left, heaviest first."""
    heap = [(-weight(group), index, group) for index, group in enumerate(groups)]
    heapq.heapify(heap)  # (weight, collection index): a deterministic order; a group's rest keeps its index
    fair = -sum(w for w, _, _ in heap) / len(shares)
    room, loads = list(shares), [0.0] * len(shares)
    dealt: list[dict[int, list[pytest.Item]]] = [{} for _ in shares]  # per share: group index -> its tests
    while heap and any(room):
        _, index, group = heapq.heappop(heap)
        share = min((s for s in range(len(shares)) if room[s]), key=lambda s: (loads[s], s))
        size = min(room[share], _fair_prefix(group, fair, weight))
        piece, left = group[:size], group[size:]
        dealt[share].setdefault(index, []).extend(piece)  # a group's pieces are dealt front to back
        loads[share] += weight(piece)
        room[share] -= len(piece)
        if left:
            heapq.heappush(heap, (-weight(left), index, left))
    ordered_shares = [sorted(share.values(), key=weight, reverse=True) for share in dealt]  # stable
    return ordered_shares, [group for _, _, group in sorted(heap)]


def _fair_prefix(group: Sequence[pytest.Item], fair: float, weight: Callable[[Sequence[pytest.Item]], float]) -> int:
    """The length of the longest prefix of `group` that weighs at most `fair`, at least 1."""
    total = 0.0
    for size, item in enumerate(group):
        total += weight([item])
        if total > fair:
            return max(size, 1)
    return len(group)
