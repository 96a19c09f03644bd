"""Reading a queue by sequence number (broker.sequence): bounds, browse, release, against a
live Server + Engine over real sockets (restarts: tests/broker/test_sequence_restart.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
import zmq.asyncio

import broker
from broker import tmqp
from broker.client.aio import AsyncClient
from broker.client.blocking import Client, RemoteError
from broker.engine.auth import ALL_ACTIONS, Action, TokenAuthorizer
from broker.engine.engine import Engine
from broker.engine.limits import MIN_REPLY_SIZE, Limits
from broker.engine.options import BrokerConfig
from broker.protocol import Header, MessageType, Operation, ResultCode
from broker.sequence import BrowseFormatError, decode_browse, encode_browse
from broker.server.server import Server, ServerOptions
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
MakeClient = Callable[..., Client]

LOG = {"Status": "Push", "Retain": True, "AllowRelease": True, "RequestAcknowledge": True}


def payloads(items: list[broker.Browsed]) -> list[bytes]:
    return [bytes(b.message.payload) for b in items]


def test_bounds_and_browse_of_waiting_messages(make_client: MakeClient) -> None:
    c = make_client()
    c.create_queue("log", 1, {"Status": "Pull"})
    assert c.queue_bounds("log", 1) == broker.SequenceBounds(first=1, last=0)
    for i in range(10):
        c.push("log", 1, f"m{i}", ack=True, headers={"K": str(i)})
    assert c.queue_bounds("log", 1) == broker.SequenceBounds(1, 10)
    got = c.browse("log", 1, 0)
    assert [b.sequence for b in got] == list(range(1, 11))
    assert payloads(got) == [f"m{i}".encode() for i in range(10)]
    assert isinstance(got[0].message, broker.message.Message)
    assert got[3].message.headers == (("K", "3"),)
    assert got[3].message.target == "log" and got[3].message.content_type == 1
    # from N, with a limit; -1 is "after the last"
    assert [b.sequence for b in c.browse("log", 1, 4, limit=3)] == [4, 5, 6]
    assert c.browse("log", 1, 11) == []
    assert c.browse("log", 1, -1) == []
    # browsing consumed nothing: a pull still gets all ten, in order
    c.join("log")
    pulled = c.pull("log", 1, count=10)
    assert [bytes(m.payload) for m in pulled] == [f"m{i}".encode() for i in range(10)]
    assert c.queue_bounds("log", 1) == broker.SequenceBounds(11, 10)
    assert c.browse("log", 1, 0) == []


def test_a_browser_is_not_a_consumer(make_client: MakeClient) -> None:
    """A consumer that joins after a browse receives every message once."""
    producer, consumer = make_client(), make_client()
    producer.create_queue("jobs", 1, {"Status": "Push", "RequestAcknowledge": True})
    for i in range(5):
        producer.push("jobs", 1, f"j{i}", ack=False)
    assert wait_until(lambda: producer.queue_bounds("jobs", 1).last == 5)
    assert len(producer.browse("jobs", 1, 0)) == 5
    consumer.join("jobs")
    got = []
    while len(got) < 5 and (m := consumer.receive(timeout=10)) is not None:
        got.append(bytes(m.payload))
        consumer.ack(m)
    assert got == [f"j{i}".encode() for i in range(5)]
    assert consumer.receive(timeout=0.2) is None


def test_retained_queue_is_readable_after_consumption_and_release_drops(
    make_client: MakeClient,
) -> None:
    producer, consumer = make_client(), make_client()
    producer.create_queue("log", 2, LOG)
    consumer.join("log")
    for i in range(6):
        producer.push("log", 2, f"e{i}")
    got = []
    while len(got) < 6 and (m := consumer.receive(timeout=10)) is not None:
        got.append(m)
        consumer.ack(m)
    assert len(got) == 6
    # the acks go on the consumer's connection, the release below on the producer's: wait
    # until the broker took every ack (a browse lists deliveries in flight too, so it is
    # no such wait; a release skips what is in flight: it released fewer, once in CI)
    assert wait_until(lambda: producer.queue_info("log", 2)["PendingAcknowledges"] == 0)
    # consumed and acknowledged, still readable by sequence
    assert wait_until(lambda: len(producer.browse("log", 2, 0)) == 6)
    assert producer.queue_bounds("log", 2) == broker.SequenceBounds(1, 6)
    assert payloads(producer.browse("log", 2, 5)) == [b"e4", b"e5"]
    assert producer.release("log", 2, 4) == 4
    assert producer.queue_bounds("log", 2) == broker.SequenceBounds(5, 6)
    assert [b.sequence for b in producer.browse("log", 2, 0)] == [5, 6]
    assert producer.release("log", 2, 4) == 0  # nothing left below 5
    assert producer.release("log", 2, 100) == 2
    assert producer.queue_bounds("log", 2) == broker.SequenceBounds(7, 6)
    # sequence numbers go on after a release
    producer.push("log", 2, "after")
    m = consumer.receive(timeout=10)
    assert m is not None
    consumer.ack(m)
    assert wait_until(lambda: [b.sequence for b in producer.browse("log", 2, 0)] == [7])


def test_release_leaves_deliveries_in_flight_to_their_consumer(make_client: MakeClient) -> None:
    producer, consumer = make_client(), make_client()
    producer.create_queue("log", 4, LOG)
    consumer.join("log", prefetch=1)
    for i in range(3):
        producer.push("log", 4, f"f{i}")
    m = consumer.receive(timeout=10)  # 1 in flight; 2 and 3 wait (window of one)
    assert m is not None and m.payload == b"f0"
    assert wait_until(lambda: producer.queue_bounds("log", 4).last == 3)
    assert producer.release("log", 4, 2) == 1  # 2 only: 1 is the consumer's
    assert [b.sequence for b in producer.browse("log", 4, 0)] == [1, 3]
    consumer.ack(m)  # consumed after the release: not kept (the release passed it)
    nxt = consumer.receive(timeout=10)
    assert nxt is not None and nxt.payload == b"f2"
    consumer.ack(nxt)
    assert wait_until(lambda: [b.sequence for b in producer.browse("log", 4, 0)] == [3])
    assert producer.queue_bounds("log", 4) == broker.SequenceBounds(3, 3)


def test_retain_limit_pushes_out_the_oldest(make_client: MakeClient) -> None:
    c = make_client()
    c.create_queue("log", 3, {"Status": "Push", "Retain": True, "RetainLimit": 3})
    c.join("log")
    for i in range(5):
        c.push("log", 3, f"r{i}")
    for _ in range(5):
        assert c.receive(timeout=10) is not None
    assert wait_until(lambda: [b.sequence for b in c.browse("log", 3, 0)] == [3, 4, 5])
    assert c.queue_bounds("log", 3) == broker.SequenceBounds(3, 5)


def test_release_waiting_messages_counts_them_consumed(make_client: MakeClient) -> None:
    c = make_client()
    c.create_queue("work", 1, {"Status": "Pull", "AllowRelease": True})
    ids = [c.push("work", 1, f"w{i}", ack=True) for i in range(4)]
    assert len(ids) == 4
    assert c.release("work", 1, 2) == 2
    c.join("work")
    assert [bytes(m.payload) for m in c.pull("work", 1, count=10)] == [b"w2", b"w3"]


def test_release_needs_the_queue_option(make_client: MakeClient) -> None:
    c = make_client()
    c.create_queue("plain", 1, {"Status": "Pull"})
    c.push("plain", 1, "x", ack=True)
    with pytest.raises(RemoteError) as err:
        c.release("plain", 1, 1)
    assert err.value.code == ResultCode.UNACCEPTABLE
    assert "AllowRelease" in str(err.value)
    assert len(c.browse("plain", 1, 0)) == 1  # nothing removed


def test_garbage_requests_get_a_clear_error_and_the_broker_serves_on(
    make_client: MakeClient,
) -> None:
    c = make_client()
    c.create_queue("q", 1, {"Status": "Pull", "AllowRelease": True})
    c.push("q", 1, "kept", ack=True)
    for call, code in (
        (lambda: c.browse("q", 9, 0), ResultCode.NOT_FOUND),
        (lambda: c.browse("nope", 1, 0), ResultCode.NOT_FOUND),
        (lambda: c.queue_bounds("q", 9), ResultCode.NOT_FOUND),
        (lambda: c.browse("q", 1, -2), ResultCode.BAD_REQUEST),
        (lambda: c.browse("q", 1, 0, limit=0), ResultCode.BAD_REQUEST),
        (lambda: c.release("q", 1, -1), ResultCode.BAD_REQUEST),
        (lambda: c.release("q", 9, 1), ResultCode.NOT_FOUND),
    ):
        with pytest.raises(RemoteError) as err:
            call()
        assert err.value.code == code, err.value
    # hand-made requests: a From-Seq that is no number, no From-Seq, a huge one
    for headers in (
        ((Header.QUEUE_ID, "1"), (Header.FROM_SEQ, "abc")),
        ((Header.QUEUE_ID, "1"),),
        ((Header.QUEUE_ID, "1"), (Header.FROM_SEQ, "9" * 40)),
        ((Header.QUEUE_ID, "x"), (Header.FROM_SEQ, "1")),
    ):
        frame = tmqp.Frame(
            message_type=MessageType.SERVER,
            pending_response=True,
            content_type=Operation.QUEUE_BROWSE,
            message_id=c.new_id(),
            target="q",
            headers=headers,
        )
        with pytest.raises(RemoteError) as err:
            c.request_frame(frame).result(10)
        assert err.value.code == ResultCode.BAD_REQUEST
        assert "Queue-Id" in str(err.value) or "From-Seq" in str(err.value)
    # still serving, nothing lost
    assert payloads(c.browse("q", 1, 0)) == [b"kept"]


def test_browse_and_release_are_authorized(zctx: Ctx) -> None:
    reader = {Action.BROWSE, Action.PUSH, Action.QUEUE_CREATE, Action.CHANNEL_CREATE}
    auth = TokenAuthorizer({"admin": ALL_ACTIONS, "reader": reader, "pusher": {Action.PUSH}})
    with Server(Engine(authorizer=auth), ServerOptions(endpoint="tcp://127.0.0.1:*"),
                context=zctx) as srv:  # fmt: skip
        assert srv.endpoint is not None
        with (
            Client(srv.endpoint, context=zctx, token="admin", timeout=10) as admin,
            Client(srv.endpoint, context=zctx, token="reader", timeout=10) as reader_c,
            Client(srv.endpoint, context=zctx, token="pusher", timeout=10) as pusher,
        ):
            admin.create_queue("q", 1, {"Status": "Pull", "AllowRelease": True})
            admin.push("q", 1, "a", ack=True)
            assert len(reader_c.browse("q", 1, 0)) == 1
            assert reader_c.queue_bounds("q", 1).last == 1
            for call in (
                lambda: pusher.browse("q", 1, 0),
                lambda: pusher.queue_bounds("q", 1),
                lambda: reader_c.release("q", 1, 1),
            ):
                with pytest.raises(RemoteError) as err:
                    call()
                assert err.value.code == ResultCode.UNAUTHORIZED
            assert admin.release("q", 1, 1) == 1


def test_browse_is_cut_to_the_reply_size_and_pages_by_sequence(zctx: Ctx) -> None:
    config = BrokerConfig(limits=Limits(max_reply_size=MIN_REPLY_SIZE))
    with Server(Engine(config=config), ServerOptions(endpoint="tcp://127.0.0.1:*"),
                context=zctx) as srv:  # fmt: skip
        assert srv.endpoint is not None
        with Client(srv.endpoint, context=zctx, timeout=10) as c:
            c.create_queue("big", 1, {"Status": "Pull"})
            blob = b"x" * 1000  # about four per answer
            for _ in range(12):
                c.push("big", 1, blob, ack=True)
            seen: list[int] = []
            start = 0
            while page := c.browse("big", 1, start):
                assert 1 <= len(page) < 12
                assert all(bytes(b.message.payload) == blob for b in page)
                seen.extend(b.sequence for b in page)
                start = page[-1].sequence + 1
            assert seen == list(range(1, 13))
            # one message larger than the budget still comes, alone
            c.push("big", 1, b"y" * 6000, ack=True)
            assert [b.sequence for b in c.browse("big", 1, 13)] == [13]


def test_asyncio_client_has_the_same_calls(server: Server, zctx: Ctx) -> None:
    assert server.endpoint is not None
    endpoint = server.endpoint

    async def main() -> tuple[Any, ...]:
        actx = zmq.asyncio.Context()
        try:
            return await session(actx)
        finally:
            actx.destroy(linger=0)

    async def session(actx: zmq.asyncio.Context) -> tuple[Any, ...]:
        async with AsyncClient(endpoint, context=actx, timeout=10) as c:
            await c.create_queue("aio", 1, {"Status": "Pull", "AllowRelease": True})
            for i in range(3):
                await c.push("aio", 1, f"a{i}", ack=True)
            bounds = await c.queue_bounds("aio", 1)
            got = await c.browse("aio", 1, 2, limit=5)
            released = await c.release("aio", 1, 2)
            after = await c.queue_bounds("aio", 1)
            return bounds, got, released, after

    bounds, got, released, after = asyncio.run(main())
    assert bounds == broker.SequenceBounds(1, 3)
    assert [(b.sequence, bytes(b.message.payload)) for b in got] == [(2, b"a1"), (3, b"a2")]
    assert released == 2
    assert after == broker.SequenceBounds(3, 3)


def test_browse_payload_decoder_refuses_garbage() -> None:
    frame = tmqp.encode(tmqp.Frame(message_type=MessageType.QUEUE, payload=b"p"))[0]
    good = encode_browse([(1, frame), (2, frame)])
    assert [b.sequence for b in decode_browse(good)] == [1, 2]
    for bad in (
        good[:-1],  # truncated frame
        good[:5],  # truncated entry header
        encode_browse([(2, frame), (1, frame)]),  # out of order
        encode_browse([(1, b"\x00\x01garbage")]),  # not a frame
    ):
        with pytest.raises(BrowseFormatError):
            decode_browse(bad)


def test_browse_payload_budget_counts_whole_entries_and_reads_no_further() -> None:
    frame = tmqp.encode(tmqp.Frame(message_type=MessageType.QUEUE, payload=b"p" * 20))[0]
    entry = len(encode_browse([(1, frame)]))  # 12 octets of header + the frame
    read: list[int] = []

    def lazy() -> Iterator[tuple[int, bytes]]:
        for seq in range(1, 6):
            read.append(seq)
            yield seq, frame

    assert encode_browse(lazy(), 2 * entry) == encode_browse([(1, frame), (2, frame)])
    assert read == [1, 2, 3]  # the third was encoded, found too big, and the rest never asked
    assert len(encode_browse(lazy(), 3 * entry - 1)) == 2 * entry
    assert encode_browse([(7, frame)], 1) == encode_browse([(7, frame)])  # never below one
    assert len(encode_browse(lazy())) == 5 * entry  # no budget: all
