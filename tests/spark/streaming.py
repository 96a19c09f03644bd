"""Starting a streaming query on a loaded machine, for every Spark test that streams.

Spark starts a streaming source's Python runner as a fresh process that must connect
back within 10 s (fixed in Spark): on an overloaded machine it may not.  The query then
fails before reading anything; it is started again (from its checkpoint, when it has
one), a few times at most.  Any other failure is raised at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Starts of one query at most before the test fails.
ATTEMPTS = 5


def slow_start(exc: BaseException) -> bool:
    """Whether ``exc`` is Spark giving up on its Python runner connecting back."""
    return "connect back" in str(exc)


def _with_rows(query: Any) -> list[dict[str, Any]]:
    return [p for p in query.recentProgress if p["numInputRows"]]


def processing(start: Callable[[], Any]) -> tuple[Any, list[dict[str, Any]]]:
    """Start the query (again if Spark's Python runner came up too late) until it has
    processed everything available.  Returns the query, still running (the caller stops
    it), and the progress of earlier attempts' micro-batches that read rows."""
    earlier: list[dict[str, Any]] = []
    for _ in range(ATTEMPTS):
        query = start()
        try:
            query.processAllAvailable()
            return query, earlier
        except Exception as exc:
            query.stop()
            if not slow_start(exc):
                raise
        earlier += _with_rows(query)
    raise AssertionError(f"Spark's Python runner did not start in {ATTEMPTS} attempts")


def run_to_end(start: Callable[[], Any]) -> list[dict[str, Any]]:
    """:func:`processing`, then stop the query; the progress of every micro-batch (of
    every attempt) that read rows."""
    query, earlier = processing(start)
    query.stop()
    return earlier + _with_rows(query)
