"""``parse_entry`` takes a mode text checked before and an mtime of 1-18 ASCII digits
without the full checks (one call fewer each per file, ``filemq.meta``): for every text
it gives what the full checks give (``_parse_mode``, ``_parse_mtime``), value or
``MetaError``."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from filemq import meta
from filemq.meta import MetaError, parse_entry

_MTIMES = [
    "0",
    "7",
    "-1",
    "",
    "-",
    "+5",
    " 5",
    "5 ",
    "1" * 18,
    "9" * 18,
    "1" * 19,
    "9" * 19,
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775807",
    "1" * 20,
    "00000000000000000001",
    "١٢٣",
    "²",
    "12a",
    "1_000",
    "0x10",
    "1.5",
]
_MODES = ["644", "755", "0644", "7777", "17777", "8", "", "-1", "abc", "6" * 7, "٦٤٤"]


def _full(check: Callable[[str], int], text: str) -> object:
    try:
        return check(text)
    except MetaError:
        return MetaError


def _fast(field: str, text: str) -> object:
    try:
        entry = parse_entry({field: text}, ("f",))
    except MetaError:
        return MetaError
    return entry.mtime_ns if field == "mtime_ns" else entry.mode


@pytest.mark.parametrize("seed", range(5))
def test_mtime_and_mode_fast_paths_agree_with_the_full_checks(seed: int) -> None:
    rng = random.Random(seed)
    mtimes = [*_MTIMES, *(str(rng.randrange(-(10**20), 10**20)) for _ in range(200))]
    for text in mtimes:
        assert _fast("mtime_ns", text) == _full(meta._parse_mtime, text), text
    modes = [*_MODES, *(format(rng.randrange(0o20000), "o") for _ in range(200))]
    for _ in range(2):  # (the second time every accepted text is one checked before)
        for text in modes:
            assert _fast("mode", text) == _full(meta._parse_mode, text), text
