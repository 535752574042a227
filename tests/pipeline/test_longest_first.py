"""Longest tests first (tests/testing/plugins/longest_first.py): durations recorded into pytest's cache, the
next run ordered by them, file by file; a fresh clone starts the files that run child processes first."""

from __future__ import annotations

import dataclasses
import json
import re
import types

import pytest

from tests.testing.plugins import longest_first
from tests.testing.plugins.longest_first import DURATIONS_KEY, even_shares, ordered

pytest_plugins = ['pytester']

# The plugin under test; off, as in the other pytester runs here, what costs each inner run time for nothing:
# unraisableexception's gc.collect() with torch loaded, hypothesis' plugin re-imported per run.
PLUGIN = ('-p', 'tests.testing.plugins.longest_first', '-p', 'no:unraisableexception', '-p', 'no:hypothesispytest')
# Four small files; z_slow.py comes last in collection order, as tests/pipeline does in the repository.
FILES = {
    'test_a_fast': 'def test_a1():\n    pass\n\n\ndef test_a2():\n    pass\n',
    'test_b_fast': 'def test_b1():\n    pass\n',
    'test_y_slow': 'def test_y1():\n    pass\n\n\ndef test_y2():\n    pass\n',
    'test_z_slow': 'def test_z1():\n    pass\n\n\ndef test_z2():\n    pass\n',
}


def cache_file(pytester: pytest.Pytester):
    return pytester.path / '.pytest_cache' / 'v' / DURATIONS_KEY


def seed(pytester: pytest.Pytester, durations: dict[str, float]) -> None:
    path = cache_file(pytester)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(durations))


def run_order(result: pytest.RunResult) -> list[str]:
    """Node IDs in the order -v reports them (one process: the run order)."""
    return re.findall(r'^(test_\w+\.py::\w+) PASSED', result.stdout.str(), flags=re.MULTILINE)


def first_per_worker(result: pytest.RunResult) -> dict[str, str]:
    """Under xdist -v: the first test each worker reported, i.e. the head of its share."""
    first: dict[str, str] = {}
    for worker, nodeid in re.findall(r'^\[(gw\d+)\] .*PASSED (test_\w+\.py::\w+)', result.stdout.str(), re.MULTILINE):
        first.setdefault(worker, nodeid)
    return first


# --- the pure ordering ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Item:
    nodeid: str
    module: types.SimpleNamespace = dataclasses.field(default_factory=types.SimpleNamespace)
    fixturenames: tuple[str, ...] = ()


def items_of(*nodeids: str) -> list[Item]:
    return [Item(nodeid) for nodeid in nodeids]


def ids(items) -> list[str]:
    return [item.nodeid for item in items]


def test_files_run_heaviest_first_and_keep_their_order_within():
    items = items_of('a.py::t1', 'a.py::t2', 'b.py::t1', 'b.py::t2', 'c.py::t1')
    durations = {'a.py::t1': 1.0, 'a.py::t2': 1.0, 'b.py::t1': 0.5, 'b.py::t2': 5.0, 'c.py::t1': 3.0}
    # b weighs 5.5, c 3, a 2; b's short test stays before its long one (the file's order, its module fixtures).
    assert ids(ordered(items, durations, [])) == ['b.py::t1', 'b.py::t2', 'c.py::t1', 'a.py::t1', 'a.py::t2']


def test_a_test_without_a_duration_counts_as_the_mean_and_ties_keep_collection_order():
    items = items_of('a.py::t1', 'b.py::t1', 'b.py::new', 'c.py::t1', 'd.py::t1')
    durations = {'a.py::t1': 2.0, 'b.py::t1': 1.0, 'c.py::t1': 3.0, 'd.py::t1': 2.0}  # mean 2.0
    # b = 1 + 2 (its new test) = 3 ties with c: b was collected first; a and d tie at 2, a first.
    assert ids(ordered(items, durations, [])) == ['b.py::t1', 'b.py::new', 'c.py::t1', 'a.py::t1', 'd.py::t1']


def test_the_order_is_deterministic():
    items = items_of(*(f'f{i % 7}.py::t{i}' for i in range(60)))
    durations = {item.nodeid: float(i * 37 % 11) for i, item in enumerate(items)}
    first = ids(ordered(items, durations, even_shares(len(items), 4)))
    assert sorted(first) == sorted(ids(items))  # a permutation: nothing lost or repeated
    assert all(ids(ordered(list(items), dict(durations), even_shares(len(items), 4))) == first for _ in range(5))


def test_shares_as_xdist_cuts_them():
    assert even_shares(10, 3) == [3, 3, 4]  # worksteal: rest // workers left, as WorkStealingScheduling
    assert even_shares(2, 3) == [0, 1, 1]
    assert sum(even_shares(966, 64)) == 966


def test_every_share_starts_with_one_of_the_longest_files():
    # Collection order puts the two long files last, so worksteal's second worker would get both.
    items = items_of(*(f'fast{i}.py::t' for i in range(6)), 'long1.py::t', 'long2.py::t')
    durations = {**{f'fast{i}.py::t': 0.1 for i in range(6)}, 'long1.py::t': 10.0, 'long2.py::t': 9.0}
    order = ids(ordered(items, durations, even_shares(len(items), 2)))
    assert order[0] == 'long1.py::t' and order[4] == 'long2.py::t', order  # noqa: PT018  (the heads of 4 + 4)


