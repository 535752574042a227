"""The -K expression language (tests/testing/param_expr.py) and its pytest option."""

from __future__ import annotations

import re

import pytest
import torch

from cann_ops_pipeline.conventions import LEVEL_ENV
from tests.testing import param_expr
from tests.testing.param_expr import And, Compare, Not, Or, ParamExprError, matches, parse

pytest_plugins = ['pytester']

PARAMS = {'hc': 4, 'hidden': 4096, 'num_tokens': 4001, 'dtype': torch.bfloat16, 'scale': 0.5, 'name': 'gate'}


def test_or_binds_looser_than_and_and_not_binds_tightest():
    assert parse('a=1 or b=2 and c=3') == Or(Compare('a', '=', 1), And(Compare('b', '=', 2), Compare('c', '=', 3)))
    assert parse('not a=1 and b=2') == And(Not(Compare('a', '=', 1)), Compare('b', '=', 2))
    assert parse('a=1 and b=2 or c=3') == Or(And(Compare('a', '=', 1), Compare('b', '=', 2)), Compare('c', '=', 3))
    assert parse('not not a=1') == Not(Not(Compare('a', '=', 1)))


def test_parentheses_override_precedence():
    assert parse('(a=1 or b=2) and c=3') == And(Or(Compare('a', '=', 1), Compare('b', '=', 2)), Compare('c', '=', 3))
    assert matches('(hidden=7168 or hc=4) and num_tokens=4001', PARAMS)
    assert not matches('hidden=7168 or hc=4 and num_tokens=1', PARAMS)
    assert not matches('(hidden=7168 or hc=4) and num_tokens=1', PARAMS)
    assert matches('hc=4 and (not (hidden=7168))', PARAMS)


@pytest.mark.parametrize(
    ('expr', 'expected'),
    [
        ('hidden=4096', True),
        ('hidden==4096', True),
        ('hidden=4096.0', True),
        ('hidden!=4096', False),
        ('hidden<7168', True),
        ('hidden<=4096', True),
        ('hidden>4096', False),
        ('hidden>=4096', True),
        ('num_tokens>1e3', True),
        ('scale=0.5', True),
        ('scale<.75', True),
        ('hc>-1', True),
        ('hidden = 4096 or hidden = 7168', True),
        ('dtype=bf16', True),
        ('dtype!=fp32', True),
        ("name='gate'", True),
        ('name="gate"', True),
        ('name>gamma', True),  # strings compare as strings: 'gate' > 'gamma'
        ('name>=gate', True),
        ('hidden=abc', False),  # a string value compares with the parameter as written
        ('missing=1', False),
        ('missing!=1', False),
        ('not missing=1', True),
    ],
)
def test_comparisons(expr, expected):
    assert matches(expr, PARAMS) is expected


@pytest.mark.parametrize(
    ('expr', 'column', 'problem'),
    [
        ('', 1, 'empty expression'),
        ('hidden=', 8, 'expected a value'),
        ('hidden 4096', 8, 'expected a comparison'),
        ('hidden', 7, 'expected a comparison'),
        ('(hidden=1', 10, "expected ')'"),
        ('hidden=1)', 9, "expected 'and', 'or' or the end"),
        ('hidden=1 hc=2', 10, "expected 'and', 'or' or the end"),
        ('hidden=1 or', 12, 'expected a comparison, got the end'),
        ('and hidden=1', 1, 'expected a parameter name'),
        ('hidden=1 and or', 14, 'expected a parameter name'),
        ('4096=hidden', 1, 'expected a parameter name'),
        ('hidden=or', 8, 'expected a value'),
        ("name='gate", 6, 'unterminated string'),
        ('hidden=1 & hc=4', 10, "unexpected character '&'"),
        ('hidden=<4', 8, 'expected a value'),
    ],
)
def test_malformed_expressions_name_the_column(expr, column, problem):
    with pytest.raises(ParamExprError, match=re.escape(problem)) as info:
        parse(expr)
    assert info.value.column == column
    assert f'at column {column}' in str(info.value)


