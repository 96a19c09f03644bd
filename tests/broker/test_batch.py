"""TMQP batches (``broker.batch``): several frames per ZeroMQ message, both ways.

Against a live Server + Engine on a random loopback port; the raw-socket tests build the
batch octets by hand (the layout in ``broker.batch``), not through the client.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator

import pytest
import zmq

from broker import batch, tmqp
from broker.client.blocking import Client, RemoteError
from broker.engine.engine import Engine
from broker.protocol import GREETING, ConnectionInfo, Header, MessageType, ResultCode, header
from broker.server.server import Server, ServerOptions
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
MakeClient = Callable[..., Client]


def _entries(*frames: bytes) -> bytes:
    """A batch payload built by hand: 4-octet little-endian length, then the frame."""
    return b"".join(struct.pack("<I", len(f)) + f for f in frames)


def push_frame(
    mid: str,
    queue_id: int,
    body: bytes,
    *,
    channel: str = "d",
    source: str = "",
    ack: bool = False,
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """A push's octets, built as a raw peer sends it (no source: the server stamps it)."""
    return tmqp.encode_frame(
        message_type=MessageType.QUEUE,
        pending_ack=ack,
        content_type=queue_id,
        message_id=mid,
        source=source,
        target=channel,
        headers=headers,
        payload=body,
    )[0]


def _push(mid: str, channel: str, queue_id: int, body: bytes) -> bytes:
    """An acknowledged push into ``channel``."""
    return push_frame(mid, queue_id, body, channel=channel, ack=True)


class Raw:
    """A hand-driven DEALER peer: greeting, connection info, frames."""

    def __init__(self, ctx: Ctx, endpoint: str, properties: dict[str, str] | None = None):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.rcvtimeo = 10_000
        self.sock.connect(endpoint)
        self.sock.send(GREETING)
        assert self.sock.recv() == GREETING
        info = ConnectionInfo(client_id="", name="raw", properties=properties or {})
        self.sock.send(tmqp.encode(info.to_frame("hs").replace(pending_response=True))[0])
        self.ready = self.frame()
        self.client_id = header(self.ready, Header.CLIENT_ID) or ""

    def frame(self) -> tmqp.Frame:
        msg = tmqp.decode((self.sock.recv(),))
        assert isinstance(msg, tmqp.Frame)
        return msg

    def send(self, data: bytes) -> None:
        self.sock.send(data)

    def close(self) -> None:
        self.sock.close(linger=0)


@pytest.fixture
def raw(zctx: Ctx, server: Server) -> Iterator[Callable[..., Raw]]:
    made: list[Raw] = []

    def make(properties: dict[str, str] | None = None) -> Raw:
        assert server.endpoint is not None
        peer = Raw(zctx, server.endpoint, properties)
        made.append(peer)
        return peer

    yield make
    for peer in made:
        peer.close()


def _batch(mid: str, payload: bytes, ack: bool = True) -> bytes:
    return tmqp.encode_frame(
        message_type=MessageType.SERVER,
        pending_ack=ack,
        content_type=260,
        message_id=mid,
        payload=payload,
    )[0]


def test_the_connect_response_announces_the_batch_limit(raw: Callable[..., Raw]) -> None:
    peer = raw()
    assert header(peer.ready, "Batch-Max") == str(ServerOptions().max_batch_frames) == "1024"


def test_a_batch_with_garbage_in_the_middle_takes_the_good_pushes(
    raw: Callable[..., Raw], make_client: MakeClient
) -> None:
    consumer = make_client()
    consumer.create_queue("b", 1, {"Status": 1})
    consumer.join("b")
    consumer.create_queue("b", 2, {"Status": 6})  # stopped: pushes are refused
    peer = raw()
    garbage = b"\x11\x40\xff\xff\xff"  # a QUEUE frame whose lengths run past its end
    payload = _entries(
        _push("m0", "b", 1, b"zero"),
        garbage,
        _push("m2", "b", 1, b"two"),
        _push("m3", "b", 2, b"stopped"),  # refused by the engine
        _push("m4", "b", 1, b"four"),
    )
    peer.send(_batch("B1", payload))
    answer = peer.frame()
    assert answer.message_type == MessageType.ACK and answer.message_id == "B1"
    assert answer.content_type == 260
    refused = json.loads(answer.payload)["Refused"]
    assert [r[0] for r in refused] == [1, 3]
    assert refused[0][1] == "bad-request" and "malformed" in refused[0][2]
    # exactly one answer: the pushes' own acknowledges were folded into it
    peer.sock.rcvtimeo = 300
    with pytest.raises(zmq.Again):
        peer.sock.recv()
    got = [consumer.receive(timeout=10) for _ in range(3)]
    assert [m.payload for m in got if m is not None] == [b"zero", b"two", b"four"]
    # the process keeps serving the same peer
    peer.sock.rcvtimeo = 10_000
    peer.send(_batch("B2", _entries(_push("m5", "b", 1, b"five"))))
    again = peer.frame()
    assert again.message_id == "B2" and again.payload == b""


