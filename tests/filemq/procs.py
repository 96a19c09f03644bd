"""Helpers for tests that run ``filemq`` as real processes."""

from __future__ import annotations

import re
from typing import IO

_SERVING = re.compile(r"serving .* on (tcp://127\.0\.0\.1:\d+)")


def read_endpoint(stream: IO[str], max_lines: int = 20) -> str:
    """The endpoint a ``filemq serve`` process reports in its first lines ("" if none)."""
    for _ in range(max_lines):
        found = _SERVING.search(stream.readline())
        if found:
            return found.group(1)
    return ""
