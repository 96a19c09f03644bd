"""Exactly once end to end through restarts (issue 14): a streaming query from a zerohub
queue into the zerohub sink that is stopped after its sink pushed a micro-batch but
before Spark recorded the batch done, then restarted from its checkpoint; and a
streaming read whose broker is killed (-9) and restarted in the middle of a micro-batch."""

from __future__ import annotations

import contextlib
import shutil
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import zmq

from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions
from broker.spark import register
from tests.broker.test_durable_serve import Broker
from tests.polling import wait_until
from tests.spark.streaming import run_to_end
from zerohub.sparkkit import START_ATTEMPTS, runner_too_late

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]  # a loaded 2-core machine

Ctx = zmq.Context[zmq.Socket[bytes]]
HELD = {"Status": "Push"}  # no consumer joins: every message stays held (browsable)


def _browse_all(c: Client, channel: str, queue: int = 1) -> list[Any]:
    out: list[Any] = []
    start = 0
    while page := c.browse(channel, queue, start):
        out.extend(page)
        start = page[-1].sequence + 1
    return out


@pytest.fixture
def endpoint(zctx: Ctx, spark: Any) -> Iterator[str]:
    register(spark)
    with Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        assert srv.endpoint is not None
        yield srv.endpoint


def _pipeline(spark: Any, endpoint: str, checkpoint: Path, sink_queue: int) -> Any:
    """events/1 -> upper-cased payload (no id column: the sink derives the ids) ->
    copies/``sink_queue``, micro-batches of 10 rows in 2 partitions."""
    from pyspark.sql import functions as F

    df = (
        spark.readStream.format("zerohub")
        .option("endpoint", endpoint)
        .option("channel", "events")
        .option("queue", "1")
        .option("maxRowsPerTrigger", "10")
        .option("rowsPerPartition", "5")
        .load()
    )
    out = df.select(F.upper(F.col("payload").cast("string")).cast("binary").alias("payload"))
    return (
        out.writeStream.format("zerohub")
        .option("endpoint", endpoint)
        .option("channel", "copies")
        .option("queue", str(sink_queue))
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def _last_commit(checkpoint: Path) -> Path:
    commits = [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    return max(commits, key=lambda p: int(p.name))


@pytest.mark.parametrize("dedupe", [True, False], ids=["UseMessageId", "keeps-repeats"])
def test_sink_restarted_from_its_checkpoint_holds_each_row_once(
    spark: Any, endpoint: str, zctx: Ctx, tmp_path: Path, dedupe: bool
) -> None:
    """The query stops after its sink pushed micro-batch N (acknowledged by the broker)
    but before Spark recorded N as done -- the commit file is taken away, as a kill
    between the sink's pushes and the commit log leaves it.  The restarted query runs N
    again with the same offsets: its rows get the same ids (query id + batch + partition
    + row), so a queue that drops repeated ids holds each row exactly once.  (With
    ``DuplicateWindow`` 0 the queue keeps repeats: the second run's copies carry exactly
    the first run's ids -- what makes the first case exactly once.)"""
    checkpoint = tmp_path / "checkpoint"
    sink_options = {"Status": "Push", "UseMessageId": True}
    if not dedupe:
        sink_options["DuplicateWindow"] = 0
    with Client(endpoint, context=zctx, timeout=30) as c:
        c.create_queue("events", 1, HELD)
        c.create_queue("copies", 1, sink_options)
        for i in range(25):
            c.push("events", 1, b"e%03d" % i, ack=True)
        first = run_to_end(lambda: _pipeline(spark, endpoint, checkpoint, 1))
        assert [p["numInputRows"] for p in first] == [
            10,
            10,
            5,
        ]
        first_run = _browse_all(c, "copies")
        assert sorted(bytes(b.message.payload) for b in first_run) == [
            b"E%03d" % i for i in range(25)
        ]
        last = _last_commit(checkpoint)
        assert last.name == "2"
        last.unlink()  # "killed" after the sink pushed batch 2, before its commit
        crc = last.parent / f".{last.name}.crc"
        if crc.exists():
            crc.unlink()
        for i in range(25, 32):  # and more arrives while it is down
            c.push("events", 1, b"e%03d" % i, ack=True)
        rerun = run_to_end(lambda: _pipeline(spark, endpoint, checkpoint, 1))
        assert next((p["batchId"], p["numInputRows"]) for p in rerun) == (2, 5)  # 2 again
        held = _browse_all(c, "copies")
        payloads = Counter(bytes(b.message.payload) for b in held)
        ids = Counter(b.message.message_id for b in held)
        info = c.queue_info("copies", 1)
    if dedupe:
        assert sorted(payloads) == [b"E%03d" % i for i in range(32)]
        assert set(payloads.values()) == {1}  # each row exactly once
        assert set(ids.values()) == {1} and len(ids) == 32
        assert info["DuplicateMessages"] == 5  # batch 2's five rows came again, dropped
    else:
        repeated = {mid for mid, n in ids.items() if n > 1}
        assert len(repeated) == 5  # batch 2's rows, pushed twice under the same ids
        first_ids = {b.message.message_id for b in first_run}
        assert repeated <= first_ids
        assert sum(payloads.values()) == 37 and len(payloads) == 32


PERSISTENT_HELD = {"Status": "Push", "MessageDeliveryHandler": "persistent"}


def test_stream_read_through_a_broker_kill_9_mid_batch(
    spark: Any, zctx: Ctx, tmp_path: Path
) -> None:
    """The broker is killed (-9) while a micro-batch's tasks browse it and restarted on
    the same data: the tasks fail and run again (or the query fails and is restarted
    from its checkpoint), and the file sink ends with every message exactly once --
    nothing lost, nothing twice."""
    register(spark)
    served = Broker(tmp_path / "data")
    served.start()
    try:
        with Client(served.endpoint, context=zctx, timeout=30) as c:
            c.create_queue("log", 1, PERSISTENT_HELD)
            ids = [f"r{i:05d}" for i in range(5000)]
            futures = [c.push_async("log", 1, b"x", message_id=mid) for mid in ids]
            for f in futures:
                f.result(30)  # saved: the persistent handler acknowledges once stored
        sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"

        def start() -> Any:
            df = (
                spark.readStream.format("zerohub")
                .option("endpoint", served.endpoint)
                .option("channel", "log")
                .option("queue", "1")
                .option("maxRowsPerTrigger", "1000")
                .option("rowsPerPartition", "500")
                .option("browseLimit", "1")  # a round trip a row: a long batch to kill in
                .option("timeout", "3")
                .load()
            )
            return (
                df.writeStream.format("parquet")
                .option("path", str(sink))
                .option("checkpointLocation", str(checkpoint))
                .trigger(processingTime="100 milliseconds")
                .start()
            )

        killed_in: int | None = None
        for _ in range(START_ATTEMPTS):
            query = start()
            # batch 0 done, batch 1 running: kill the broker under its tasks
            wait_until(partial(_mid_batch_or_ended, query), timeout=300)
            if query.isActive and _mid_batch(query):
                killed_in = query.lastProgress["batchId"] + 1
                break
            query.stop()
            exc = query.exception()
            assert exc is not None and runner_too_late(exc), (exc, query.status)
        assert killed_in is not None and killed_in >= 1
        served.kill()
        served.start()
        try:
            with contextlib.suppress(Exception):  # every attempt of a task failed meanwhile
                query.processAllAvailable()
        finally:
            query.stop()
        if query.exception() is not None or _rows(spark, sink) < len(ids):
            run_to_end(start)  # restarted from the checkpoint
        got = Counter(r.id for r in spark.read.parquet(str(sink)).select("id").collect())
        assert sorted(got) == sorted(ids)  # none lost
        assert set(got.values()) == {1}  # none twice
    finally:
        if served.proc is not None:
            served.kill()
        shutil.rmtree(tmp_path / "sink", ignore_errors=True)


def _mid_batch(query: Any) -> bool:
    """A micro-batch with rows done and the next one running."""
    last = query.lastProgress
    return bool(last is not None and last["numInputRows"] > 0 and query.status["isTriggerActive"])


def _mid_batch_or_ended(query: Any) -> bool:
    return _mid_batch(query) or not query.isActive


def _rows(spark: Any, sink: Path) -> int:
    try:
        return int(spark.read.parquet(str(sink)).count())
    except Exception:
        return 0