def test_a_batch_that_cannot_be_split_is_refused_whole(
    raw: Callable[..., Raw], make_client: MakeClient
) -> None:
    consumer = make_client()
    consumer.create_queue("cut", 1, {"Status": 1})
    peer = raw()
    payload = _entries(_push("m0", "cut", 1, b"zero")) + struct.pack("<I", 99) + b"short"
    peer.send(_batch("B", payload))
    answer = peer.frame()
    assert answer.message_type == MessageType.RESPONSE and answer.message_id == "B"
    assert answer.content_type == ResultCode.BAD_REQUEST
    assert consumer.queue_info("cut", 1)["Messages"] == 0  # nothing taken


def test_a_batch_over_the_entry_limit_is_refused_whole(
    zctx: Ctx,
) -> None:
    opts = ServerOptions(endpoint="tcp://127.0.0.1:*", max_batch_frames=4)
    with Server(Engine(), opts, context=zctx) as srv:
        assert srv.endpoint is not None
        peer = Raw(zctx, srv.endpoint)
        try:
            assert header(peer.ready, "Batch-Max") == "4"
            pushes = [_push(f"m{i}", "lim", 1, b"x") for i in range(5)]
            peer.send(_batch("B5", _entries(*pushes)))
            answer = peer.frame()
            assert answer.content_type == ResultCode.LIMIT_EXCEEDED
            assert "more than 4" in (header(answer, Header.REASON) or "")
            peer.send(_batch("B4", _entries(*pushes[:4])))
            ok = peer.frame()
            assert ok.message_id == "B4" and ok.message_type == MessageType.ACK
            assert ok.payload == b""
        finally:
            peer.close()


def test_batched_deliveries_only_to_a_client_that_asked(
    raw: Callable[..., Raw], make_client: MakeClient
) -> None:
    """An old client (no Batch-Deliveries property) gets one frame per delivery; one that
    asked gets several per message, each counted against its prefetch; deliveries that
    need no acknowledge too, by default (``ServerOptions.unacked_batch``, bounded in
    octets: ``test_unacked_batch.py``)."""
    old = raw()
    new = raw({"Batch-Deliveries": "8"})
    for peer, name in ((old, "old"), (new, "new"), (new, "noack")):
        join = tmqp.Frame(
            message_type=MessageType.SERVER,
            pending_response=True,
            content_type=110,
            message_id=f"j-{name}",
            target=name,
            headers=((Header.PREFETCH, "20"),),
        )
        peer.send(tmqp.encode(join)[0])
        assert peer.frame().message_id == f"j-{name}"
    producer = make_client()
    for name in ("old", "new", "noack"):
        producer.create_queue(name, 1, {"Status": 1, "RequestAcknowledge": name != "noack"})
        payloads = [f"{name}-{i}".encode() for i in range(20)]
        failed = producer.push_many(name, 1, payloads, ack=False)
        assert failed == []
    plain = [old.frame() for _ in range(20)]
    assert all(f.message_type == MessageType.QUEUE for f in plain)
    assert [f.payload for f in plain] == [f"old-{i}".encode() for i in range(20)]
    payloads: list[bytes] = []
    messages = 0
    while len(payloads) < 20:
        f = new.frame()
        messages += 1
        if f.message_type == MessageType.SERVER:
            assert f.content_type == 261
            inner = batch.unpack(f.payload, 1024)
            assert 1 < len(inner) <= 8
            payloads += [tmqp.decode((d,)).payload for d in inner]  # type: ignore[union-attr]
        else:
            payloads.append(f.payload)
    assert payloads == [f"new-{i}".encode() for i in range(20)]
    assert messages < 20  # some arrived together
    payloads, messages = [], 0
    while len(payloads) < 20:
        f = new.frame()
        messages += 1
        if f.message_type == MessageType.SERVER:
            inner = [tmqp.decode((d,)) for d in batch.unpack(f.payload, 1024)]
            assert 1 < len(inner) <= 8
            assert not any(i.pending_ack for i in inner)  # type: ignore[union-attr]
            payloads += [i.payload for i in inner]  # type: ignore[union-attr]
        else:
            assert f.message_type == MessageType.QUEUE and not f.pending_ack
            payloads.append(f.payload)
    assert payloads == [f"noack-{i}".encode() for i in range(20)]
    assert messages < 20  # some arrived together


