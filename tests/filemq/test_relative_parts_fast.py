"""``relative_parts``'s quick scans accept only names its full checks accept, with the
same parts (``filemq.paths``: a mirror checks every file's name); every other name goes
to the full checks.  Random names from an alphabet of the characters that matter."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from filemq import paths
from filemq.paths import UnsafePathError

_ALPHABET = ["a", "Z", "0", ".", "..", "/", "//", "\\", ":", " ", "\x00", "\x1f", "\x7f"]
_ALPHABET += ["é", "日", "-", "_", "~", "%", "\n", "\t"]


def _outcome(check: Callable[[str], tuple[str, ...]], name: str) -> object:
    try:
        return check(name)
    except UnsafePathError:
        return UnsafePathError


@pytest.mark.parametrize("seed", range(10))
def test_quick_scans_agree_with_the_full_checks(seed: int) -> None:
    rng = random.Random(seed)
    names = ["", ".", "..", "a", "a/b", "C:x", "c:/x", "/a", "a/", ".a", "a/.b", "a/b.", "a..b"]
    names += ["".join(rng.choices(_ALPHABET, k=rng.randrange(1, 12))) for _ in range(3000)]
    for name in names:
        assert _outcome(paths.relative_parts, name) == _outcome(paths._checked_parts, name), name
