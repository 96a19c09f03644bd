"""The broker as a Spark source and sink (broker.spark) against a live broker on loopback."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import zmq

from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions
from broker.spark import register
from tests.polling import wait_until
from tests.spark.streaming import run_to_end
from zerohub.sparkkit import processing
from zerohub.zmqkit import new_certificate

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]  # a loaded 2-core machine

Ctx = zmq.Context[zmq.Socket[bytes]]
HELD = {"Status": "Push"}  # no consumer joins: every message stays held (browsable)


@pytest.fixture
def endpoint(zctx: Ctx, spark: Any) -> Iterator[str]:
    register(spark)
    with Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        assert srv.endpoint is not None
        yield srv.endpoint


@pytest.fixture
def client(zctx: Ctx, endpoint: str) -> Iterator[Client]:
    with Client(endpoint, context=zctx, timeout=30) as c:
        yield c


def _source(
    spark: Any, endpoint: str, channel: str, *, stream: bool = False, **options: Any
) -> Any:
    reader = spark.readStream if stream else spark.read
    reader = reader.format("zerohub").option("endpoint", endpoint).option("channel", channel)
    reader = reader.option("queue", "1")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def _browse_all(c: Client, channel: str) -> list[Any]:
    out: list[Any] = []
    start = 0
    while page := c.browse(channel, 1, start):
        out.extend(page)
        start = page[-1].sequence + 1
    return out


def test_batch_read_write_round_trip(spark: Any, endpoint: str, client: Client) -> None:
    client.create_queue("in", 1, HELD)
    client.create_queue("out", 1, HELD)
    stamp = datetime(2026, 11, 23, 4, 5, 6, 789012, tzinfo=UTC)
    micros = int(stamp.timestamp()) * 1_000_000 + stamp.microsecond
    pushed = []
    for i in range(40):
        headers = [("k", str(i)), ("Content-Type", "application/json")]
        if i % 2:
            headers.append(("Timestamp", str(micros + i)))
        payload = b'{"n": %d}' % i + bytes(range(256))  # any octets
        mid = client.push("in", 1, payload, ack=True, headers=headers)
        pushed.append((mid, payload, i))
    df = _source(spark, endpoint, "in", rowsPerPartition=7, browseLimit=5)
    assert df.rdd.getNumPartitions() == 6  # 40 sequence numbers, 7 per partition
    rows = sorted(df.collect(), key=lambda r: r.sequence)
    assert [(r.id, r.payload, r.sequence) for r in rows] == [
        (mid, payload, i + 1) for mid, payload, i in pushed
    ]
    for r, (_mid, _payload, i) in zip(rows, pushed, strict=True):
        assert (r.channel, r.queue, r.content_type) == ("in", 1, "application/json")
        assert r.headers == {"k": str(i)}
        if i % 2:
            assert r.timestamp.astimezone(UTC) == stamp + timedelta(microseconds=i)
        else:
            assert r.timestamp is None
    # reading consumed nothing: the queue still holds every message
    assert len(_browse_all(client, "in")) == 40
    df.write.format("zerohub").option("endpoint", endpoint).option("channel", "out").option(
        "queue", "1"
    ).mode("append").save()
    copies = _browse_all(client, "out")  # (six tasks push at once: any order)
    assert sorted((b.message.message_id, bytes(b.message.payload)) for b in copies) == sorted(
        (mid, payload) for mid, payload, _i in pushed
    )
    first = next(b.message for b in copies if b.message.message_id == pushed[1][0])
    assert first.header("Content-Type") == "application/json" and first.header("k") == "1"
    assert first.header("Timestamp") == str(micros + 1)


def test_writer_derives_distinct_ids_and_routes_by_columns(
    spark: Any, endpoint: str, client: Client
) -> None:
    client.create_queue("a", 1, HELD)
    client.create_queue("b", 2, HELD)
    rows = [("a", 1, b"to a %d" % i) for i in range(5)] + [
        ("b", 2, b"to b %d" % i) for i in range(3)
    ]
    df = spark.createDataFrame(rows, "channel string, queue int, payload binary").repartition(3)
    df.write.format("zerohub").option("endpoint", endpoint).option("writeId", "job7").mode(
        "append"
    ).save()
    in_a = _browse_all(client, "a")
    in_b = client.browse("b", 2, 0)
    assert sorted(bytes(b.message.payload) for b in in_a) == sorted(r[2] for r in rows[:5])
    assert sorted(bytes(b.message.payload) for b in in_b) == sorted(r[2] for r in rows[5:])
    ids = [b.message.message_id for b in [*in_a, *in_b]]
    assert len(set(ids)) == 8 and all(i.startswith("job7:0:") for i in ids)


def test_sink_refuses_unknown_columns_and_overwrite(spark: Any, endpoint: str) -> None:
    df = spark.createDataFrame([(b"x", 1)], "payload binary, typo int")
    with pytest.raises(Exception, match="unknown columns"):
        df.write.format("zerohub").option("endpoint", endpoint).option("channel", "c").option(
            "queue", "1"
        ).mode("append").save()
    ok = spark.createDataFrame([(b"x",)], "payload binary")
    with pytest.raises(Exception, match="append"):
        ok.write.format("zerohub").option("endpoint", endpoint).option("channel", "c").option(
            "queue", "1"
        ).mode("overwrite").save()


def _file_sink_ids(spark: Any, path: Path) -> list[str]:
    return [r.id for r in spark.read.parquet(str(path)).collect()]


def test_stream_reads_each_message_once_across_a_restart(
    spark: Any, endpoint: str, client: Client, tmp_path: Path
) -> None:
    client.create_queue("events", 1, HELD)
    ids = [client.push("events", 1, b"e%03d" % i, ack=True) for i in range(30)]
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"

    def run() -> Any:
        df = _source(spark, endpoint, "events", stream=True, maxRowsPerTrigger=10,
                     rowsPerPartition=4)  # fmt: skip
        return (
            df.writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    sizes = [p["numInputRows"] for p in run_to_end(run)]
    assert sizes == [10, 10, 10]  # admission control: three micro-batches
    assert sorted(_file_sink_ids(spark, sink)) == sorted(ids)
    ids += [client.push("events", 1, b"e%03d" % i, ack=True) for i in range(30, 45)]
    assert [p["numInputRows"] for p in run_to_end(run)] == [10, 5]
    seen = _file_sink_ids(spark, sink)
    assert sorted(seen) == sorted(ids) and len(seen) == 45  # each message exactly once
    assert len(_browse_all(client, "events")) == 45  # nothing consumed, nothing released


def test_stream_commit_releases_what_spark_processed(
    spark: Any, endpoint: str, client: Client, tmp_path: Path
) -> None:
    client.create_queue("work", 1, {"Status": "Push", "AllowRelease": True})
    for i in range(12):
        client.push("work", 1, b"w%d" % i, ack=True)
    df = _source(spark, endpoint, "work", stream=True, release="true", maxRowsPerTrigger=5)
    starts = itertools.count()

    def start() -> Any:
        # a fresh checkpoint for each start: the memory sink cannot recover from one (a
        # start whose Python runner came up too late read and released nothing)
        return (
            df.writeStream.format("memory")
            .queryName("released")
            .option("checkpointLocation", str(tmp_path / f"checkpoint{next(starts)}"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    query, _ = processing(start)
    try:
        assert spark.sql("select count(*) from released").collect()[0][0] == 12
        # batches 5 + 5 + 2: Spark commits a micro-batch when it plans the next one with
        # data, so the first two are released, the last one is not yet
        first = lambda: client.queue_bounds("work", 1).first  # noqa: E731
        assert wait_until(lambda: first() == 11, timeout=60), first()
        client.push("work", 1, b"late", ack=True)
        query.processAllAvailable()
        assert wait_until(lambda: first() == 13, timeout=60), first()  # "late" stays held
        got = [bytes(r.payload) for r in spark.sql("select payload from released").collect()]
        assert sorted(got) == sorted([b"w%d" % i for i in range(12)] + [b"late"])
    finally:
        query.stop()


_FILLER = b"x" * 16384  # rows big enough to leave the workers' 64 KiB stream buffers


def _flaky_rows(spark: Any) -> None:
    """Register "flaky_rows": 80 rows in one partition; attempt 0 of its task dies at row
    50, once the broker holds 20 messages of queue once/1 (so its writer pushed them)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader

    class FlakyReader(DataSourceReader):
        def __init__(self, endpoint: str) -> None:
            self.endpoint = endpoint

        def read(self, partition: Any) -> Iterator[tuple[bytes]]:
            from pyspark import TaskContext

            from broker.client.blocking import Client
            from tests.polling import wait_until

            context = TaskContext.get()
            for n in range(80):
                if n == 50 and context is not None and context.attemptNumber() == 0:
                    with Client(self.endpoint, timeout=30) as c:
                        pushed = wait_until(lambda: len(c.browse("once", 1, 0)) >= 20, 60)
                    raise RuntimeError(f"attempt 0 dies (20 rows pushed before: {pushed})")
                yield (b"row %d " % n + _FILLER,)

    class FlakyRows(DataSource):
        @classmethod
        def name(cls) -> str:
            return "flaky_rows"

        def schema(self) -> str:
            return "payload binary"

        def reader(self, schema: Any) -> DataSourceReader:
            return FlakyReader(self.options["endpoint"])

    spark.dataSource.register(FlakyRows)


