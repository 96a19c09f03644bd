"""Hostile peers on the batched paths (``broker.batch``): garbage and split frames in and
around an acknowledged batch, and a consumer that stops reading in the middle of a
batched delivery.

Real sockets (loopback TCP, random ports), a real ``Server`` and ``Engine`` on their
thread; every wait polls up to a deadline a machine at load 50 makes (no fixed window).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from broker import batch, tmqp
from broker.client.blocking import Client
from broker.client.frames import join_frame
from broker.engine.engine import Engine
from broker.protocol import Header, MessageType, ResultCode, header
from broker.server.server import Server, ServerOptions
from tests.broker.test_batch import Raw, push_frame
from tests.broker.test_push_runs import LOADED, _batch_of
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
CHANNEL = "h"


@pytest.fixture
def server(zctx: Ctx) -> Iterator[Server]:
    # (no PINGs in the test's time: a peer that stops reading could not answer them, and
    # a silent peer is ended -- that is another test's adversary)
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", ping_interval=120, peer_timeout=240)
    server = Server(Engine(), options, context=zctx)
    server.start()
    yield server
    server.stop()


def _endpoint(server: Server) -> str:
    assert server.endpoint is not None
    return server.endpoint


def plain(mid: str, *, ack: bool = False) -> bytes:
    """A push of payload ``mid`` into ``CHANNEL`` (``test_batch.push_frame``)."""
    return push_frame(mid, 1, mid.encode(), channel=CHANNEL, ack=ack)


def _raw(zctx: Ctx, endpoint: str, properties: dict[str, str] | None = None) -> Raw:
    peer = Raw(zctx, endpoint, properties)
    peer.sock.rcvtimeo = int(LOADED * 1000)
    return peer


def _until(peer: Raw, mid: str) -> list[tmqp.Frame]:
    """The frames ``peer`` receives up to and including the one with id ``mid``."""
    got: list[tmqp.Frame] = []
    while not got or got[-1].message_id != mid:
        msg = tmqp.decode((peer.sock.recv(),))
        if isinstance(msg, tmqp.Frame):
            got.append(msg)
    return got


def _bad_request(frame: tmqp.Frame) -> bool:
    return frame.message_type == MessageType.RESPONSE and frame.content_type == 400


# ---------------------------------------------------------------- garbage and split frames


def test_garbage_and_split_frames_in_acknowledged_batches_leave_the_broker_serving(
    server: Server, zctx: Ctx
) -> None:
    """One producer sends, in order: an acknowledged batch holding good pushes, garbage
    and the first half of a push; a batch whose entry lengths run past its end; a batch
    frame cut in two ZeroMQ messages; a batch as a two-part message; then a push waiting
    for its acknowledge.  Each is answered with a clear error in its place (the batch's
    acknowledge refusing the bad entries by index, a 400 for the others), the good
    pushes are taken, each delivered once and in order, nothing of the broken batches
    is, and the broker serves the last push."""
    endpoint = _endpoint(server)
    admin = Client(endpoint, context=zctx, timeout=LOADED).connect()
    consumer = _raw(zctx, endpoint)
    producer = _raw(zctx, endpoint)
    try:
        admin.create_queue(CHANNEL, 1, {"Status": 1})
        consumer.send(tmqp.encode(join_frame("j", CHANNEL))[0])
        assert consumer.frame().message_id == "j"

        half = plain("cut")[: len(plain("cut")) // 2]
        entries = [plain("a0"), plain("a1"), b"\xff\xfegarbage", half, plain("a2"),
                   plain("k0", ack=True)]  # fmt: skip
        producer.send(_batch_of("B1", entries, ack=True))
        (answer,) = _until(producer, "B1")
        assert answer.message_type == MessageType.ACK
        refused = json.loads(answer.payload)["Refused"]
        assert [(index, nack) for index, nack, _why in refused] == [
            (2, "bad-request"),
            (3, "bad-request"),
        ]
        assert all(why.startswith("malformed frame") for _i, _n, why in refused)

        # a batch whose second entry announces more octets than are left: refused whole
        body = plain("x0")
        torn = b"".join(len(e).to_bytes(4, "little") + e for e in (body, body))[:-5]
        broken = tmqp.encode_frame(message_type=MessageType.SERVER, pending_ack=True,
                                   content_type=260, message_id="B2", payload=torn)  # fmt: skip
        producer.send(broken[0])
        (answer,) = _until(producer, "B2")
        assert _bad_request(answer)
        assert (header(answer, Header.REASON) or "").startswith("bad batch: entry 1")

        # a batch frame cut in two ZeroMQ messages, then one sent as two parts
        whole = _batch_of("B3", [plain("y0"), plain("y1")], ack=True)
        producer.send(whole[:20])
        producer.send(whole[20:])
        producer.sock.send_multipart([whole[:20], whole[20:]])
        producer.send(plain("after", ack=True))
        answers = _until(producer, "after")
        *errors, last = answers
        assert (last.message_type, header(last, Header.NACK_REASON)) == (MessageType.ACK, None)
        assert len(errors) == 3 and all(_bad_request(f) for f in errors)  # one per message
        assert "one TMQP frame per ZeroMQ message" in (header(errors[-1], Header.REASON) or "")

        delivered = [f.message_id for f in _until(consumer, "after")]
        assert delivered == ["a0", "a1", "a2", "k0", "after"]
        assert server.serving
        assert admin.stats()["server"]["bad_frames"] >= 3
    finally:
        producer.close()
        consumer.close()
        admin.close()


# ---------------------------------------------------------------- a consumer that stops


#: The queue's window per consumer (deliveries awaiting its acknowledge, ``Prefetch``).
WINDOW = 8
#: Acknowledged pushes of the producer.
PUSHES = 300


def _stopping_consumer(zctx: Ctx, endpoint: str) -> Raw:
    """A raw consumer that reads delivery batches (``Batch-Deliveries: 64``), joins and
    then never reads or acknowledges again."""
    peer = _raw(zctx, endpoint, {"Batch-Deliveries": "64"})
    peer.send(tmqp.encode(join_frame("js", CHANNEL))[0])
    assert _until(peer, "js")[-1].content_type == ResultCode.OK
    return peer


def _deliveries(peer: Raw) -> list[str]:
    """The payloads of the deliveries waiting in ``peer``'s socket, read without waiting
    (a delivery batch's entries each)."""
    got: list[str] = []
    while True:
        try:
            msg = tmqp.decode((peer.sock.recv(zmq.NOBLOCK),))
        except zmq.Again:
            return got
        if not isinstance(msg, tmqp.Frame):
            continue
        if msg.message_type == MessageType.SERVER and msg.content_type == batch.DELIVERIES:
            entries = [tmqp.decode((e,)) for e in batch.unpack(msg.payload, 1024)]
            got += [bytes(e.payload).decode() for e in entries if isinstance(e, tmqp.Frame)]
        elif msg.message_type == MessageType.QUEUE:
            got.append(bytes(msg.payload).decode())


def _info(admin: Client) -> dict[str, Any]:
    info: dict[str, Any] = admin.queue_info(CHANNEL, 1)
    return info


def test_a_consumer_that_stops_mid_batch_holds_its_window_and_its_share_is_redelivered(
    server: Server, zctx: Ctx
) -> None:
    """A round-robin queue whose deliveries wait for an acknowledge, a window of
    ``WINDOW`` each, two consumers reading delivery batches: one stops reading at once.
    The stuck consumer holds at most its window, the other gets everything else; when
    the stuck one's connection goes away its share comes to the other: every push
    delivered once to the reading consumer and acknowledged to the producer (the queue
    acknowledges a push once a consumer did), none lost."""
    endpoint = _endpoint(server)
    admin = Client(endpoint, context=zctx, timeout=LOADED).connect()
    options = {"Status": 2, "RequestAcknowledge": True, "Prefetch": WINDOW}
    admin.create_queue(CHANNEL, 1, options)
    stuck = _stopping_consumer(zctx, endpoint)
    reader = Client(endpoint, context=zctx, timeout=LOADED).connect()
    producer = Client(endpoint, context=zctx, timeout=LOADED).connect()
    got: list[str] = []

    def read() -> None:
        m = reader.receive(timeout=0.05)
        while m is not None:
            got.append(bytes(m.payload).decode())
            reader.ack(m)
            m = reader.receive(timeout=0)

    try:
        reader.join(CHANNEL)
        payloads = [b"p%d" % k for k in range(PUSHES)]
        # (acknowledged once a consumer did: the stuck one's share only at the end)
        futures = producer.push_many_async(CHANNEL, 1, payloads)

        def only_the_stuck_window_left() -> bool:
            read()
            info = _info(admin)
            return (
                info["Messages"] == 0
                and info["Acks"] == len(got)  # (the reader's acknowledges all arrived)
                and len(got) + info["PendingAcknowledges"] == PUSHES
            )

        assert wait_until(only_the_stuck_window_left, LOADED)
        # what the stuck one holds, from its socket (read only now, never acknowledged:
        # the broker cannot tell); the reader may still have a window on the way
        held: list[str] = []

        def all_accounted() -> bool:
            read()
            held.extend(_deliveries(stuck))
            return len(got) + len(held) >= PUSHES

        assert wait_until(all_accounted, LOADED)
        assert 1 <= len(held) <= WINDOW  # it took its turns, then its window closed
        assert len(got) + len(held) == len(set(got) | set(held)) == PUSHES
        assert wait_until(lambda: _info(admin)["PendingAcknowledges"] == len(held), LOADED)

        stuck.close()  # it goes away without a word: its deliveries come back
        assert wait_until(lambda: (read(), len(got) >= PUSHES)[1], LOADED)
        assert sorted(got) == sorted(p.decode() for p in payloads)  # each once
        assert wait_until(lambda: _info(admin)["PendingAcknowledges"] == 0, LOADED)
        info = _info(admin)
        assert (info["Messages"], info["ReceivedMessages"]) == (0, PUSHES)
        for future in futures:  # every push acknowledged to its producer, positively
            assert future.result(LOADED).message_type == MessageType.ACK
            assert header(future.result(), Header.NACK_REASON) is None
    finally:
        producer.close()
        reader.close()
        stuck.close()
        admin.close()
