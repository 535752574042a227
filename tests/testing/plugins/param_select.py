"""Which tests a run selects: the test level, `-m` and `-K EXPR`, each checked before any test runs.

- The test level (`OPS_TILELANG_TEST_LEVEL`) and the `-m` and `-k` expressions are checked in `pytest_configure`:
  in the single process or the xdist controller, so a bad value stops the run at once with one
  message (usage error, exit 4) instead of failing the collection of every module on every worker.
- `-K EXPR` keeps the tests whose `params` dict satisfies EXPR ('hidden=4096 or hidden=7168').
  Tests parametrized with `@pytest.mark.parametrize('params', ...)` are judged by their dict
  (`tests/testing/param_expr.py` has the grammar); tests without one are deselected when -K is given,
  and reported as deselected, like -k and -m do. A parameter name that no collected test has (a
  misspelt key) is a usage error listing the names that exist; under xdist the workers hand it to the
  controller (`workeroutput`), which ends the run with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from cann_ops_pipeline.conventions import markexpr_problem, test_level_from_env
from tests.testing import param_expr

_EXPR = pytest.StashKey[param_expr.Expr]()
_PROBLEMS = pytest.StashKey[set[str]]()  # usage errors found after configure (xdist: on the workers)
_WORKEROUTPUT_KEY = 'ops_tilelang_param_select'


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup('cann_ops_tilelang').addoption(
        '-K',
        dest='param_expr',
        default=None,
        metavar='EXPR',
        help="only run tests whose params dict matches EXPR, e.g. 'hidden=4096 or (hc>=4 and dtype=bf16)'; "
        'and/or/not, parentheses, = == != < <= > >=; tests without params are deselected',
    )


def check_selection_expressions(config: pytest.Config) -> None:
    """pytest's own checks of `-m` (syntax; marker names under --strict-markers) and of `-k` (syntax), done here
    once: pytest itself would do them at deselection, on every xdist worker, which ends `-m` in an INTERNALERROR
    traceback per worker and `-k` in one from xdist's controller (pytest-xdist 3.x)."""
    try:  # pytest's own message and rules (syntax, marker names under --strict-markers), where it has them
        from _pytest.mark import _parse_expression, _validate_marker_names
    except ImportError:  # other pytest versions (e.g. an accelerator host's): the syntax, in pytest's words
        _parse_expression = _validate_marker_names = None
    for option, dest in (('-m', 'markexpr'), ('-k', 'keyword')):
        text = config.getoption(dest, None)
        if not text:
            continue
        if _parse_expression is None:
            problem = markexpr_problem(text, option)
            if problem is not None:
                raise pytest.UsageError(problem) from None
            continue
        expression = _parse_expression(text, f"Wrong expression passed to '{option}'")
        if option == '-m':
            _validate_marker_names(expression, config)


@pytest.hookimpl(trylast=True)  # after the plugins have registered their markers
def pytest_configure(config: pytest.Config) -> None:
    config.stash[_PROBLEMS] = set()
    try:
        test_level_from_env()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    check_selection_expressions(config)
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


def unknown_names_problem(expr: param_expr.Expr, text: str, known: set[str]) -> str | None:
    """The usage error for names in `expr` that no collected test's params have, or None."""
    unknown = sorted(param_expr.names(expr) - known)
    if not unknown:
        return None
    listed = ', '.join(sorted(known)) if known else 'none (no collected test has a params dict)'
    return f'-K {text!r}: no collected test has the parameter(s) {", ".join(unknown)}; parameters: {listed}'


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    expr = config.stash.get(_EXPR, None)
    if expr is None:
        return
    selected, deselected, known = [], [], set()
    for item in items:
        params = _params(item)
        known.update(params or ())
        (selected if params is not None and expr.evaluate(params) else deselected).append(item)
    problem = unknown_names_problem(expr, config.getoption('param_expr'), known)
    if problem is not None:
        if not hasattr(config, 'workerinput'):
            raise pytest.UsageError(problem)
        config.stash[_PROBLEMS].add(problem)  # the controller reports it; run nothing here
        selected, deselected = [], items[:]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: take the usage errors a worker found."""
    problems = getattr(node, 'workeroutput', {}).get(_WORKEROUTPUT_KEY, ())
    node.config.stash[_PROBLEMS].update(problems)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    problems = config.stash.get(_PROBLEMS, set())
    if hasattr(config, 'workerinput'):
        config.workeroutput[_WORKEROUTPUT_KEY] = sorted(problems)
    elif problems:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    for problem in sorted(config.stash.get(_PROBLEMS, set())):
        terminalreporter.write_line(f'ERROR: {problem}', red=True, bold=True)
