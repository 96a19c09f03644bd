"""SQL-92 selectors: expected values worked out by hand from SQL's three-valued logic."""

from __future__ import annotations

import pytest

from broker.selector import MAX_DEPTH, SelectorError, parse_selector

CAR = {"type": "car", "color": "blue", "weight": "3000", "name": "O'Brien", "code": "A_1%"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("type = 'car' AND color = 'blue' AND weight > 2500", True),
        ("type = 'car' AND weight < 2500", False),
        ("type <> 'car' OR color = 'blue'", True),
        ("NOT type = 'truck'", True),
        ("weight >= 3000 AND weight <= 3000", True),
        ("weight BETWEEN 2000 AND 3000", True),
        ("weight NOT BETWEEN 2000 AND 3000", False),
        ("color IN ('red', 'blue')", True),
        ("color NOT IN ('red', 'blue')", False),
        ("name = 'O''Brien'", True),
        ("name LIKE 'O%'", True),
        ("name LIKE 'O_Brien'", True),
        ("name NOT LIKE '%x%'", True),
        ("code LIKE 'A!_1!%' ESCAPE '!'", True),
        ("code LIKE 'A!_2!%' ESCAPE '!'", False),
        ("weight / 2 + 1 = 1501", True),
        ("-weight < 0 AND weight * 2 = 6000", True),
        ("missing IS NULL AND color IS NOT NULL", True),
        ("(type = 'bike' OR type = 'car') AND NOT (color = 'red')", True),
        ("TRUE", True),
        ("weight / 0 = 1", False),  # division by zero: UNKNOWN
        # a missing header is NULL: comparisons are UNKNOWN, and so is their NOT
        ("missing = 'x'", False),
        ("NOT missing = 'x'", False),
        ("missing = 'x' OR type = 'car'", True),
        ("missing = 'x' AND type = 'car'", False),
        ("NOT (missing = 'x' AND type = 'bike')", True),  # UNKNOWN AND FALSE = FALSE
        ("color > 5", False),  # not a number: UNKNOWN
        ("color IN ('x') OR missing IN ('y')", False),
        ("type = 'car' and COLOR = 'blue'", False),  # keywords case-insensitive, names not
    ],
)
def test_selector_values(selector: str, expected: bool) -> None:
    assert parse_selector(selector).matches(CAR) is expected


@pytest.mark.parametrize(
    "selector",
    [
        "type = ",
        "type = 'car",
        "type == 'car'",
        "color IN (1, 2)",
        "name LIKE 'x' ESCAPE 'ab'",
        "a NOT b",
        "(a = 1",
        "a = 1)",
        "a # 1",
        "(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1),
        "NOT " * (MAX_DEPTH + 1) + "a = 1",
        "a = '" + "x" * 5000 + "'",
    ],
)
def test_bad_selectors_are_refused(selector: str) -> None:
    with pytest.raises(SelectorError, match="selector"):
        parse_selector(selector)
