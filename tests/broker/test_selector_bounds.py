"""What one selector evaluation may cost (``broker.selector``), each bounded: ``LIKE``
matched without backtracking (the same answers as a backtracking regex, the oracle
below, on short values), long chains and runs of signs without recursion, integers
beyond a long read as floats.  Each case here froze or crashed the evaluation before."""

from __future__ import annotations

import random
import re

from broker.selector import parse_selector


def oracle(pattern: str, escape: str | None, value: str) -> bool:
    """LIKE by a regex with one ``.*`` per ``%`` (fine for short values)."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.fullmatch("".join(out), value, re.DOTALL) is not None


def quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def test_like_agrees_with_a_backtracking_regex_on_short_values() -> None:
    rng = random.Random(17)
    for _ in range(3000):
        pattern = "".join(rng.choice("ab%_!") for _ in range(rng.randrange(0, 8)))
        escape = rng.choice([None, "!"])
        text = f"v LIKE {quoted(pattern)}" + (f" ESCAPE {quoted(escape)}" if escape else "")
        selector = parse_selector(text)
        for _ in range(5):
            value = "".join(rng.choice("ab!%_\n") for _ in range(rng.randrange(0, 9)))
            assert selector.selects([("v", value)]) == oracle(pattern, escape, value), (
                text,
                value,
            )


def test_a_pattern_of_many_percents_costs_one_scan_per_segment() -> None:
    # a regex of 30 ``.*`` backtracks over these: the first version (session 16's STOMP
    # selector) did not finish with 40 characters; the test timeout stops it
    selector = parse_selector("v LIKE '" + "%a" * 30 + "%b'")
    assert not selector.selects([("v", "a" * 50_000 + "c")])
    assert selector.selects([("v", "a" * 50_000 + "b")])
    assert not selector.selects([("v", "a" * 29 + "b")])
    assert selector.selects([("v", "xa" * 30 + "yb")])


def test_long_chains_and_runs_of_signs_parse_and_evaluate_without_recursion() -> None:
    # each was a RecursionError: chains of 1000 closures deep, a parse recursing per sign
    product = parse_selector("a" + " * a" * 1000 + " > 1")
    assert product.selects([("a", "2")]) and not product.selects([("a", "x")])
    either = parse_selector(" OR ".join(f"a={i}" for i in range(400)))
    assert either.selects([("a", "399")]) and not either.selects([("a", "400")])
    both = parse_selector(" AND ".join(["a > 1"] * 400))
    assert both.selects([("a", "2")]) and not both.selects([("a", "1")])
    assert parse_selector("-" * 3000 + "a = 9").selects([("a", "9")])  # even: plus
    assert parse_selector("-" * 3001 + "a = -9").selects([("a", "9")])  # odd: minus
    assert parse_selector("+ - + a = -9 AND 1 - 2 - 3 = -4 AND 8 / 2 / 2 = 2").selects(
        [("a", "9")]
    )
    assert not parse_selector("- a = 9").selects([("a", "x")])  # a sign makes a number


def test_integers_beyond_a_long_are_floats() -> None:
    """JMS reads numbers as longs and doubles: 2**63 is a double, where adding 1 is lost;
    a product of 1000 terms of a 4000-digit header (exact integers of four million
    digits: 40 s of CPU per evaluation before) is a float, infinite here."""
    grows = parse_selector("a + 1 > a")
    assert grows.selects([("a", str(2**62))])
    assert not grows.selects([("a", str(2**63))])
    assert parse_selector("a" + " * a" * 1000 + " > 1e300").selects([("a", "9" * 4000)])
    assert parse_selector("a = 9223372036854775807").selects([("a", "9223372036854775807")])
