"""The adversary's review of AUTO runs and joined writes (session 21, adv21; autorun21's
``AutoRun`` / ``flow.AUTO_RUN``, write21's ``deliver_plain``), against a real listener
and engine over loopback sockets.

A consumer (``ack:auto``) stops reading while runs are in flight to it (its transport
full: deliveries held by the listener, more waiting in the engine as one run entry); a
second consumer subscribes; a producer keeps sending; then the first leaves -- by
UNSUBSCRIBE (with a receipt, reading on), by a reset (no FIN, nothing read), or by
DISCONNECT with a receipt (reading to the end).  Every message is delivered once (none
twice); none is lost but those a reset's kernel buffers swallowed (``ack:auto``: taken by
the transport is acknowledged); the first gets its share in order, the second its share
in order but for the first's returns, which come back together, in order (one step
down in its sequence at most); the queue ends empty."""

from __future__ import annotations

import itertools
import socket
import struct
import threading
from typing import Any

import pytest

from broker.stomp.engine_mapping import QUEUE_ID
from broker.stomp.frames import Command
from tests.polling import WAIT, wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import SMALL_OUTBOUND, Broker, numbered, shrink_send_buffers

MAX_OUTBOUND = SMALL_OUTBOUND
COUNT = 3000
#: Sent before the second consumer subscribes: its whole window (1000) in flight to the
#: first (it takes nothing more), or part of it (the first still takes its turns).
FIRST_PARTS = (1500, 400)
CHUNK = 100  # SENDs per write of the rest
BODY = 100
#: What a reset can lose: the messages in the two kernels' buffers (4 KiB asked on each
#: side, doubled by Linux, plus what loopback keeps in flight), with room to spare.
RESET_LOSS = 128 * 1024


def _sends(queue: str, numbers: range) -> bytes:
    return b"".join(
        b"SEND\ndestination:/queue/%s\n\n%s\x00" % (queue.encode(), numbered(i)) for i in numbers
    )


def _engine_sync(b: Broker) -> None:
    """Wait until the engine thread ran every operation handed to it before this one."""
    done = threading.Event()

    def op(now: float) -> list[object]:
        done.set()
        return []

    b.door.submit(op)  # type: ignore[arg-type]
    assert done.wait(WAIT)


def _stalled(b: Broker, queue: str) -> Raw:
    """A consumer of ``queue`` that reads nothing more after its RECEIPT, with small
    socket buffers on both ends: what it does not read waits in the listener."""
    before = b.listener.call(lambda: set(b.listener.connections))
    raw = Raw(b.listener.port, rcvbuf=4096)
    raw.connect()
    raw.send(
        b"SUBSCRIBE\nid:s\ndestination:/queue/%s\nack:auto\nreceipt:r\n\n\x00" % queue.encode()
    )
    assert raw.next().header("receipt-id") == "r"
    shrink_send_buffers(b.listener, lambda cid, _: cid not in before)
    return raw


def _numbers(bodies: list[bytes]) -> list[int]:
    return [int(body[:6]) for body in bodies]


def _read_until(raw: Raw, command: Command, receipt: str) -> list[bytes]:
    """MESSAGE bodies read until the RECEIPT ``receipt`` (nothing else may come)."""
    bodies = []
    while True:
        frame = raw.next()
        if frame.command is Command.MESSAGE:
            bodies.append(frame.body)
            continue
        assert (frame.command, frame.header("receipt-id")) == (command, receipt), frame
        return bodies


