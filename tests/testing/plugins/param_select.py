"""-K EXPR: keep the tests whose `params` dict satisfies EXPR ('hidden=4096 or hidden=7168').

Tests parametrized with `@pytest.mark.parametrize('params', ...)` are judged by their dict
(`tests/testing/param_expr.py` has the grammar); tests without one are deselected when -K is given.
Deselected tests are reported as such, like -k and -m do.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from tests.testing import param_expr

_EXPR = pytest.StashKey[param_expr.Expr]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup('cann_ops_tilelang').addoption(
        '-K',
        dest='param_expr',
        default=None,
        metavar='EXPR',
        help="only run tests whose params dict matches EXPR, e.g. 'hidden=4096 or (hc>=4 and dtype=bf16)'; "
        'and/or/not, parentheses, = == != < <= > >=; tests without params are deselected',
    )


def pytest_configure(config: pytest.Config) -> None:
    text = config.getoption('param_expr')
    if text is None:
        return
    try:
        config.stash[_EXPR] = param_expr.parse(text)
    except param_expr.ParamExprError as exc:
        raise pytest.UsageError(f'-K: {exc}') from None


def _params(item: pytest.Item) -> Mapping | None:
    callspec = getattr(item, 'callspec', None)
    params = callspec.params.get('params') if callspec is not None else None
    return params if isinstance(params, Mapping) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    expr = config.stash.get(_EXPR, None)
    if expr is None:
        return
    selected, deselected = [], []
    for item in items:
        params = _params(item)
        (selected if params is not None and expr.evaluate(params) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
