"""An acknowledged batch never hides a push it did not take (``broker.batch``).

A producer's batch with the pending-ack flag is answered by one acknowledge whose
``Refused`` rows name, by index, every entry not taken -- plain pushes too: refused by
their queue (a full queue, a stopped one, one too big), not saved by a full disk, or
failed inside (``RunFailed``, one push of a run raising).  Before, a plain push's
refusal went unsaid and the producer was told "all taken".  Both of the server's paths
for a batch are played: the run of records (``Server._plain_batch``, ``push_runs`` on)
and the frames (``Engine.receive_batch``, ``push_runs`` off).

Real sockets (loopback TCP, a random port), a real ``Server`` and ``Engine``; the full
disk is a store that raises as the log does on ENOSPC (``tests.broker.full_disk``);
every wait polls up to a deadline a machine at load 50 makes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from broker import tmqp
from broker.client.blocking import Client
from broker.client.errors import RemoteError
from broker.client.frames import join_frame
from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.engine import Engine
from broker.protocol import MessageType
from broker.server.server import Server, ServerOptions
from tests.broker.full_disk import FullDisk
from tests.broker.test_batch import Raw, push_frame
from tests.broker.test_push_runs import LOADED, _batch_of

Ctx = zmq.Context[zmq.Socket[bytes]]
CHANNEL = "d"
#: Pushes of each batch; the queue takes the first ``ROOM`` of them.
PUSHES = 6
ROOM = 3
#: The refusal of a full queue and of a full disk, as a batch's acknowledge names them.
FULL = ["limit-exceeded", "push refused by the queue"]
UNSAVED = ["failed", "not saved: the store failed"]

Serve = Callable[..., str]


@pytest.fixture
def serve(zctx: Ctx) -> Iterator[Serve]:
    """Start a server on a random loopback port: ``serve(engine, push_runs)``."""
    servers: list[Server] = []

    def start(engine: Engine, push_runs: bool) -> str:
        options = ServerOptions(endpoint="tcp://127.0.0.1:*", push_runs=push_runs)
        server = Server(engine, options, context=zctx)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


def plain(mid: str, queue_id: int = 1) -> bytes:
    """A plain push (no headers, waits for nothing of its own) of payload ``mid``."""
    return push_frame(mid, queue_id, mid.encode(), channel=CHANNEL)


def _producer(zctx: Ctx, endpoint: str) -> Raw:
    producer = Raw(zctx, endpoint)
    producer.sock.rcvtimeo = int(LOADED * 1000)
    return producer


def _answer(producer: Raw, batch_id: str) -> list[list[Any]]:
    """The ``Refused`` rows of the acknowledge of ``batch_id`` ([]: all taken)."""
    answer = producer.frame()
    assert (answer.message_type, answer.message_id) == (MessageType.ACK, batch_id)
    return json.loads(answer.payload)["Refused"] if answer.payload else []


def _joined(zctx: Ctx, endpoint: str) -> Raw:
    """A raw consumer of ``CHANNEL`` (deliveries without acknowledge: done once sent)."""
    consumer = Raw(zctx, endpoint)
    consumer.sock.rcvtimeo = int(LOADED * 1000)
    consumer.send(tmqp.encode(join_frame("j", CHANNEL))[0])
    assert consumer.frame().message_id == "j"
    return consumer


def _read(consumer: Raw, count: int) -> list[str]:
    """The ids of the next ``count`` deliveries ``consumer`` receives."""
    got: list[str] = []
    while len(got) < count:
        msg = tmqp.decode((consumer.sock.recv(),))
        if isinstance(msg, tmqp.Frame) and msg.message_type == MessageType.QUEUE:
            got.append(msg.message_id)
    return got


def _consume(zctx: Ctx, endpoint: str, count: int) -> list[str]:
    """Join ``CHANNEL`` with a raw consumer, read ``count`` deliveries (their ids), leave.
    (Once per test: a closed consumer is a member until the broker sees its connection
    end, and a delivery without acknowledge that libzmq took for it is done.)"""
    consumer = _joined(zctx, endpoint)
    try:
        return _read(consumer, count)
    finally:
        consumer.close()


@pytest.mark.parametrize("push_runs", [True, False], ids=["records", "frames"])
def test_a_full_queue_s_refusals_are_named_and_the_rest_delivered_once(
    serve: Serve, zctx: Ctx, push_runs: bool
) -> None:
    """A queue of at most ``ROOM`` messages (``MessageLimit``), nobody reading: an
    acknowledged batch of six plain pushes is answered with the last three refused by
    index (before: an empty acknowledge); once read, their resend is taken; every push
    reaches the consumer once."""
    endpoint = serve(Engine(), push_runs)
    admin = Client(endpoint, context=zctx, timeout=LOADED).connect()
    producer = _producer(zctx, endpoint)
    try:
        admin.create_queue(CHANNEL, 1, {"Status": 1, "MessageLimit": ROOM})
        ids = [f"m{k}" for k in range(PUSHES)]
        producer.send(_batch_of("B", [plain(mid) for mid in ids], ack=True))
        assert _answer(producer, "B") == [[k, *FULL] for k in range(ROOM, PUSHES)]
        consumer = _joined(zctx, endpoint)
        try:
            assert _read(consumer, ROOM) == ids[:ROOM]
            # the producer resends exactly what it was told was not taken
            producer.send(_batch_of("B2", [plain(mid) for mid in ids[ROOM:]], ack=True))
            assert _answer(producer, "B2") == []
            assert _read(consumer, PUSHES - ROOM) == ids[ROOM:]
        finally:
            consumer.close()
        info = admin.queue_info(CHANNEL, 1)
        assert (info["ReceivedMessages"], info["Messages"], info["SentMessages"]) == (
            PUSHES,
            0,
            PUSHES,
        )
    finally:
        producer.close()
        admin.close()


@pytest.mark.parametrize("push_runs", [True, False], ids=["records", "frames"])
def test_a_full_disk_s_unsaved_pushes_are_named(serve: Serve, zctx: Ctx, push_runs: bool) -> None:
    """A persistent queue whose store has room for ``ROOM`` messages: the acknowledge of
    a batch of six plain pushes names the three not saved (before: "all taken"); they
    stay queued in memory, as an unsaved push waiting for a response does (at least
    once): the consumer gets each of the six once."""
    handlers = {"persistent": PersistentDeliveryHandler()}
    engine = Engine(store=FullDisk(room=ROOM), handlers=handlers)
    endpoint = serve(engine, push_runs)
    admin = Client(endpoint, context=zctx, timeout=LOADED).connect()
    producer = _producer(zctx, endpoint)
    try:
        admin.create_queue(CHANNEL, 1, {"Status": 1, "MessageDeliveryHandler": "persistent"})
        ids = [f"m{k}" for k in range(PUSHES)]
        producer.send(_batch_of("B", [plain(mid) for mid in ids], ack=True))
        assert _answer(producer, "B") == [[k, *UNSAVED] for k in range(ROOM, PUSHES)]
        assert _consume(zctx, endpoint, PUSHES) == ids
        info = admin.queue_info(CHANNEL, 1)
        assert (info["SavedMessages"], info["SentMessages"], info["Messages"]) == (ROOM, PUSHES, 0)
    finally:
        producer.close()
        admin.close()


@pytest.mark.parametrize("push_runs", [True, False], ids=["records", "frames"])
def test_the_client_s_acknowledged_batches_return_exactly_the_refused_indexes(
    serve: Serve, zctx: Ctx, push_runs: bool
) -> None:
    """The client's acknowledged batch API (``push_many``): the pushes a full queue
    refused come back as (index, RemoteError) with the queue's reason; the others are
    delivered once."""
    endpoint = serve(Engine(), push_runs)
    producer = Client(endpoint, context=zctx, timeout=LOADED).connect()
    try:
        producer.create_queue(CHANNEL, 1, {"Status": 1, "MessageLimit": ROOM})
        failed = producer.push_many(CHANNEL, 1, [b"p%d" % k for k in range(PUSHES)])
        assert [index for index, _err in failed] == list(range(ROOM, PUSHES))
        for _index, err in failed:
            assert isinstance(err, RemoteError)
            assert "push refused by the queue" in str(err)
        assert len(_consume(zctx, endpoint, ROOM)) == ROOM
        assert producer.queue_info(CHANNEL, 1)["ReceivedMessages"] == ROOM
    finally:
        producer.close()


# -- copies: CC queues and durable subscriptions -------------------------------------------
# A push is taken by its queue and copied into others (``CC`` headers, the durable
# subscriptions of its channel).  A copy that fails partway (its store refused the save) is
# not silence: as a RabbitMQ publisher is nacked when one of the queues its message was
# routed to refused it, the producer hears "failed" naming where the message was taken and
# where not; the message stays where it was taken, and the resend is no duplicate.

SUB = "s1"


def not_copied(*missed: str) -> list[str]:
    """The refusal of a push its queue took but ``missed`` did not."""
    return ["failed", f"taken by {CHANNEL}/1, not by {', '.join(missed)}"]


def with_cc(mid: str, cc: str) -> bytes:
    """A push with one ``CC`` header (no acknowledge of its own)."""
    return push_frame(mid, 1, mid.encode(), channel=CHANNEL, headers=(("CC", cc),))


def _persistent_engine() -> Engine:
    """An engine whose store has room for ``ROOM`` messages (then refuses as on ENOSPC)."""
    handlers = {"persistent": PersistentDeliveryHandler()}
    return Engine(store=FullDisk(room=ROOM), handlers=handlers)


def _drain_sub(zctx: Ctx, endpoint: str, count: int) -> list[str]:
    """Join the durable subscription, receive and acknowledge ``count`` messages."""
    reader = Client(endpoint, context=zctx, timeout=LOADED).connect()
    try:
        reader.join(f"/dsub/{SUB}")
        got: list[str] = []
        while len(got) < count:
            m = reader.receive(timeout=LOADED)
            assert m is not None, f"got {got}, waited for {count}"
            got.append(bytes(m.payload).decode())
            reader.ack(m)
        return got
    finally:
        reader.close()


@pytest.mark.parametrize("push_runs", [True, False], ids=["records", "frames"])
def test_durable_subscription_copies_not_saved_are_named(
    serve: Serve, zctx: Ctx, push_runs: bool
) -> None:
    """A memory queue with a durable subscription on its channel; the store has room for
    ``ROOM`` copies.  An acknowledged batch of six plain pushes: its acknowledge names the
    three whose copy was not saved (before: "all taken"); every push is where it was taken
    (the queue's consumer and the subscription get the six, the unsaved copies kept in
    memory); their resend is taken again (not a duplicate done) and refused again."""
    endpoint = serve(_persistent_engine(), push_runs)
    admin = Client(endpoint, context=zctx, timeout=LOADED).connect()
    producer = _producer(zctx, endpoint)
    try:
        admin.create_queue(CHANNEL, 1, {"Status": 1})
        admin.create_durable_subscription(SUB, [CHANNEL])
        ids = [f"m{k}" for k in range(PUSHES)]
        producer.send(_batch_of("B", [plain(mid) for mid in ids], ack=True))
        refused = not_copied(f"/dsub/{SUB}/0")
        assert _answer(producer, "B") == [[k, *refused] for k in range(ROOM, PUSHES)]
        assert _consume(zctx, endpoint, PUSHES) == ids
        assert _drain_sub(zctx, endpoint, PUSHES) == ids
        producer.send(_batch_of("B2", [plain(mid) for mid in ids[ROOM:]], ack=True))
        assert _answer(producer, "B2") == [[k, *refused] for k in range(PUSHES - ROOM)]
        assert admin.queue_info(CHANNEL, 1)["ReceivedMessages"] == PUSHES + PUSHES - ROOM
    finally:
        producer.close()
        admin.close()


@pytest.mark.parametrize("persistent", ["copy", "target"])
def test_cc_pushes_not_saved_are_named(serve: Serve, zctx: Ctx, persistent: str) -> None:
    """Plain pushes with a ``CC`` header in an acknowledged batch, the store full after
    ``ROOM`` saves: the CC queue persistent (its copies not saved: "taken by d/1, not by
    keep/1") or the target queue (the push itself not saved, as a push without CC is
    named).  Before, the batch's acknowledge said "all taken" in both cases."""
    endpoint = serve(_persistent_engine(), True)
    admin = Client(endpoint, context=zctx, timeout=LOADED).connect()
    producer = _producer(zctx, endpoint)
    keeper = {"Status": 1, "MessageDeliveryHandler": "persistent"}
    try:
        admin.create_queue(CHANNEL, 1, keeper if persistent == "target" else {"Status": 1})
        admin.create_queue("keep", 1, keeper if persistent == "copy" else {"Status": 1})
        ids = [f"c{k}" for k in range(PUSHES)]
        producer.send(_batch_of("B", [with_cc(mid, "keep;1") for mid in ids], ack=True))
        refused = not_copied("keep/1") if persistent == "copy" else UNSAVED
        assert _answer(producer, "B") == [[k, *refused] for k in range(ROOM, PUSHES)]
        assert _consume(zctx, endpoint, PUSHES) == ids  # (the target queue has them all)
        assert admin.queue_info("keep", 1)["ReceivedMessages"] == PUSHES
    finally:
        producer.close()
        admin.close()


