"""How many random variants (seeds, settings) the long kill -9 tests run.

A CI run takes a few chosen variants of each, covering every setting at least once;
``ZH_ALL_VARIANTS=1`` in the environment runs every variant (a soak before a release, or
after touching the log store, compaction or recovery):

    ZH_ALL_VARIANTS=1 .venv/bin/python -m pytest -m slow tests/broker
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

#: every variant, not only the chosen ones
ALL = os.environ.get("ZH_ALL_VARIANTS", "") not in ("", "0")


def variants(chosen: Sequence[T], every: Sequence[T]) -> list[T]:
    """``every`` with ``ZH_ALL_VARIANTS`` set, else ``chosen`` (which must be among them)."""
    assert all(c in every for c in chosen), "a chosen variant that is not one of them"
    return list(every if ALL else chosen)