def _write_flaky_rows(
    spark: Any, endpoint: str, client: Client, queue_options: dict[str, Any]
) -> list[Any]:
    """Write flaky_rows into once/1; what the queue then holds."""
    _flaky_rows(spark)
    client.create_queue("once", 1, {"Status": "Push", **queue_options})
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")  # stream, not bulk
    try:
        df = spark.read.format("flaky_rows").option("endpoint", endpoint).load()
        df.write.format("zerohub").option("endpoint", endpoint).option("channel", "once").option(
            "queue", "1"
        ).mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    return _browse_all(client, "once")


def test_writer_retry_pushes_the_same_ids_again(spark: Any, endpoint: str, client: Client) -> None:
    """A task that dies after the broker acknowledged some of its rows runs again and
    pushes every row under the id the first attempt used (on a queue that keeps
    repeated ids, to see them)."""
    held = _write_flaky_rows(spark, endpoint, client, {"DuplicateWindow": 0})
    by_id: dict[str, set[bytes]] = {}
    for b in held:
        by_id.setdefault(b.message.message_id, set()).add(bytes(b.message.payload))
    assert len(by_id) == 80  # one id per row, whichever attempt pushed it
    assert all(len(payloads) == 1 for payloads in by_id.values())
    assert sorted(p for (p,) in by_id.values()) == sorted(
        b"row %d " % n + _FILLER for n in range(80)
    )
    assert len(held) >= 100  # attempt 0 pushed 20 or more before it died


