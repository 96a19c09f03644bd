"""The client's hot paths match the generated codec: the QUEUE frame encoder, the receive side."""

from __future__ import annotations

import threading

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import tmqp
from broker.client.blocking import Client, Kind, Message, queue_frame_bytes
from broker.protocol import MessageType

from .test_client_session import FakeBroker


@settings(max_examples=200, deadline=None)
@given(
    high=st.booleans(),
    ack=st.booleans(),
    queue_id=st.integers(0, 0xFFFF),
    message_id=st.text(max_size=30),
    source=st.text(max_size=30),
    target=st.text(min_size=1, max_size=30),
    payload=st.one_of(st.binary(max_size=300), st.sampled_from([b"x" * 65535, b"y" * 65536])),
)
def test_fast_queue_frame_equals_codec(
    high: bool,
    ack: bool,
    queue_id: int,
    message_id: str,
    source: str,
    target: str,
    payload: bytes,
) -> None:
    fast = queue_frame_bytes(
        high, ack, queue_id, message_id, target.encode(), payload, source.encode()
    )
    frame = tmqp.Frame(
        high_priority=high,
        message_type=MessageType.QUEUE,
        pending_ack=ack,
        content_type=queue_id,
        message_id=message_id,
        source=source,
        target=target,
        payload=payload,
    )
    if len(message_id.encode()) > 255 or len(source.encode()) > 255:
        assert fast is None
    else:
        assert fast == tmqp.encode(frame)[0]
        assert tmqp.decode([fast]) == frame


@pytest.mark.parametrize("queue_id", [-1, 65536])
def test_out_of_range_falls_back_to_the_codec(queue_id: int) -> None:
    assert queue_frame_bytes(False, False, queue_id, "m", b"ch", b"p") is None


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
    accepting = threading.Thread(target=lambda: rids.append(broker.accept()[0]))
    rids: list[bytes] = []
    accepting.start()
    try:
        client.connect()
        accepting.join(5)
        wire = _frames_to_deliver()
        for data in wire:
            broker.send(rids[0], data)
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