def test_an_acknowledged_push_whose_copy_was_not_saved_is_told_failed(
    serve: Serve, zctx: Ctx
) -> None:
    """A push waiting for its own acknowledge into a queue that acknowledges on receipt,
    its durable subscription's store full: a negative acknowledge naming both queues
    (before: a positive one), and the resend taken again (not a duplicate done)."""
    engine = Engine(store=FullDisk(room=0), handlers={"persistent": PersistentDeliveryHandler()})
    endpoint = serve(engine, True)
    producer = Client(endpoint, context=zctx, timeout=LOADED).connect()
    try:
        producer.create_queue(CHANNEL, 1, {"Status": 1})
        producer.create_durable_subscription(SUB, [CHANNEL])
        for _attempt in range(2):
            with pytest.raises(RemoteError) as err:
                producer.push(CHANNEL, 1, b"x", ack=True, message_id="one")
            assert err.value.reason == not_copied(f"/dsub/{SUB}/0")[1]
        assert producer.queue_info(CHANNEL, 1)["ReceivedMessages"] == 2
    finally:
        producer.close()


def test_a_consumer_s_acknowledge_later_does_not_undo_the_refusal(serve: Serve, zctx: Ctx) -> None:
    """The queue relays its consumer's acknowledge to the producer (``RequestAcknowledge``);
    the copy failed, so the producer was told "failed" at once: when the consumer later
    acknowledges, no positive acknowledge follows (a producer's answer is given once).
    The producer's next request is answered after anything the consumer's acknowledge
    made: everything up to its answer is read."""
    engine = Engine(store=FullDisk(room=0), handlers={"persistent": PersistentDeliveryHandler()})
    endpoint = serve(engine, True)
    admin = Client(endpoint, context=zctx, timeout=LOADED).connect()
    producer = _producer(zctx, endpoint)
    try:
        admin.create_queue(CHANNEL, 1, {"Status": 1, "RequestAcknowledge": True})
        admin.create_queue("mark", 1, {"Status": 1})
        admin.create_durable_subscription(SUB, [CHANNEL])
        producer.send(push_frame("one", 1, b"x", channel=CHANNEL, ack=True))
        nack = producer.frame()
        assert (nack.message_type, nack.message_id) == (MessageType.ACK, "one")
        assert dict(nack.headers)["Nack-Reason"] == "failed"
        admin.join(CHANNEL)
        m = admin.receive(timeout=LOADED)
        assert m is not None and bytes(m.payload) == b"x"
        admin.ack(m)
        assert admin.queue_info(CHANNEL, 1)["Messages"] == 0  # (its acknowledge was served)
        producer.send(push_frame("mk", 1, b"", channel="mark", ack=True))  # the next request
        after = producer.frame()
        assert (after.message_type, after.message_id) == (MessageType.ACK, "mk")
    finally:
        producer.close()
        admin.close()
