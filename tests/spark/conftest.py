"""One SparkSession (local[2]) for every Spark test of a run (~5 s to start).

Spark tests are marked ``spark`` and left out by default; ``pytest -m spark`` runs them
(``.ci/run`` does).  Without pyspark, pyarrow or Java they skip with the reason.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from zerohub import sparkkit


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    try:
        sparkkit.require()
    except sparkkit.SparkUnavailable as exc:
        pytest.skip(str(exc))
    # local[2] with up to 3 attempts per task (local mode's default is 1: no retries; the
    # writer's retry test needs them)
    session = sparkkit.session(
        "local[2,3]",
        "zerohub-tests",
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.stopTimeout": "30000",
        },
    )
    yield session
    session.stop()


def _session_wide(thread: threading.Thread) -> bool:
    """A thread of the session's JVM gateway (py4j, pyspark), or pyzmq's one garbage
    collector thread (started by the first large zero-copy send: the 16 KiB rows here),
    which live as long as the process, not a test."""
    if type(thread).__name__ == "GarbageCollectorThread":
        return True
    target = getattr(thread, "_target", None)
    owner = getattr(target, "__module__", None) or type(thread).__module__
    holder = getattr(target, "__self__", None)
    if holder is not None:
        owner = f"{owner} {type(holder).__module__}"
    return "py4j" in owner or "pyspark" in owner


@pytest.fixture(autouse=True)
def no_thread_leaks() -> Iterator[None]:
    """The suite's check (tests/conftest.py), less the threads the SparkSession's gateway
    and pyzmq start on demand and keep (see ``_session_wide``)."""
    before = set(threading.enumerate())
    yield
    extra: list[threading.Thread] = []
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        extra = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and not _session_wide(t)
        ]
        if not extra:
            return
        time.sleep(0.02)
    pytest.fail(f"threads left running: {', '.join(t.name for t in extra)}")
