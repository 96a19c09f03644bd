"""The client's hot paths use the generated codec: what push sends, what the receive side gives."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import zmq

from broker import batch, tmqp
from broker.client.blocking import Client, Kind, Message
from broker.client.errors import UnconfirmedSends
from broker.protocol import MessageType
from tests.polling import wait_until
from zproto.errors import DecodeError, EncodeError

from .test_client_session import PING, FakeBroker


def _connect(client: Client, broker: FakeBroker, client_id: str = "fake-1") -> bytes:
    """Connect ``client`` to the fake broker, which accepts it as ``client_id``; the
    routing id of its session."""
    rids: list[bytes] = []
    accepting = threading.Thread(target=lambda: rids.append(broker.accept(client_id)[0]))
    accepting.start()
    client.connect()
    accepting.join(10)
    return rids[0]


def _pushed(zctx: zmq.Context[zmq.Socket[bytes]], pushes: list[dict[str, Any]]) -> list[bytes]:
    """What the broker receives for each ``Client.push(**kwargs)`` (a live session)."""
    broker = FakeBroker(zctx)
    client = Client(broker.endpoint, context=zctx, threaded=True, timeout=5)
    try:
        _connect(client, broker)
        for kwargs in pushes:
            client.push(**kwargs)
        got = []
        while len(got) < len(pushes):
            _, data = broker.recv(timeout=5)
            if data != PING:
                got.append(data)
        answering = broker.answer_goodbye()  # it read them all: close() has nothing to report
        client.close()
        answering.join(5)
        return got
    finally:
        client.close()
        broker.sock.close(linger=0)


def test_pushed_queue_frames_are_what_the_codec_encodes(
    zctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    pushes: list[dict[str, Any]] = [
        {"channel": "ch", "queue_id": 0, "payload": b"plain", "message_id": "m1"},
        {"channel": "\u00e9t\u00e9", "queue_id": 0xFFFF, "payload": "text", "message_id": "m2",
         "high_priority": True},
        {"channel": "ch", "queue_id": 3, "payload": b"h", "message_id": "m3",
         "headers": {"K": "v"}},
        {"channel": "ch", "queue_id": 4, "payload": b"z" * 60_000, "message_id": "m4"},
    ]  # fmt: skip
    wire = _pushed(zctx, pushes)
    for kwargs, data in zip(pushes, wire, strict=True):
        payload = kwargs["payload"]
        expected = tmqp.Frame(
            high_priority=kwargs.get("high_priority", False),
            message_type=MessageType.QUEUE,
            content_type=kwargs["queue_id"],
            message_id=kwargs["message_id"],
            source="fake-1",
            target=kwargs["channel"],
            headers=tuple(kwargs.get("headers", {}).items()),
            payload=payload.encode() if isinstance(payload, str) else payload,
        )
        assert data == tmqp.encode(expected)[0]


def _next_push(broker: FakeBroker) -> tmqp.Frame:
    while True:
        _, data = broker.recv(timeout=10)
        if data != PING:
            frame = tmqp.decode([data])
            assert isinstance(frame, tmqp.Frame)
            return frame


def test_a_push_after_the_broker_gave_another_client_id_carries_the_new_one(
    zctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """The push encoders are made per client id (``Session.push_encoders``): a session
    that comes back under another id (a broker that did not keep the old one) sends the
    new id as the source, fire-and-forget pushes and batches alike."""
    broker = FakeBroker(zctx)
    client = Client(broker.endpoint, context=zctx, threaded=True, timeout=5,
                    ping_interval=0.2, peer_timeout=0.6, backoff=(0.01, 0.05))  # fmt: skip
    try:
        _connect(client, broker, "first-id")
        client.push("ch", 1, b"one", message_id="m1")
        assert _next_push(broker).source == "first-id"
        # the broker stays silent: the client starts a new session, given another id
        broker.accept("second-id")
        assert wait_until(lambda: client.client_id == "second-id", timeout=10)
        client.push("ch", 1, b"two", message_id="m2")
        client.push("ch", 1, b"three", message_id="m3", high_priority=True)
        got = [_next_push(broker), _next_push(broker)]
        assert [(f.source, f.message_id, f.high_priority) for f in got] == [
            ("second-id", "m2", False),
            ("second-id", "m3", True),
        ]
        # the goodbye answered: only the push before the silence is in doubt
        answering = broker.answer_goodbye()
        with pytest.raises(UnconfirmedSends, match="up to 1 message"):
            client.close()
        answering.join(10)
    finally:
        client.close()
        broker.sock.close(linger=0)


def test_a_push_with_a_priority_that_is_not_a_bool_is_the_codecs_error(
    zctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    broker = FakeBroker(zctx)
    client = Client(broker.endpoint, context=zctx, threaded=False, timeout=5)
    try:
        with pytest.raises(EncodeError, match="high_priority"):
            client.push("ch", 1, b"p", high_priority=2)  # type: ignore[arg-type]
        with pytest.raises(EncodeError, match="high_priority"):
            client.push_many("ch", 1, [b"p"], ack=False, high_priority=2)  # type: ignore[arg-type]
        assert broker.sock.poll(100) == 0
    finally:
        client.close()
        broker.sock.close(linger=0)


@pytest.mark.parametrize("queue_id", [-1, 65536])
def test_out_of_range_push_is_the_codecs_error_and_sends_nothing(
    zctx: zmq.Context[zmq.Socket[bytes]], queue_id: int
) -> None:
    broker = FakeBroker(zctx)
    client = Client(broker.endpoint, context=zctx, threaded=False, timeout=5)
    try:
        with pytest.raises(EncodeError, match="content_type"):
            client.push("ch", queue_id, b"p")
        with pytest.raises(EncodeError, match="target"):
            client.push("t" * 256, 0, b"p")
        assert broker.sock.poll(100) == 0
    finally:
        client.close()
        broker.sock.close(linger=0)


# -- the receive side: the codec's decoder on the broker's vocabulary ---------------------


def test_invalid_utf8_in_a_plain_queue_frame_is_a_decode_error() -> None:
    good = tmqp.encode(tmqp.Frame(message_type=MessageType.QUEUE, message_id="ab", target="c"))[0]
    bad = good[:8] + b"\xff\xfe" + good[10:]
    with pytest.raises(DecodeError):
        tmqp.decode((bad,))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (tmqp.encode(tmqp.Ping())[0], tmqp.Ping()),
        (tmqp.encode(tmqp.Pong())[0], tmqp.Pong()),
        (tmqp.encode(tmqp.Handshake())[0], tmqp.Handshake()),
        # an 8-octet frame that is no literal: everything empty
        (tmqp.encode(tmqp.Frame(message_type=MessageType.QUEUE))[0],
         tmqp.Frame(message_type=MessageType.QUEUE)),
        (b"", None),
        (b"\x11\x10", None),
    ],
)  # fmt: skip
def test_literals_and_short_input(data: bytes, expected: tmqp.Message | None) -> None:
    if expected is None:
        with pytest.raises(DecodeError):
            tmqp.decode((data,))
    else:
        assert tmqp.decode((data,)) == expected


# -- the receive side: plain queue deliveries skip _dispatch ----------------------------


def _frames_to_deliver() -> list[bytes]:
    queue = tmqp.Frame(message_type=MessageType.QUEUE, content_type=3, message_id="q1",
                       source="prod", target="ch", payload=b"plain")  # fmt: skip
    direct = tmqp.Frame(message_type=MessageType.DIRECT, message_id="d1", source="peer",
                        target="me", payload=b"direct")  # fmt: skip
    return [
        tmqp.encode(queue)[0],
        tmqp.encode(queue.replace(message_id="q2", high_priority=True, pending_ack=True))[0],
        tmqp.encode(queue.replace(message_id="q3", headers=(("K", "v"),)))[0],
        # a late end-of-pull marker: a queue frame with headers that is not delivered
        tmqp.encode(
            queue.replace(message_id="", headers=(("Request-Id", "r9"), ("No-Content", "End")))
        )[0],
        tmqp.encode(queue.replace(message_id="q4", payload=b"z" * 70_000))[0],
        # looks like a plain queue frame but its message id is not UTF-8: dropped, logged
        tmqp.encode(queue.replace(message_id="xx"))[0].replace(b"xx", b"\xff\xfe", 1),
        tmqp.encode(direct)[0],
        tmqp.encode(queue.replace(message_id="q5"))[0],
    ]


@pytest.mark.parametrize("threaded", [True, False], ids=["threaded", "poll-on-call"])
def test_received_messages_equal_what_the_codec_decodes(
    zctx: zmq.Context[zmq.Socket[bytes]], threaded: bool, caplog: pytest.LogCaptureFixture
) -> None:
    broker = FakeBroker(zctx)
    client = Client(broker.endpoint, context=zctx, threaded=threaded, timeout=5)
    try:
        rid = _connect(client, broker)
        wire = _frames_to_deliver()
        for data in wire:
            broker.send(rid, data)
        got = [client.receive(timeout=5) for _ in range(6)]
        assert client.receive(timeout=0.1) is None
    finally:
        client.close()
        broker.sock.close(linger=0)
    expected = [tmqp.decode([d]) for i, d in enumerate(wire) if i not in (3, 5)]
    assert [m.frame if m is not None else None for m in got] == expected
    assert all(type(m) is Message and m == Message(m.frame) for m in got)
    assert [m.kind for m in got if m is not None] == [Kind.QUEUE] * 4 + [Kind.DIRECT, Kind.QUEUE]
    assert "undecodable frame" in caplog.text


def _delivery(mid: str, payload: bytes, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    frame = tmqp.Frame(message_type=MessageType.QUEUE, content_type=1, message_id=mid,
                       source="prod", target="ch", headers=headers, payload=payload)  # fmt: skip
    return tmqp.encode(frame)[0]


@pytest.mark.parametrize("threaded", [False, True], ids=["poll-on-call", "threaded"])
def test_batches_of_deliveries_plain_mixed_damaged_and_garbage_between(
    zctx: zmq.Context[zmq.Socket[bytes]], threaded: bool
) -> None:
    """What a broker (or an impostor) sends as batches of deliveries (``broker.batch``):
    plain ones go to the inbox at once (``IOLoop._inbox_batch``), a batch with a header
    entry through the session core (its entries still in order, the header kept), an entry
    cut short or not UTF-8 drops only that entry, an unreadable batch and garbage frames
    are dropped; the client keeps its session and reads on, in order."""
    broker = FakeBroker(zctx)
    client = Client(broker.endpoint, context=zctx, threaded=threaded, timeout=5)
    try:
        rid = _connect(client, broker)
        plain = [_delivery(f"p{i}", b"%d" % i) for i in range(5)]
        mixed = [
            _delivery("m0", b"a"),
            _delivery("m1", b"b", (("k", "v"),)),
            _delivery("m2", b"c"),
        ]
        bad_utf8 = _delivery("x", b"z").replace(b"x", b"\xff", 1)
        damaged = [_delivery("d0", b"1"), bad_utf8, _delivery("d2", b"3")]
        broker.send(rid, batch.deliveries_frame(plain))
        broker.send(rid, b"\x00garbage")
        broker.send(rid, batch.deliveries_frame(mixed))
        broker.send(rid, batch.deliveries_frame(damaged))
        cut = batch.deliveries_frame([_delivery("c0", b"9")])
        broker.send(rid, cut[:-3])  # the frame's own lengths no longer hold: not decoded
        torn = tmqp.encode_frame(message_type=int(MessageType.SERVER),
                                 content_type=batch.DELIVERIES,
                                 payload=b"\xff\x00\x00\x00short")[0]  # fmt: skip
        broker.send(rid, torn)  # an entry longer than the batch: unreadable
        broker.send(rid, _delivery("last", b"end"))
        got: list[Message] = []
        while len(got) < 11:
            m = client.receive(timeout=10)
            assert m is not None, f"only {[g.id for g in got]}"
            got.append(m)
        assert [m.id for m in got] == [f"p{i}" for i in range(5)] + [
            "m0",
            "m1",
            "m2",
            "d0",
            "d2",
            "last",
        ]
        assert [bytes(m.payload) for m in got[5:8]] == [b"a", b"b", b"c"]
        assert got[6].header("k") == "v" and all(m.kind is Kind.QUEUE for m in got)
        assert client.connected
        answering = broker.answer_goodbye()
        client.close()
        answering.join(10)
    finally:
        client.close()
        broker.sock.close(linger=0)