def _descents(numbers: list[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(numbers) if b < a)


def _count_returns(b: Broker) -> list[int]:
    """The sizes of the returns the listener hands the engine (``op_settle`` with
    ``unwritten``: deliveries that never reached the socket), in order, listed as they
    run on the engine thread.

    An UNSUBSCRIBE's returns need not come back as one: what the engine handed the
    leaving consumer after the listener read the frame and before the engine ran the
    unsubscribe reaches the listener after the subscription went, one hand-over per
    engine batch, each returned as it arrives (``EngineBackend._deliver_to``:
    "unsubscribed meanwhile"); the other consumer reads on between two such returns,
    so each one past the first is a step down in its sequence.  How many there are
    is the engine thread's timing (one mostly; two or more on a loaded machine: the
    listener slower to take the engine's hand-overs), not a fault: each is in order."""
    door = b.door
    settle = door.op_settle
    sizes: list[int] = []

    def counted(conn: int, settles: Any, counts: int, now: float, *rest: Any) -> Any:
        if len(rest) > 1 and rest[1]:
            sizes.append(len(rest[1]))
        return settle(conn, settles, counts, now, *rest)

    door.op_settle = counted  # type: ignore[method-assign]
    return sizes


def _leave(b: Broker, first: Raw, how: str) -> list[bytes]:
    """The first consumer leaves ``how``; returns what it read.  Returns once the
    engine has taken back everything it had not delivered."""
    if how == "unsubscribe":
        first.send(b"UNSUBSCRIBE\nid:s\nreceipt:u\n\n\x00")
        got = _read_until(first, Command.RECEIPT, "u")
        first.send(b"DISCONNECT\nreceipt:bye\n\n\x00")  # nothing for it after the RECEIPT
        assert _read_until(first, Command.RECEIPT, "bye") == []
    elif how == "disconnect":
        first.send(b"DISCONNECT\nreceipt:bye\n\n\x00")
        got = _read_until(first, Command.RECEIPT, "bye")
        assert first.sock.recv(1) == b""  # then the server closes
    else:  # a reset: no FIN, nothing read
        first.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        got = []
    first.close()
    assert wait_until(lambda: b.listener.call(lambda: len(b.listener.connections)) == 2)
    _engine_sync(b)  # (its disconnect handled: what it held is back in the queue)
    return got


@pytest.mark.parametrize("first_part", FIRST_PARTS, ids=["window-full", "room-left"])
@pytest.mark.parametrize("how", ["unsubscribe", "reset", "disconnect"])
def test_a_stalled_consumer_leaving_mid_run_loses_and_repeats_nothing(
    small: Broker, how: str, first_part: int
) -> None:
    returns = _count_returns(small)
    first = _stalled(small, "runs")
    producer = Raw(small.listener.port)
    second = Raw(small.listener.port)
    sender: threading.Thread | None = None
    try:
        producer.connect()
        producer.send(_sends("runs", range(first_part)))
        assert wait_until(lambda: small.held_deliveries() > 0)  # (the first's transport is full)
        second.connect()
        second.send(b"SUBSCRIBE\nid:t\ndestination:/queue/runs\nack:auto\nreceipt:t\n\n\x00")
        second_bodies = _read_until(second, Command.RECEIPT, "t")

        def send_rest() -> None:
            for start in range(first_part, COUNT, CHUNK):
                producer.send(_sends("runs", range(start, min(start + CHUNK, COUNT))))

        sender = threading.Thread(target=send_rest)
        sender.start()  # (runs keep coming while the first leaves)
        first_bodies = _leave(small, first, how)
        sender.join(WAIT)
        assert not sender.is_alive()
        producer.send(b"SEND\ndestination:/queue/runs\n\nmarker\x00")
        while (body := second.next().body) != b"marker":
            second_bodies.append(body)
    finally:
        if sender is not None:
            sender.join(WAIT)
        for raw in (first, producer, second):
            raw.close()
    firsts, seconds = _numbers(first_bodies), _numbers(second_bodies)
    assert firsts == sorted(set(firsts))  # the first's share in order, once each
    assert len(set(seconds)) == len(seconds)  # none twice
    # the first's returns in order, together but for UNSUBSCRIBE's: the listener
    # returns each hand-over of the engine's that reaches it after the subscription
    # went on its own (see _count_returns), and the second reads on in between
    assert _descents(seconds) <= max(1, len(returns)), (returns, seconds)
    assert not set(firsts) & set(seconds)  # none to both
    missing = set(range(COUNT)) - set(firsts) - set(seconds)
    if how == "reset":
        assert len(missing) * (BODY + 80) <= RESET_LOSS, sorted(missing)
    else:
        assert not missing, sorted(missing)
    queue = small.engine.channels["runs"].queues[QUEUE_ID]
    assert wait_until(
        lambda: queue.message_count == 0 and not (queue.pending or queue.auto_in_flight)
    )
