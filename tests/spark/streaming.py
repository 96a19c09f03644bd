"""Running a streaming query to its end on a loaded machine, for the Spark tests that
stream (Spark's Python runner may connect back too late: ``zerohub.sparkkit.processing``
starts the query again)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zerohub.sparkkit import processing


def run_to_end(start: Callable[[], Any]) -> list[dict[str, Any]]:
    """``processing``, then stop the query; the progress of every micro-batch (of every
    attempt) that read rows."""
    query, earlier = processing(start)
    query.stop()
    return earlier + [p for p in query.recentProgress if p["numInputRows"]]
