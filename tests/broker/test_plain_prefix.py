"""The plain prefix of a run of pushes (``broker.engine.queue.plain_prefix``) and the run
paths that serve it, against the one-by-one path and against hostile peers.

* A queue with a message limit: the run takes only what its consumers' windows have
  room for (one consumer, or several on a round-robin queue); the rest goes through the
  general path (queued up to the limit, then refused), as one push at a time gives.
* Garbage and pushes that end the prefix (an id met earlier in the same run, one too big,
  one for another queue) between plain pushes of a run, on the wire (a live server): the
  others are served in order, the bad ones answered.
* A consumer that stops reading mid-run: the pushes wait in the queue (nothing lost, the
  producer and the broker go on), and all come in order once it reads again.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import zmq

from broker import tmqp
from broker.client.blocking import Client
from broker.client.frames import join_frame
from broker.engine.engine import Engine
from broker.engine.options import BrokerConfig
from broker.protocol import GREETING, ConnectionInfo, MessageType, QueueStatus, ResultCode
from broker.server.server import Server, ServerOptions
from tests.broker.test_batch import Raw, _batch, _entries, push_frame
from tests.polling import wait_until

from .engine_kit import Kit
from .test_engine_batch_path import _counters, _pushes, count_runs, one_by_one

Ctx = zmq.Context[zmq.Socket[bytes]]
MakeClient = Callable[..., Client]
#: Deadline (s) of the waits on the broker: generous, a machine at load 50 must make it.
LOADED = 60.0


def _kit(consumers: int) -> Kit:
    kit = Kit(auto_transmit=False, config=BrokerConfig(wall_clock=lambda: 1_700_000_000.0))
    kit.connect("p")
    for k in range(consumers):
        kit.connect(f"c{k}")
        kit.join(f"c{k}", "ch")
    kit.queue("p", "ch", 1, status=QueueStatus.ROUND_ROBIN, prefetch=2, message_limit=3,
              use_message_id=True)  # fmt: skip
    return kit


@pytest.mark.parametrize("consumers", [1, 2])
def test_a_run_into_a_queue_with_a_message_limit_takes_what_the_windows_have_room_for(
    consumers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = count_runs(monkeypatch)
    batched, single = _kit(consumers), _kit(consumers)
    items = _pushes(batched, "ch", 1, 0, 12)
    got = batched.engine.receive_batch("p", items, batched.now)
    assert got == one_by_one(single.engine, "p", items, single.now)
    assert _counters(batched) == _counters(single)
    assert runs[0] == 1  # the run path took the windows' worth at once
    queue = batched.engine.channels["ch"].queues[1]
    room = 2 * consumers
    # the windows' worth sent, three wait (the limit), the rest refused (not received)
    assert (queue.n_regular, queue.received) == (3, room + 3)
    batched.route(got[0])
    sent = sorted(p for k in range(consumers) for p in batched.payloads(f"c{k}"))
    assert sent == sorted(b"%d" % k for k in range(room))


def test_garbage_and_pushes_that_end_the_prefix_between_plain_pushes_of_a_run(
    server: Server, make_client: MakeClient, zctx: Ctx
) -> None:
    """One batch of plain pushes (the batch itself acknowledged, its entries not): the
    garbage is answered by index in the batch's acknowledge; a
    duplicate of an id met earlier in the batch is counted, not delivered; every other
    push is delivered once, in order."""
    consumer = make_client()
    consumer.create_queue("g", 1, {"Status": 1, "UseMessageId": True, "MessageSizeLimit": 64})
    consumer.create_queue("g", 2, {"Status": 6})  # stopped: pushes into it are refused
    consumer.join("g")
    assert server.endpoint is not None
    peer = Raw(zctx, server.endpoint)
    try:

        def plain(mid: str, body: bytes, queue_id: int = 1) -> bytes:
            return push_frame(mid, queue_id, body, channel="g")

        entries = [
            plain("a", b"a"),
            plain("b", b"b"),
            b"\x11\x00\xff\xff\xff",  # 2: a QUEUE frame whose lengths run past its end
            plain("c", b"c"),
            plain("b", b"b again"),  # 4: an id met earlier in this run: a duplicate
            plain("d", b"d"),
            plain("big", b"x" * 65),  # 6: over the size limit: refused
            plain("e", b"e"),
            plain("s", b"s", queue_id=2),  # 8: a stopped queue: refused
            plain("f", b"f"),
        ]
        peer.send(_batch("B", _entries(*entries)))
        answer = peer.frame()
        assert (answer.message_type, answer.message_id) == (MessageType.ACK, "B")
        refused = json.loads(answer.payload)["Refused"]
        # the garbage by index, and the plain pushes the engine refuses (too big, a
        # stopped queue): the batch's acknowledge names them (before: only the garbage)
        assert [r[0] for r in refused] == [2, 6, 8]
        assert refused[0][1] == "bad-request" and "malformed" in refused[0][2]
        assert refused[1:] == [[6, "limit-exceeded", "push refused by the queue"],
                               [8, "unacceptable", "push refused by the queue"]]  # fmt: skip
        got: list[bytes] = []
        assert wait_until(lambda: _read(consumer, got) >= 6, LOADED)
        assert got == [b"a", b"b", b"c", b"d", b"e", b"f"]
        info = consumer.queue_info("g", 1)
        assert (info["DuplicateMessages"], info["ReceivedMessages"]) == (1, 6)
        # the same peer is still served: a resend of a refused id is no duplicate
        peer.send(_batch("B2", _entries(plain("big", b"small now"))))
        assert peer.frame().message_id == "B2"
        assert wait_until(lambda: _read(consumer, got) >= 7, LOADED)
        assert got[-1] == b"small now"
    finally:
        peer.close()


def _read(consumer: Client, got: list[bytes]) -> int:
    m = consumer.receive(timeout=0.05)
    if m is not None:
        got.append(bytes(m.payload))
    return len(got)


def test_a_consumer_that_stops_reading_mid_run_gets_everything_in_order_later(
    zctx: Ctx,
) -> None:
    """A server whose pipes hold 50 messages, a consumer whose socket takes 20 and that
    reads none of 20 MiB of pushes (more than the kernel's loopback buffers): the broker's
    sends to it fail (its pipe is full), the rest of the producer's runs wait in the
    queue; the broker goes on answering; once it reads, every push comes, once, in order."""
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", hwm=50)
    with Server(Engine(), options, context=zctx) as server:
        assert server.endpoint is not None
        admin = Client(server.endpoint, context=zctx, timeout=10).connect()
        producer = Client(server.endpoint, context=zctx, timeout=10, max_outbox=50_000).connect()
        try:
            _stalled_consumer(server.endpoint, admin, producer, zctx)
        finally:
            producer.close()
            admin.close()


def _stalled_consumer(endpoint: str, admin: Client, producer: Client, zctx: Ctx) -> None:
    admin.create_queue("s", 1, {"Status": 1})
    consumer = zctx.socket(zmq.DEALER)
    consumer.linger = 0
    consumer.rcvhwm = 20
    consumer.rcvtimeo = 10_000
    try:
        consumer.connect(endpoint)
        assert _handshake(consumer)
        total = 5_000
        pad = b"." * 4096

        def body(k: int) -> bytes:
            return b"%d" % k + pad

        for start in range(0, total, 100):
            producer.push_many("s", 1, [body(k) for k in range(start, start + 100)], ack=False)
        producer.push("s", 1, b"last", ack=True, timeout=LOADED)  # every push was taken

        def waiting() -> int:
            return int(admin.queue_info("s", 1)["Messages"])

        assert wait_until(lambda: waiting() > 0, LOADED)  # held back: the pipe is full
        got: list[bytes] = []
        while len(got) < total + 1:
            data = consumer.recv()
            msg = tmqp.decode((data,))
            if type(msg) is tmqp.Frame and msg.message_type == MessageType.QUEUE:
                got.append(bytes(msg.payload))
            elif type(msg) is tmqp.Frame and msg.message_type == MessageType.SERVER:
                for one in tmqp.decode_entries(msg.payload, 1 << 20):
                    assert type(one) is tmqp.Frame
                    got.append(bytes(one.payload))
        assert got == [body(k) for k in range(total)] + [b"last"]
        assert wait_until(lambda: waiting() == 0, LOADED)
    finally:
        consumer.close(linger=0)


def _handshake(sock: zmq.Socket[bytes]) -> bool:
    """Greeting, connection info, then a JOIN of channel ``s`` (what ``Raw`` does, on a
    socket whose receive high-water mark was set before it connected)."""
    sock.send(GREETING)
    first = sock.recv()
    if first != GREETING:
        return False
    info = ConnectionInfo(client_id="", name="slow", properties={})
    sock.send(tmqp.encode(info.to_frame("hs").replace(pending_response=True))[0])
    ready = tmqp.decode((sock.recv(),))
    sock.send(tmqp.encode(join_frame("j", "s"))[0])
    joined = tmqp.decode((sock.recv(),))
    return (
        type(ready) is tmqp.Frame
        and type(joined) is tmqp.Frame
        and joined.message_id == "j"
        and joined.content_type == ResultCode.OK
    )
