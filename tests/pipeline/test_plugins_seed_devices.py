"""The seed and device plugins, run through pytester in a child pytest with the project's plugins.

A child in its own process imports torch (and, with the devices plugin, tilelang): seconds each. Runs whose
point is not a fresh process run in this one (`runpytest_inprocess`, where both are imported already);
the seed's stability is compared across processes, as xdist workers would see it.
"""

import pytest

pytest_plugins = ['pytester']

SEED = ('-p', 'tests.testing.plugins.seed')
PLUGINS = (*SEED, '-p', 'tests.testing.plugins.devices')

SEED_TESTS = """
import random
import torch

def test_a():
    print('VALUE a', random.random(), float(torch.rand(1)))

def test_b():
    print('VALUE b', random.random(), float(torch.rand(1)))
"""


def _values(result):
    found = [line[line.index('VALUE ') :].split() for line in result.outlines if 'VALUE ' in line]
    return {words[1]: words[2:] for words in found}


def test_seed_is_stable_per_node_id(pytester):
    pytester.makepyfile(test_seeded=SEED_TESTS)
    # The full run in a child process (its own hash seed, no state of this one), the others here: each
    # comparison is between two processes. The devices plugin plays no part in seeding: not loaded.
    first = _values(pytester.runpytest_subprocess(*SEED, '-s'))
    again = _values(pytester.runpytest_inprocess(*SEED, '-s', 'test_seeded.py::test_b'))
    other = _values(pytester.runpytest_inprocess(*SEED, '-s', '--seed', '7'))
    assert set(first) == {'a', 'b'} and set(again) == {'b'} and set(other) == {'a', 'b'}  # noqa: PT018
    assert first['a'] != first['b'], 'different node IDs get different seeds'
    assert again['b'] == first['b'], 'a node ID sees the same inputs alone or in a full run'
    assert other['a'] != first['a'], '--seed changes the inputs'


def test_seed_must_be_an_integer(pytester):
    pytester.makepyfile(test_seeded=SEED_TESTS)
    result = pytester.runpytest_inprocess(*PLUGINS, '--seed', 'abc')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(['*--seed*invalid int value*'])


@pytest.mark.skipif(
    __import__('torch').cuda.is_available(), reason='checks the skip on a machine without an accelerator'
)
def test_device_tests_skip_with_a_reason(pytester):
    pytester.makepyfile(
        test_dev="""
        import pytest

        @pytest.mark.npu
        def test_on_device(device):
            raise AssertionError('must not run without an accelerator')

        def test_on_cpu():
            pass
        """
    )
    result = pytester.runpytest_inprocess(*PLUGINS, '-rs')
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(['*SKIPPED*needs an accelerator: no Ascend NPU*and no CUDA GPU*'])