# The ids as tests.testing.bench.make_param_id writes them for int parameters (checked below), without
# importing bench, i.e. torch: the xdist workers of these inner runs would spend seconds on it, for ids alone.
TEST_FILE = """
import pytest

def make_param_id(params):
    return '-'.join(f'{k}={v}' for k, v in params.items())

@pytest.mark.parametrize('params', [{'hidden': h, 'hc': 4} for h in (64, 4096, 7168)], ids=make_param_id)
def test_with_params(params):
    pass

@pytest.mark.parametrize('x', [1, 2])
def test_other_parameter(x):
    pass

def test_plain():
    pass
"""


# Off in these inner runs, each costs ~0.5-1.5 s a run: unraisableexception's gc.collect() with torch
# loaded, and hypothesis' plugin re-importing hypothesis (pytester unloads what a run imported).
QUIET = ('-p', 'no:cacheprovider', '-p', 'no:unraisableexception', '-p', 'no:hypothesispytest')


@pytest.fixture
def k_pytester(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest("pytest_plugins = ['tests.testing.plugins.param_select']")
    pytester.makepyfile(test_k=TEST_FILE)
    return pytester


def test_option_selects_by_params_and_deselects_tests_without_params(k_pytester):
    result = k_pytester.runpytest(*QUIET, '-v', '-K', 'hidden=4096 or hidden=7168')
    result.assert_outcomes(passed=2, deselected=4)
    result.stdout.fnmatch_lines(
        ['*test_with_params?hidden=4096-hc=4? PASSED*', '*test_with_params?hidden=7168-hc=4? PASSED*']
    )
    result.stdout.no_fnmatch_line('*hidden=64*PASSED*')


def test_option_not_and_parentheses(k_pytester):
    k_pytester.runpytest(*QUIET, '-K', 'not (hidden>64 and hc=4)').assert_outcomes(passed=1, deselected=5)


def test_without_option_everything_runs(k_pytester):
    k_pytester.runpytest(*QUIET).assert_outcomes(passed=6)


def test_option_malformed_is_a_usage_error_with_the_column(k_pytester):
    result = k_pytester.runpytest(*QUIET, '-K', 'hidden=4096 or')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(['*-K: expected a comparison, got the end at column 15*'])


def test_the_inner_ids_are_the_projects():
    from tests.testing.bench import make_param_id

    assert make_param_id({'hidden': 4096, 'hc': 4}) == 'hidden=4096-hc=4'


def test_names_of_an_expression():
    assert param_expr.names(parse('not (hidden>64 and hc=4) or dtype=bf16')) == {'hidden', 'hc', 'dtype'}


@pytest.mark.parametrize('xdist', [(), ('-n', '2')], ids=['in-process', 'xdist'])
def test_a_parameter_no_test_has_is_a_usage_error_listing_the_parameters(k_pytester, xdist):
    # In this process (under xdist: the controller; the workers, which find the problem, in their own): a
    # child process would only add a start-up.
    result = k_pytester.runpytest_inprocess(*QUIET, *xdist, '-K', 'hiden=4096 or hc=4')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    message = "-K 'hiden=4096 or hc=4': no collected test has the parameter(s) hiden; parameters: hc, hidden"
    assert output.count(message) == 1, output
    assert not re.search(r'\d+ passed', output)


@pytest.mark.parametrize('xdist', [(), ('-n', '2')], ids=['in-process', 'xdist'])
@pytest.mark.parametrize(
    ('args', 'env', 'message'),
    [
        (
            ('-m', 'npu or'),
            {},
            "Wrong expression passed to '-m': npu or: at column 7: expected not OR left parenthesis",
        ),
        (('-k', 'hc=4'), {}, "Wrong expression passed to '-k': hc=4: at column 3: expected end of input; got ="),
        ((), {LEVEL_ENV: '7'}, f"{LEVEL_ENV}='7' is not a test level: use 0 (core), 1 (default) or 2 (full)"),
        ((), {LEVEL_ENV: 'abc'}, f"{LEVEL_ENV}='abc' is not a test level"),
    ],
    ids=['markexpr', 'keyword', 'level-7', 'level-abc'],
)
def test_bad_selection_stops_the_run_before_any_test_with_one_message(
    k_pytester, monkeypatch, xdist, args, env, message
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = k_pytester.runpytest_inprocess(*QUIET, *xdist, *args)  # as above
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert output.count(message) == 1, output
    assert 'INTERNALERROR' not in output
    assert not re.search(r'\d+ passed', output)
