"""``zerohub.sparkkit.processing``: a streaming query whose Python runner connected back
too late is started again, anything else is raised at once (queries stand in for
Spark's: no Spark needed)."""

from __future__ import annotations

from typing import Any

import pytest

from zerohub.sparkkit import START_ATTEMPTS, processing

LATE = "[STREAM_FAILED] ... terminated with exception: Python worker failed to connect back."


class Query:
    """What ``processing`` uses of a StreamingQuery."""

    def __init__(self, failure: str | None, rows: int = 0) -> None:
        self.failure = failure
        self.recentProgress: list[dict[str, Any]] = [{"numInputRows": rows}]
        self.stopped = False

    def processAllAvailable(self) -> None:
        if self.failure is not None:
            raise RuntimeError(self.failure)

    def stop(self) -> None:
        self.stopped = True


def _starter(*queries: Query) -> tuple[Any, list[Query]]:
    started: list[Query] = []
    pending = list(queries)

    def start() -> Query:
        started.append(pending.pop(0))
        return started[-1]

    return start, started


def test_a_runner_too_late_is_started_again_until_it_processes() -> None:
    start, started = _starter(Query(LATE), Query(LATE), Query(None, rows=7))
    query, earlier = processing(start)
    assert query is started[2] and not query.stopped  # the caller stops it
    assert [q.stopped for q in started[:2]] == [True, True]
    assert earlier == []  # the failed starts read nothing


def test_another_failure_is_raised_at_once_and_the_query_stopped() -> None:
    start, started = _starter(Query("division by zero"), Query(None))
    with pytest.raises(RuntimeError, match="division by zero"):
        processing(start)
    assert len(started) == 1 and started[0].stopped


def test_a_runner_late_every_time_gives_up_after_the_attempts() -> None:
    start, started = _starter(*(Query(LATE) for _ in range(START_ATTEMPTS + 1)))
    with pytest.raises(RuntimeError, match="did not connect back"):
        processing(start)
    assert len(started) == START_ATTEMPTS and all(q.stopped for q in started)