@pytest.mark.parametrize("threaded", [True, False], ids=["threaded", "poll-on-call"])
def test_push_many_and_a_batch_reading_consumer(make_client: MakeClient, threaded: bool) -> None:
    consumer = make_client(threaded=threaded)
    producer = make_client(threaded=threaded)
    consumer.create_queue("many", 1, {"Status": 1, "RequestAcknowledge": True})
    consumer.join("many", prefetch=64)
    # the queue acknowledges a push once its consumer did: each ack comes "later"
    futures = producer.push_many_async("many", 1, [f"p{i}" for i in range(1000)])
    got = []
    while len(got) < 1000:
        m = consumer.receive(timeout=10)
        assert m is not None
        got.append(m)
        if len(got) % 50 == 0:
            consumer.ack_many(got[-50:])
    assert [m.payload for m in got] == [f"p{i}".encode() for i in range(1000)]
    assert wait_until(lambda: consumer.queue_info("many", 1)["Acks"] == 1000)
    for future in futures:
        future.result(10)
    stats = producer.stats()["server"]
    assert stats["batched_in"] >= 1000  # pushes and acks came in batches
    assert stats["batched_out"] > 0


def test_push_many_reports_each_refused_push(make_client: MakeClient) -> None:
    client = make_client()
    client.create_queue("small", 1, {"Status": 1, "MessageLimit": 3})
    failed = client.push_many("small", 1, [b"a", b"b", b"c", b"d", b"e"])
    assert [i for i, _e in failed] == [3, 4]
    assert all(isinstance(e, RemoteError) for _i, e in failed)
    assert client.queue_info("small", 1)["Messages"] == 3


def test_a_batch_reading_consumer_that_stops_reading_holds_at_most_its_prefetch(
    raw: Callable[..., Raw], make_client: MakeClient
) -> None:
    """Each delivery in a batch takes a slot of the consumer's prefetch: a consumer that
    reads nothing and acknowledges nothing is sent its prefetch, no more."""
    producer = make_client()
    producer.create_queue("stall", 1, {"Status": 1, "RequestAcknowledge": True})
    peer = raw({"Batch-Deliveries": "16"})
    join = tmqp.Frame(
        message_type=MessageType.SERVER,
        pending_response=True,
        content_type=110,
        message_id="j",
        target="stall",
        headers=((Header.PREFETCH, "20"),),
    )
    peer.send(tmqp.encode(join)[0])
    assert peer.frame().message_id == "j"
    assert producer.push_many("stall", 1, [b"%d" % i for i in range(300)], ack=False) == []
    assert wait_until(lambda: producer.queue_info("stall", 1)["ReceivedMessages"] == 300)
    info = producer.queue_info("stall", 1)
    assert (info["InFlight"], info["Messages"]) == (20, 280)  # the rest waits in the queue
    entries = 0
    peer.sock.rcvtimeo = 500
    while True:
        try:
            f = peer.frame()
        except zmq.Again:
            break
        entries += len(batch.unpack(f.payload, 1024)) if f.content_type == 261 else 1
    assert entries == 20


class _EngineWithoutBatches(Engine):
    """An engine as before batches: the server then neither announces nor takes them."""

    receive_batch = None  # type: ignore[assignment]


def test_a_new_client_against_a_broker_without_batches_sends_one_frame_each(
    zctx: Ctx,
) -> None:
    opts = ServerOptions(endpoint="tcp://127.0.0.1:*")
    with Server(_EngineWithoutBatches(), opts, context=zctx) as srv:
        assert srv.endpoint is not None
        peer = Raw(zctx, srv.endpoint)
        try:
            assert header(peer.ready, "Batch-Max") is None
        finally:
            peer.close()
        with Client(srv.endpoint, context=zctx, timeout=10).connect() as client:
            client.create_queue("old", 1, {"Status": 3})  # a pull queue: nothing delivered
            assert client.push_many("old", 1, [b"%d" % i for i in range(300)]) == []
            assert client.queue_info("old", 1)["Messages"] == 300
            stats = client.stats()["server"]
            assert stats["batched_in"] == 0 and stats["frames_in"] >= 300


def test_the_send_path_batches_only_while_a_batch_reading_client_is_connected(
    server: Server, make_client: MakeClient
) -> None:
    """The send path counts the connected clients that read delivery batches: the batched
    flush is taken while one is there, and left again once the last one said goodbye (it
    was a flag set by the first such client and never cleared)."""
    sender = server.sender
    assert sender.batching == 0
    first = make_client()
    second = make_client()
    assert wait_until(lambda: sender.batching == 2, 10), sender.batching
    first.close()
    assert wait_until(lambda: sender.batching == 1, 10), sender.batching
    second.close()
    assert wait_until(lambda: sender.batching == 0, 10), sender.batching
