"""SQL-92 message selectors over message headers (JMS style), parsed once, pure.

``parse_selector(text)`` returns a :class:`Selector` whose ``matches(headers)`` is true
only when the expression is TRUE (SQL's three-valued logic: a missing header is NULL,
comparisons with NULL are UNKNOWN, and UNKNOWN does not match).

Supported: ``=  <>  <  >  <=  >=``, ``AND  OR  NOT``, ``[NOT] IN ('a', 'b')``,
``[NOT] LIKE 'pat%_' [ESCAPE '\\']``, ``[NOT] BETWEEN x AND y``, ``IS [NOT] NULL``,
``+ - * /`` and unary minus, parentheses, string literals in single quotes (``''``
is a quote), integer and decimal numbers, ``TRUE``/``FALSE``.  Identifiers
(``[A-Za-z_$][A-Za-z0-9_$]*``) name headers; keywords are case-insensitive.  Header
values are strings: compared with a number they are read as numbers (a value that is
not a number makes the comparison UNKNOWN).  Integers are longs: one beyond 64 bits
(a value, a literal, a result) is read as a float, as JMS reads it.

Limits: :data:`MAX_SELECTOR_LENGTH` characters, :data:`MAX_DEPTH` nesting levels
(parentheses and NOT).  What one evaluation costs is bounded by the text, whatever the
headers: AND/OR chains are balanced trees (log2 of their length deep), arithmetic chains
and runs of signs loops, ``LIKE`` never backtracks (:func:`_like_matcher`), numbers stay
within a float.  A selector that cannot be parsed raises :class:`SelectorError` (the
only exception :func:`parse_selector` raises; its message says what is wrong).

One home for both doors: STOMP's ``selector`` on SUBSCRIBE (``broker.stomp.subscription``)
and TMQP's ``Selector`` header on JOIN (``broker.engine.operations``); the engine applies
a consumer's selector through :meth:`Selector.selects` (headers as a message carries them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

MAX_SELECTOR_LENGTH = 4096
MAX_DEPTH = 64

Value = bool | int | float | str | None
#: Integers are JMS longs: one beyond (a header value, a literal, a result) is read as a
#: float, so arithmetic costs the same whatever the operands (a product of 1000 terms of
#: a 4000-digit header took 40 s of CPU on exact integers).
_LONG = 2**63
Env = Mapping[str, str]
Eval = Callable[[Env], Value]


class SelectorError(ValueError):
    """A selector that cannot be parsed (too long, too deep, not SQL-92 as above)."""


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<num>\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?)
      | (?P<str>'(?:[^']|'')*')
      | (?P<id>[A-Za-z_$][A-Za-z0-9_$]*)
      | (?P<op><>|<=|>=|[=<>()+\-*/,])
    )""",
    re.VERBOSE,
)
_KEYWORDS = {
    "AND", "OR", "NOT", "IN", "LIKE", "ESCAPE", "BETWEEN", "IS", "NULL", "TRUE", "FALSE"
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "num", "str", "id", "kw", "op", "end"
    text: str


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise SelectorError(f"selector: unexpected {text[pos : pos + 20].strip()!r}")
        kind = match.lastgroup or ""
        value = match.group(kind)
        if kind == "id" and value.upper() in _KEYWORDS:
            tokens.append(_Token("kw", value.upper()))
        else:
            tokens.append(_Token(kind, value))
        pos = match.end()
    tokens.append(_Token("end", ""))
    return tokens


@dataclass(frozen=True, slots=True)
class Selector:
    text: str
    _eval: Eval

    def matches(self, headers: Env) -> bool:
        return self._eval(headers) is True

    def selects(self, headers: Sequence[tuple[str, str]]) -> bool:
        """:meth:`matches` on header lines as a message carries them (a repeated name:
        its first value)."""
        return self._eval(first_wins(headers)) is True


def first_wins(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Headers as a selector reads them (a repeated name: its first value)."""
    env: dict[str, str] = {}
    for name, value in headers:
        env.setdefault(name, value)
    return env


def parse_selector(text: str) -> Selector:
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(f"selector longer than {MAX_SELECTOR_LENGTH} characters")
    parser = _Parser(_tokenize(text))
    evaluate = parser.expression()
    if parser.peek.kind != "end":
        raise SelectorError(f"selector: unexpected {parser.peek.text!r}")
    return Selector(text, evaluate)


# -- three-valued helpers -------------------------------------------------------------------


def _number(value: Value) -> int | float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return value
    try:
        number = int(value)
        if -9223372036854775808 <= number <= 9223372036854775807:  # (a long: -_LONG..)
            return number
    except ValueError:
        pass
    try:
        return float(value)  # (beyond a long: a float, as JMS reads a long that large)
    except ValueError:
        return None


def _compare(op: str, left: Value, right: Value) -> Value:
    if left is None or right is None:
        return None
    if isinstance(left, bool) or isinstance(right, bool):
        if op not in ("=", "<>") or not (isinstance(left, bool) and isinstance(right, bool)):
            return None
        return (left == right) == (op == "=")
    a: Value = left
    b: Value = right
    if isinstance(left, int | float) or isinstance(right, int | float):
        a, b = _number(left), _number(right)
        if a is None or b is None:
            return None
    assert not isinstance(a, bool | None) and not isinstance(b, bool | None)
    if isinstance(a, str) != isinstance(b, str):
        return None
    if op == "=":
        return a == b
    if op == "<>":
        return a != b
    if op == "<":
        return a < b  # type: ignore[operator]
    if op == ">":
        return a > b  # type: ignore[operator]
    if op == "<=":
        return a <= b  # type: ignore[operator]
    return a >= b  # type: ignore[operator]


def _not(value: Value) -> Value:
    return None if value is None else not value


def _and(left: Value, right: Value) -> Value:
    if left is False or right is False:
        return False
    if left is None or right is None:
        return None
    return True


def _or(left: Value, right: Value) -> Value:
    if left is True or right is True:
        return True
    if left is None or right is None:
        return None
    return False


def _like_matcher(pattern: str, escape: str | None) -> Callable[[str], object]:
    """A LIKE pattern as a test of a whole value, without backtracking.

    A regex with one ``.*`` per ``%`` backtracks: ``'%a%a%a%a%a%a%a%a%a%a%a%a%b'`` against
    a value of 40 ``a`` did not finish in a minute, on the thread that offers every
    message to its consumers.  Here the pattern is cut at each ``%`` into segments of
    fixed width (literal characters and ``_``): the first must match at the start, the
    last at the end, and each one between at its leftmost place after the one before
    (a ``%`` takes any run, so the leftmost place never loses a match) -- at most one
    scan of the value per segment.  A pattern with one ``%`` or none stays one regex
    (``prefix.*suffix`` backs off the one ``.*`` at most once along the value)."""
    segments: list[list[str]] = [[]]
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape and i + 1 < len(pattern):
            segments[-1].append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if ch == "%":
            segments.append([])
        else:
            segments[-1].append("." if ch == "_" else re.escape(ch))
        i += 1
    if len(segments) <= 2:  # no % or one: ``prefix.*suffix`` never backtracks far
        whole = re.compile(".*".join("".join(pieces) for pieces in segments), re.DOTALL)
        return whole.fullmatch  # (a match or None: true or false, without a call more)
    compiled = [re.compile("".join(pieces), re.DOTALL) for pieces in segments]
    first, middle, last = compiled[0], compiled[1:-1], compiled[-1]
    head, tail = len(segments[0]), len(segments[-1])  # (each piece is one character)

    def matches(value: str) -> bool:
        end = len(value) - tail
        if end < head or first.match(value) is None or last.fullmatch(value, end) is None:
            return False
        pos = head
        for segment in middle:
            found = segment.search(value, pos, end)
            if found is None:
                return False
            pos = found.end()
        return True

    return matches


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0

    @property
    def peek(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind != "end":
            self.index += 1
        return token

    def accept(self, kind: str, text: str) -> bool:
        if self.peek.kind == kind and self.peek.text == text:
            self.index += 1
            return True
        return False

    def expect(self, kind: str, text: str) -> None:
        if not self.accept(kind, text):
            raise SelectorError(f"selector: expected {text!r}, got {self.peek.text!r}")

    def expression(self) -> Eval:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SelectorError(f"selector nested deeper than {MAX_DEPTH} levels")
        terms = [self.conjunction()]
        while self.accept("kw", "OR"):
            terms.append(self.conjunction())
        self.depth -= 1
        return _balanced(_or, terms)

    def conjunction(self) -> Eval:
        terms = [self.negation()]
        while self.accept("kw", "AND"):
            terms.append(self.negation())
        return _balanced(_and, terms)

    def negation(self) -> Eval:
        if self.accept("kw", "NOT"):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise SelectorError(f"selector nested deeper than {MAX_DEPTH} levels")
            inner = self.negation()
            self.depth -= 1
            return lambda env: _not(inner(env))
        return self.comparison()

    def comparison(self) -> Eval:
        left = self.additive()
        token = self.peek
        if token.kind == "op" and token.text in ("=", "<>", "<", ">", "<=", ">="):
            self.take()
            right = self.additive()
            op = token.text
            return lambda env: _compare(op, left(env), right(env))
        if self.accept("kw", "IS"):
            negate = self.accept("kw", "NOT")
            self.expect("kw", "NULL")
            return lambda env: (left(env) is None) != negate
        negate = self.accept("kw", "NOT")
        if self.accept("kw", "BETWEEN"):
            low = self.additive()
            self.expect("kw", "AND")
            high = self.additive()

            def between(env: Env) -> Value:
                value = left(env)
                inside = _and(_compare(">=", value, low(env)), _compare("<=", value, high(env)))
                return _not(inside) if negate else inside

            return between
        if self.accept("kw", "IN"):
            self.expect("op", "(")
            items = [self.string()]
            while self.accept("op", ","):
                items.append(self.string())
            self.expect("op", ")")
            choices = frozenset(items)

            def within(env: Env) -> Value:
                value = left(env)
                if not isinstance(value, str):
                    return None
                return (value in choices) != negate

            return within
        if self.accept("kw", "LIKE"):
            pattern = self.string()
            escape = self.string() if self.accept("kw", "ESCAPE") else None
            if escape is not None and len(escape) != 1:
                raise SelectorError("selector: ESCAPE takes one character")
            fits = _like_matcher(pattern, escape)

            def like(env: Env) -> Value:
                value = left(env)
                if not isinstance(value, str):
                    return None
                return (not fits(value)) == negate  # (a match object is true)

            return like
        if negate:
            raise SelectorError("selector: NOT must precede BETWEEN, IN or LIKE here")
        return left

    def string(self) -> str:
        token = self.take()
        if token.kind != "str":
            raise SelectorError(f"selector: expected a quoted string, got {token.text!r}")
        return token.text[1:-1].replace("''", "'")

    def additive(self) -> Eval:
        first = self.multiplicative()
        rest: list[tuple[str, Eval]] = []
        while self.peek.kind == "op" and self.peek.text in ("+", "-"):
            op = self.take().text
            rest.append((op, self.multiplicative()))
        return _arith(first, rest) if rest else first

    def multiplicative(self) -> Eval:
        first = self.unary()
        rest: list[tuple[str, Eval]] = []
        while self.peek.kind == "op" and self.peek.text in ("*", "/"):
            op = self.take().text
            rest.append((op, self.unary()))
        return _arith(first, rest) if rest else first

    def unary(self) -> Eval:
        # a run of signs is read in a loop (no recursion); one minus or three: negated
        minus = signed = False
        while self.peek.kind == "op" and self.peek.text in ("-", "+"):
            minus ^= self.take().text == "-"
            signed = True
        inner = self.primary()
        if not signed:
            return inner
        if minus:
            return _arith(_ZERO, [("-", inner)])
        return _arith(inner, [("+", _ZERO)])  # a number (or NULL), as a sign makes it

    def primary(self) -> Eval:
        token = self.take()
        if token.kind == "num":
            number = _number(token.text)
            return lambda env: number
        if token.kind == "str":
            text = token.text[1:-1].replace("''", "'")
            return lambda env: text
        if token.kind == "id":
            name = token.text
            return lambda env: env.get(name)
        if token.kind == "kw" and token.text in ("TRUE", "FALSE"):
            flag = token.text == "TRUE"
            return lambda env: flag
        if token.kind == "op" and token.text == "(":
            inner = self.expression()
            self.expect("op", ")")
            return inner
        shown = token.text or "the end"
        raise SelectorError(f"selector: unexpected {shown!r}")


def _ZERO(env: Env) -> Value:
    return 0


def _balanced(combine: Callable[[Value, Value], Value], terms: list[Eval]) -> Eval:
    """The terms of an OR (or AND) chain as a balanced tree of pairs: Kleene's AND and OR
    are associative, and a chain of n terms is log2(n) calls deep when evaluated, not n
    (every term is evaluated, as before)."""
    while len(terms) > 1:
        paired = [
            (lambda a, b: lambda env: combine(a(env), b(env)))(terms[i], terms[i + 1])
            for i in range(0, len(terms) - 1, 2)
        ]
        if len(terms) % 2:
            paired.append(terms[-1])
        terms = paired
    return terms[0]


def _arith(first: Eval, rest: list[tuple[str, Eval]]) -> Eval:
    """``first op1 t1 op2 t2 ...`` left to right in a loop (a long chain costs no
    recursion); NULL when a term is not a number, or on a division by zero."""
    if len(rest) == 1:  # (the usual ``a * 2``: no loop)
        op, second = rest[0]
        return lambda env: _apply(op, _number(first(env)), _number(second(env)))

    def evaluate(env: Env) -> Value:
        a = _number(first(env))
        for op, term in rest:
            a = _apply(op, a, _number(term(env)))
            if a is None:
                return None
        return a

    return evaluate


def _apply(op: str, a: int | float | None, b: int | float | None) -> int | float | None:
    """``a op b`` (NULL when either is, or on a division by zero); an integer result
    beyond a long is a float."""
    if a is None or b is None:
        return None
    if op == "+":
        result = a + b
    elif op == "-":
        result = a - b
    elif op == "*":
        result = a * b
    elif b == 0:
        return None
    else:
        result = a / b
    if result.__class__ is int and not -_LONG <= result < _LONG:
        return float(result)
    return result
