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