def test_writer_retry_does_not_duplicate(spark: Any, endpoint: str, client: Client) -> None:
    """The same on a queue that drops repeated ids (UseMessageId, the default): the 80
    rows once each -- exactly once, though a task pushed part of them twice."""
    held = _write_flaky_rows(spark, endpoint, client, {"UseMessageId": True})
    assert sorted(bytes(b.message.payload) for b in held) == sorted(
        b"row %d " % n + _FILLER for n in range(80)
    )


def test_curve_options(spark: Any, zctx: Ctx, tmp_path: Path) -> None:
    register(spark)
    allow = tmp_path / "allow"
    allow.mkdir()
    server_pub, server_sec = new_certificate("server", tmp_path / "server")
    client_pub, client_sec = new_certificate("client", tmp_path / "clients")
    (allow / "client.key").write_bytes(client_pub.read_bytes())
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", curve_secret=str(server_sec),
                            allow_dir=str(allow))  # fmt: skip
    with Server(Engine(), options, context=zctx) as srv:
        assert srv.endpoint is not None
        with Client(srv.endpoint, context=zctx, server_key=server_pub,
                    curve_secret=client_sec, timeout=30) as c:  # fmt: skip
            c.create_queue("secret", 1, HELD)
            c.push("secret", 1, b"over curve", ack=True)
            df = _source(spark, srv.endpoint, "secret", serverKey=server_pub,
                         clientCert=client_sec)  # fmt: skip
            assert [bytes(r.payload) for r in df.collect()] == [b"over curve"]
            # (payload only: the read id would be a repeat, which this queue drops)
            df.select("payload").write.format("zerohub").option("endpoint", srv.endpoint).option(
                "channel", "secret"
            ).option("queue", "1").option("serverKey", str(server_pub)).option(
                "clientCert", str(client_sec)
            ).option("writeId", "curve").mode("append").save()
            assert len(c.browse("secret", 1, 0)) == 2
