"""Test levels and parameter generators."""

import pytest

from cann_ops_pipeline.conventions import LEVEL_ENV
from tests.testing.generator import (
    BENCHMARK_HIDDEN,
    BENCHMARK_NUM_TOKENS,
    gen_benchmark_shapes,
    gen_hc,
    gen_hidden,
    gen_num_tokens,
    generate_samples,
    get_test_level,
    merge_samples,
)


def test_default_level_is_one(monkeypatch):
    monkeypatch.delenv(LEVEL_ENV, raising=False)
    assert get_test_level() == 1
    monkeypatch.setenv(LEVEL_ENV, '  ')
    assert get_test_level() == 1


@pytest.mark.parametrize('value', ['0', '1', '2', ' 2 '])
def test_valid_levels(monkeypatch, value):
    monkeypatch.setenv(LEVEL_ENV, value)
    assert get_test_level() == int(value)


@pytest.mark.parametrize('value', ['3', '-1', 'one', '1.0', 'full'])
def test_invalid_level_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(LEVEL_ENV, value)
    with pytest.raises(ValueError, match=f'{LEVEL_ENV}=.*is not a test level'):
        get_test_level()


@pytest.mark.parametrize('gen', [gen_num_tokens, gen_hidden, gen_hc])
def test_levels_grow_and_nest(gen):
    core, default, full = gen(0), gen(1), gen(2)
    assert set(core) < set(default) < set(full)
    assert len(set(full)) == len(full), 'no duplicates'


def test_shapes_cover_the_contract():
    assert 0 in gen_num_tokens(0), 'empty input in the core set'
    assert all(h % 64 == 0 and 64 <= h <= 16384 for h in gen_hidden(2))
    assert {64, 16384} <= set(gen_hidden(2))
    assert {1, 8} <= set(gen_hc(2))
    assert set(BENCHMARK_NUM_TOKENS) <= set(gen_num_tokens(2))
    assert set(BENCHMARK_HIDDEN) <= set(gen_hidden(2))
    assert any(t % 128 not in (0,) for t in gen_num_tokens(1)), 'a token count that divides no block'


def test_benchmark_shapes():
    shapes = gen_benchmark_shapes()
    assert len(shapes) == len(BENCHMARK_NUM_TOKENS) * len(BENCHMARK_HIDDEN)  # 3 x 4 since the production sizes
    assert shapes[0] == {'num_tokens': 4001, 'hidden': 4096, 'hc': 4}


def test_generate_samples_product_filter_and_levels():
    samples = generate_samples(0, hc=gen_hc, hidden=[64, 128], where=lambda s: s['hidden'] != 128)
    assert samples == [{'hc': 4, 'hidden': 64}]
    assert len(generate_samples(a=[1, 2], b=[3, 4, 5])) == 6
    with pytest.raises(ValueError, match='level generator'):
        generate_samples(hc=gen_hc)
    with pytest.raises(ValueError, match='test level must be one of'):
        generate_samples(5, hc=gen_hc)


def test_merge_samples_drops_duplicates():
    assert merge_samples([{'a': 1}, {'a': 2}], [{'a': 1}, {'a': 3}]) == [{'a': 1}, {'a': 2}, {'a': 3}]


@pytest.mark.parametrize(('level', 'accelerator', 'skipped'), [(0, True, True), (1, True, False), (0, False, False)])
def test_lowering_skips_only_at_level_0_on_accelerator_hosts(monkeypatch, level, accelerator, skipped):
    from tests.testing import lowering
    from tests.testing.plugins import devices

    monkeypatch.setenv(LEVEL_ENV, str(level))
    monkeypatch.setattr(devices, 'real_accelerator', lambda: accelerator)
    lowered = []
    try:
        lowering.lower_kernel(lambda: lowered.append(1), backend='cuda', key=('skip-test', level, accelerator))
    except pytest.skip.Exception:
        assert skipped
    except Exception:  # got past the skip to the lowering of a non-kernel
        assert not skipped
        assert lowered == [1]
    else:
        pytest.fail('lowering a non-kernel passed')
