"""One Spark task's read (``broker.spark.reader.read_range``: pipelined browse pages turned
into record batches) against a real in-process broker, without a SparkSession: every
range and page size gives exactly the held messages numbered in the range, in order,
once -- a released head, a range past the end, pages of one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from broker.spark.options import ReadOptions  # (these import pyspark)
from broker.spark.reader import read_range

pytestmark = [pytest.mark.spark]

Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def endpoint(zctx: Ctx) -> Iterator[str]:
    with Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        assert srv.endpoint is not None
        yield srv.endpoint


def test_every_range_and_page_size_reads_the_held_messages_once_in_order(
    endpoint: str, zctx: Ctx
) -> None:
    with Client(endpoint, context=zctx, timeout=30) as c:
        c.create_queue("r", 1, {"Status": "Push", "AllowRelease": True})
        for i in range(40):
            c.push("r", 1, b"m%02d" % i, ack=True)
        assert c.release("r", 1, 5) == 5  # 1..5 gone: the queue holds 6..40
    for limit in (1, 3, 7, 10_000):
        options = ReadOptions.parse(
            {"endpoint": endpoint, "channel": "r", "queue": "1", "browseLimit": str(limit)}
        )
        for first, last in ((1, 40), (1, 3), (4, 9), (6, 6), (17, 33), (38, 60), (41, 90)):
            batches = list(read_range(options, first, last))
            sequences = [s for b in batches for s in b.column("sequence").to_pylist()]
            payloads = [p for b in batches for p in b.column("payload").to_pylist()]
            held = list(range(max(first, 6), min(last, 40) + 1))
            assert sequences == held, (limit, first, last)
            assert payloads == [b"m%02d" % (s - 1) for s in held]
            if held and limit < len(held):
                assert len(batches) >= len(held) // limit  # page by page


def test_pages_are_asked_for_as_many_messages_as_the_reply_budget_holds(
    zctx: Ctx, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker cuts an answer to ``max_reply_size``; the reader then asks for what fits
    (about four 900-octet messages in 4 KiB), not for ``browseLimit`` each time, which
    made the broker read thousands of messages from its index to send four.  A single
    message bigger than the budget comes alone; the pages after it are sized again."""
    from broker.engine.limits import MIN_REPLY_SIZE, Limits
    from broker.engine.options import BrokerConfig
    from broker.spark import reader

    limits: list[int] = []
    ask = reader._ask

    def counting(client: Client, connect: object, cursor: int, limit: int) -> object:
        limits.append(limit)
        return ask(client, connect, cursor, limit)  # type: ignore[arg-type]

    monkeypatch.setattr(reader, "_ask", counting)
    config = BrokerConfig(limits=Limits(max_reply_size=MIN_REPLY_SIZE))
    options = ServerOptions(endpoint="tcp://127.0.0.1:*")
    with Server(Engine(config=config), options, context=zctx) as srv:
        assert srv.endpoint is not None
        with Client(srv.endpoint, context=zctx, timeout=30) as c:
            c.create_queue("b", 1, {"Status": "Push"})
            for i in range(60):
                size = 9000 if i == 30 else 900  # number 31: alone over the budget
                c.push("b", 1, bytes([i]) * size, ack=True)
        read = ReadOptions.parse({"endpoint": srv.endpoint, "channel": "b", "queue": "1"})
        batches = list(reader.read_range(read, 1, 60))
    sequences = [s for b in batches for s in b.column("sequence").to_pylist()]
    payloads = [p for b in batches for p in b.column("payload").to_pylist()]
    assert sequences == list(range(1, 61))
    assert payloads == [bytes([i]) * (9000 if i == 30 else 900) for i in range(60)]
    fits = MIN_REPLY_SIZE // 900
    assert limits[0] == 60  # (nothing known yet: the whole range)
    assert all(limit <= fits for limit in limits[1:]), limits
    assert len(limits) <= 60 // (fits - 1) + 3, limits  # pages of about `fits`, not of 1


def test_latest_offset_works_through_a_known_backlog_without_asking_the_broker(
    zctx: Ctx,
) -> None:
    """Sequence numbers are never taken back: while the newest number known is ahead of
    ``start + maxRowsPerTrigger``, the next micro-batch's end needs no round trip (the
    broker is stopped here to prove it); past it, the broker is asked again."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from broker.client.errors import ClientError
    from broker.spark.reader import StreamReader

    with Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        assert srv.endpoint is not None
        with Client(srv.endpoint, context=zctx, timeout=30) as c:
            c.create_queue("l", 1, {"Status": "Push"})
            for i in range(25):
                c.push("l", 1, b"%d" % i, ack=True)
        raw = {"endpoint": srv.endpoint, "channel": "l", "queue": "1", "timeout": "0.5"}
        reader = StreamReader(ReadOptions.parse(raw))
        try:
            assert reader.initialOffset() == {"seq": 0}
            assert reader.latestOffset({"seq": 0}, ReadMaxRows(10)) == {"seq": 10}
            srv.stop()
            assert reader.latestOffset({"seq": 10}, ReadMaxRows(10)) == {"seq": 20}
            assert reader.reportLatestOffset() == {"seq": 25}
            with pytest.raises(ClientError):  # past what is known: asked, no broker
                reader.latestOffset({"seq": 20}, ReadMaxRows(10))
            with pytest.raises(ClientError):
                reader.latestOffset({"seq": 20}, ReadAllAvailable())
        finally:
            reader.stop()