def test_a_file_heavier_than_a_fair_share_is_split_before_its_long_test():
    # 20 s in all over 2 workers: heavy.py (18 s) cannot finish on one worker in time; light.py stays whole.
    items = items_of('heavy.py::t1', 'heavy.py::t2', 'heavy.py::t3', 'heavy.py::t4', 'light.py::t1', 'light.py::t2')
    durations = dict(zip(ids(items), [1.0, 8.0, 1.0, 8.0, 1.0, 1.0], strict=True))
    order = ids(ordered(items, durations, even_shares(len(items), 2)))
    share0, share1 = order[:3], order[3:]
    assert share0 == ['heavy.py::t1', 'heavy.py::t2', 'heavy.py::t3'], order  # 10 s, no more than fair
    assert share1 == ['heavy.py::t4', 'light.py::t1', 'light.py::t2'], order  # the rest, heaviest piece first


def test_without_durations_the_files_that_start_processes_come_first():
    spawning = types.SimpleNamespace(subprocess=object())
    items = [
        Item('a.py::t1'),
        Item('b.py::t1', fixturenames=('pytester',)),
        Item('c.py::t1'),
        Item('d.py::t1', module=spawning),
        Item('d.py::t2', module=spawning),
    ]
    assert ids(ordered(items, {'elsewhere.py::t': 4.0}, even_shares(5, 2))) == [
        'b.py::t1',
        'd.py::t1',
        'd.py::t2',
        'a.py::t1',
        'c.py::t1',
    ]


def test_damaged_cache_entries_are_dropped():
    assert longest_first.valid_durations({'a.py::t': 1, 'b.py::t': -1, 'c.py::t': 'x', 'd.py::t': True}) == {
        'a.py::t': 1.0
    }
    assert longest_first.valid_durations(['a.py::t']) == {}


# --- pytest runs --------------------------------------------------------------------------------------


def test_a_run_records_setup_call_and_teardown_and_keeps_other_entries(pytester):
    pytester.makepyfile(
        test_timed="""
        import time
        import pytest

        @pytest.fixture
        def slow():
            time.sleep(0.1)
            yield
            time.sleep(0.1)

        def test_timed(slow):
            time.sleep(0.1)

        def test_quick():
            pass
        """
    )
    seed(pytester, {'test_timed.py::test_not_run': 7.0, 'gone.py::test_x': 3.0})
    pytester.runpytest(*PLUGIN).assert_outcomes(passed=2)
    recorded = json.loads(cache_file(pytester).read_text())
    assert recorded['test_timed.py::test_timed'] >= 0.3  # setup + call + teardown
    assert recorded['test_timed.py::test_quick'] < 0.1
    assert recorded['test_timed.py::test_not_run'] == 7.0  # not run: kept
    assert 'gone.py::test_x' not in recorded  # its file is gone


def test_the_next_run_starts_with_the_longest_file(pytester):
    pytester.makepyfile(**FILES)
    collection = run_order(pytester.runpytest(*PLUGIN, '-v', '-p', 'no:cacheprovider'))
    assert collection[0] == 'test_a_fast.py::test_a1', collection
    durations = dict.fromkeys(collection, 0.01) | {'test_y_slow.py::test_y1': 2.0, 'test_z_slow.py::test_z2': 5.0}
    seed(pytester, durations)
    order = run_order(pytester.runpytest(*PLUGIN, '-v'))
    assert order == [*collection[5:], *collection[3:5], *collection[:3]], order  # z, y, a, b: heaviest first


def test_without_cacheprovider_the_collection_order_stays_and_nothing_is_written(pytester):
    pytester.makepyfile(**FILES)
    seed(pytester, {'test_z_slow.py::test_z1': 50.0})
    before = cache_file(pytester).read_text()
    order = run_order(pytester.runpytest(*PLUGIN, '-v', '-p', 'no:cacheprovider'))
    assert order == sorted(order), order  # the collection order: files and tests by name here
    assert cache_file(pytester).read_text() == before


def test_failed_first_keeps_pytests_order(pytester):
    pytester.makepyfile(**FILES)
    seed(pytester, {'test_z_slow.py::test_z1': 50.0})
    order = run_order(pytester.runpytest(*PLUGIN, '-v', '--ff'))
    assert order[0] == 'test_a_fast.py::test_a1', order


@pytest.mark.parametrize('dist', ['worksteal', 'load'])
def test_xdist_workers_each_start_on_a_long_file(pytester, dist):
    # Eight files, the two slow ones collected last: in collection order worksteal gives both to one worker.
    files = {f'test_{name}_fast': f'def test_{name}():\n    pass\n' for name in 'abcdef'}
    files |= {'test_y_slow': 'def test_y():\n    pass\n', 'test_z_slow': 'def test_z():\n    pass\n'}
    pytester.makepyfile(**files)
    seed(
        pytester,
        {f'{name}.py::test_{name[5]}': 0.01 for name in files}
        | {'test_y_slow.py::test_y': 9.0, 'test_z_slow.py::test_z': 10.0},
    )
    # The controller runs here, the workers in their own processes; they must all compute the same order.
    result = pytester.runpytest(*PLUGIN, '-v', '-n', '2', '--dist', dist)
    result.assert_outcomes(passed=8)
    first = first_per_worker(result)
    if dist == 'worksteal':  # 2 shares of 4: each worker's first test is a slow one
        assert sorted(first.values()) == ['test_y_slow.py::test_y', 'test_z_slow.py::test_z'], result.stdout.str()
    else:  # load: first batches of 2 tests (4 shares of 2); the slow tests head the two that go out first
        assert set(first.values()) == {'test_y_slow.py::test_y', 'test_z_slow.py::test_z'}, result.stdout.str()
    recorded = json.loads(cache_file(pytester).read_text())
    assert sorted(recorded) == sorted(f'{name}.py::test_{name[5]}' for name in files)  # by the controller
