"""Expressions over a test's `params` dict, for `-K`: 'hidden=4096 or (hc>=4 and dtype=bf16)'.

Grammar (a small recursive-descent parser; nothing is eval'ed)::

    expr       := and_expr ('or' and_expr)*
    and_expr   := not_expr ('and' not_expr)*
    not_expr   := 'not' not_expr | '(' expr ')' | comparison
    comparison := NAME OP VALUE          OP: = == != < <= > >=   ('=' and '==' are the same)
    VALUE      := number | word | 'quoted string' | "quoted string"

A word is a run of letters, digits and `_ . + -` (so `bf16`, `-1`, `1.5e3`, `4x8`). A value that
reads as an int or a float compares numerically with an int or float parameter; every other
comparison compares strings, the parameter written as in the test ID (`bench.format_param_value`:
dtypes as `bf16`/`fp32`, tuples as `4x8`). A comparison on a name the params lack is false.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Mapping

KEYWORDS = ('and', 'or', 'not')
_OPERATORS: dict[str, Callable] = {
    '=': operator.eq,
    '==': operator.eq,
    '!=': operator.ne,
    '<': operator.lt,
    '<=': operator.le,
    '>': operator.gt,
    '>=': operator.ge,
}
_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<op>==|!=|<=|>=|=|<|>)
      | (?P<paren>[()])
      | (?P<string>'[^']*'|"[^"]*")
      | (?P<word>[A-Za-z0-9_.+\-]+)""",
    re.VERBOSE,
)
_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
_INT = re.compile(r'[+-]?[0-9]+')
_FLOAT = re.compile(r'[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?')


class ParamExprError(ValueError):
    """A malformed expression; `column` is 1-based."""

    def __init__(self, text: str, column: int, problem: str):
        super().__init__(f'{problem} at column {column}\n  {text}\n  {" " * (column - 1)}^')
        self.text = text
        self.column = column
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class _Token:
    kind: str  # 'op', 'paren', 'string', 'word', 'end'
    text: str
    column: int


def _tokenize(text: str) -> list[_Token]:
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            if text[pos] in '\'"':
                raise ParamExprError(text, pos + 1, 'unterminated string')
            raise ParamExprError(text, pos + 1, f'unexpected character {text[pos]!r}')
        if match.lastgroup != 'space':
            tokens.append(_Token(match.lastgroup, match.group(), pos + 1))
        pos = match.end()
    tokens.append(_Token('end', '', len(text) + 1))
    return tokens


def _literal(token: _Token) -> int | float | str:
    if token.kind == 'string':
        return token.text[1:-1]
    if _INT.fullmatch(token.text):
        return int(token.text)
    if _FLOAT.fullmatch(token.text):
        return float(token.text)
    return token.text


@dataclasses.dataclass(frozen=True)
class Compare:
    name: str
    op: str
    value: int | float | str

    def evaluate(self, params: Mapping) -> bool:
        if self.name not in params:
            return False
        actual, expected = params[self.name], self.value
        numeric = (int, float)
        if not (isinstance(actual, numeric) and not isinstance(actual, bool) and isinstance(expected, numeric)):
            from tests.testing.bench import format_param_value  # imports torch: only when params are judged

            actual, expected = format_param_value(actual), str(expected)
        return _OPERATORS[self.op](actual, expected)


@dataclasses.dataclass(frozen=True)
class Not:
    operand: Expr

    def evaluate(self, params: Mapping) -> bool:
        return not self.operand.evaluate(params)


@dataclasses.dataclass(frozen=True)
class And:
    left: Expr
    right: Expr

    def evaluate(self, params: Mapping) -> bool:
        return self.left.evaluate(params) and self.right.evaluate(params)


@dataclasses.dataclass(frozen=True)
class Or:
    left: Expr
    right: Expr

    def evaluate(self, params: Mapping) -> bool:
        return self.left.evaluate(params) or self.right.evaluate(params)


Expr = Compare | Not | And | Or


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokenize(text)
        self.pos = 0

    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def take(self) -> _Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def error(self, token: _Token, problem: str) -> ParamExprError:
        return ParamExprError(self.text, token.column, problem)

    def at_keyword(self, keyword: str) -> bool:
        token = self.peek()
        return token.kind == 'word' and token.text == keyword

    def parse(self) -> Expr:
        if self.peek().kind == 'end':
            raise self.error(self.peek(), 'empty expression')
        expr = self.or_expr()
        token = self.peek()
        if token.kind != 'end':
            raise self.error(token, f"expected 'and', 'or' or the end, got {token.text!r}")
        return expr

    def or_expr(self) -> Expr:
        expr = self.and_expr()
        while self.at_keyword('or'):
            self.take()
            expr = Or(expr, self.and_expr())
        return expr

    def and_expr(self) -> Expr:
        expr = self.not_expr()
        while self.at_keyword('and'):
            self.take()
            expr = And(expr, self.not_expr())
        return expr

    def not_expr(self) -> Expr:
        if self.at_keyword('not'):
            self.take()
            return Not(self.not_expr())
        token = self.peek()
        if token.kind == 'paren' and token.text == '(':
            self.take()
            expr = self.or_expr()
            close = self.peek()
            if not (close.kind == 'paren' and close.text == ')'):
                raise self.error(close, f"expected ')' to close the '(' at column {token.column}")
            self.take()
            return expr
        return self.comparison()

    def comparison(self) -> Compare:
        name = self.take()
        if name.kind == 'end':
            raise self.error(name, 'expected a comparison, got the end')
        if name.kind != 'word' or name.text in KEYWORDS or not _NAME.fullmatch(name.text):
            raise self.error(name, f'expected a parameter name, got {name.text!r}')
        op = self.take()
        if op.kind != 'op':
            got = 'the end' if op.kind == 'end' else repr(op.text)
            raise self.error(op, f'expected a comparison (= == != < <= > >=) after {name.text!r}, got {got}')
        value = self.take()
        if value.kind not in ('word', 'string') or (value.kind == 'word' and value.text in KEYWORDS):
            got = 'the end' if value.kind == 'end' else repr(value.text)
            raise self.error(value, f'expected a value after {name.text!r} {op.text}, got {got}')
        return Compare(name.text, op.text, _literal(value))


def parse(text: str) -> Expr:
    """The expression tree of `text`; a malformed one raises ParamExprError naming the column."""
    return _Parser(text).parse()


def names(expr: Expr) -> set[str]:
    """The parameter names an expression compares."""
    if isinstance(expr, Compare):
        return {expr.name}
    if isinstance(expr, Not):
        return names(expr.operand)
    return names(expr.left) | names(expr.right)


def matches(text: str, params: Mapping) -> bool:
    """Whether `params` satisfies the expression `text`."""
    return parse(text).evaluate(params)
