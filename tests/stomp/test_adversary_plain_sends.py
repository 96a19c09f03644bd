"""The second adversary review (session 22, adv22b): lean22's ``PlainSends`` (a run of
plain SENDs reaching the engine as one lazy sequence) read in unusual ways while part of
it is in flight as an ``AutoRun`` to a stalled ``ack:auto`` consumer, against a real
listener and engine over loopback sockets (``tests.stomp.two_doors``).

A consumer stops reading (its transport full: deliveries held by the listener, more in
the engine as one run entry) while runs come in; then, mid-run, one of: a browser
(``browser:true``) reads the queue, a second consumer with a ``selector`` joins (the
handler's quiet test turns False: what is in flight as AUTO must take the tracked
path), a TMQP admin switches on ``WaitForAcknowledge`` or ``Retain``; more runs come;
then the first consumer leaves (a reset) and a plain consumer drains the rest.

Every message reaches a consumer once at most; none is lost but those a reset's kernel
buffers swallowed (``ack:auto``: taken by the transport is acknowledged); every MESSAGE's
``message-id`` is the door's id for that SEND (``<prefix><conn>-<n>``, numbered in the
connection's SEND order), whoever delivers it and whatever made it; a browser sees each
queued message under that same id; the queue ends with nothing in flight."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from broker.client.blocking import Client
from broker.stomp.frames import Command, Frame
from tests.polling import wait_until
from tests.stomp.test_adversary_runs import _engine_sync, _stalled
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker, Ctx, numbered

QUEUE = "lazy"
FIRST = 1500  # SENDs before the twist: the stalled consumer's window (1000) in flight
REST = 1500  # SENDs after it
CHUNK = 100  # SENDs per write
#: What a reset can lose: the messages in the two kernels' buffers (4 KiB asked on each
#: side, doubled by Linux, plus what loopback keeps in flight), with room to spare.
RESET_LOSS = 128 * 1024
BODY = 100


@pytest.fixture
def admin(small: Broker, zctx: Ctx) -> Iterator[Client]:
    client = Client(small.endpoint, context=zctx, timeout=10.0).connect()
    yield client
    client.close()


def _send(producer: Raw, numbers: range) -> None:
    """SENDs of ``numbered`` bodies, every tenth with a header ``n:1`` (another header
    block: a run of its own), in writes of ``CHUNK``, a receipt after each write."""
    for start in range(numbers.start, numbers.stop, CHUNK):
        part = range(start, min(start + CHUNK, numbers.stop))
        producer.send(
            b"".join(
                b"SEND\ndestination:/queue/%s\n%s\n%s\x00"
                % (QUEUE.encode(), b"n:1\n" if i % 10 == 0 else b"", numbered(i, BODY))
                for i in part
            )
            + b"SEND\ndestination:/queue/probe\nreceipt:w%d\n\nprobe\x00" % start
        )
        frame = producer.next()
        assert frame.header("receipt-id") == f"w{start}", frame


def _drain(raw: Raw, receipt: str) -> list[Frame]:
    """MESSAGEs read until the RECEIPT ``receipt``."""
    frames = []
    while (frame := raw.next()).command is Command.MESSAGE:
        frames.append(frame)
    assert frame.header("receipt-id") == receipt, frame
    return frames


def _ids(frames: list[Frame]) -> dict[int, str]:
    """Body number -> message-id, each number once."""
    found: dict[int, str] = {}
    for frame in frames:
        number = int(bytes(frame.body[:6]))
        assert number not in found, f"{number} delivered twice"
        found[number] = str(frame.header("message-id"))
    return found


def _info(admin: Client) -> dict[str, Any]:
    info = admin.queue_info(QUEUE, 0)
    return {k: info[k] for k in ("Messages", "InFlight", "PendingAcknowledges")}


@pytest.mark.parametrize("twist", ["browser", "selector", "wait-for-ack", "retain"])
def test_plain_sends_in_flight_as_a_run_keep_their_ids_through_a_mid_run_twist(
    small: Broker, admin: Client, twist: str
) -> None:
    first = _stalled(small, QUEUE)
    producer = Raw(small.listener.port)
    other = Raw(small.listener.port)
    last = Raw(small.listener.port)
    try:
        producer.connect()
        # the id prefix of the producer's SENDs: read off its first one (a probe)
        other.connect()
        other.send(b"SUBSCRIBE\nid:p\ndestination:/queue/probe\nreceipt:p\n\n\x00")
        assert other.next().command is Command.RECEIPT
        producer.send(b"SEND\ndestination:/queue/probe\n\nprobe\x00")
        probe_id = str(other.next().header("message-id"))
        prefix, _, n = probe_id.rpartition("-")
        other.send(b"UNSUBSCRIBE\nid:p\nreceipt:u\n\n\x00")
        _drain(other, "u")
        # SEND i (a body numbered i) is the producer's SEND 1 + i + i // CHUNK (a probe
        # with a receipt after each write), whose id is the number after the probe's
        first_number = int(n) + 1

        def door_id(i: int) -> str:
            return f"{prefix}-{first_number + i + i // CHUNK}"

        _send(producer, range(FIRST))
        assert wait_until(lambda: small.held_deliveries() > 0)  # (its transport is full)
        browsed: list[Frame] = []
        if twist == "browser":
            other.send(
                b"SUBSCRIBE\nid:b\ndestination:/queue/%s\nbrowser:true\n\n\x00" % QUEUE.encode()
            )
            while (frame := other.next()).header("browser") != "end":
                browsed.append(frame)
        elif twist == "selector":
            other.send(
                b"SUBSCRIBE\nid:t\ndestination:/queue/%s\nack:client-individual\n"
                b"selector:n = '1'\nreceipt:t\n\n\x00" % QUEUE.encode()
            )
            _drain(other, "t")
        elif twist == "wait-for-ack":
            admin.update_queue(QUEUE, 0, {"WaitForAcknowledge": True})
        else:
            admin.update_queue(QUEUE, 0, {"Retain": True})
        _send(producer, range(FIRST, FIRST + REST))
        # the first leaves by a reset (no FIN, nothing read): what it never took goes back
        first.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        first.close()
        assert wait_until(
            lambda: small.listener.call(lambda: len(small.listener.connections)) == 3
        )
        _engine_sync(small)
        selected: list[Frame] = []
        if twist == "selector":  # what it got so far, acknowledged, then it leaves
            other.send(b"SEND\ndestination:/queue/%s\nn:1\n\n999999\x00" % QUEUE.encode())
            while (frame := other.next()).body != b"999999":
                selected.append(frame)
                other.send(b"ACK\nid:%s\n\n\x00" % str(frame.header("ack")).encode())
            other.send(b"ACK\nid:%s\nreceipt:a\n\n\x00" % str(frame.header("ack")).encode())
            assert not _drain(other, "a")
        last.connect()
        last.send(
            b"SUBSCRIBE\nid:l\ndestination:/queue/%s\nack:client-individual\n\n\x00"
            % QUEUE.encode()
        )
        producer.send(b"SEND\ndestination:/queue/%s\n\nend\x00" % QUEUE.encode())
        rest: list[Frame] = []
        while (frame := last.next()).body != b"end":
            rest.append(frame)
            last.send(b"ACK\nid:%s\n\n\x00" % str(frame.header("ack")).encode())
        last.send(b"ACK\nid:%s\nreceipt:a\n\n\x00" % str(frame.header("ack")).encode())
        assert not _drain(last, "a")
    finally:
        for raw in (first, producer, other, last):
            raw.close()
    for number, mid in _ids(browsed).items():
        assert mid == door_id(number), (number, mid)
    if twist == "selector":
        assert all(number % 10 == 0 for number in _ids(selected))
    got = _ids(selected) | _ids(rest)
    assert len(got) == len(selected) + len(rest), "a message to both consumers"
    for number, mid in got.items():
        assert mid == door_id(number), (number, mid)
    # (never written to a consumer's socket: none is a redelivery)
    assert not [f.headers for f in selected + rest if f.header("Redelivered")][:3]
    missing = set(range(FIRST + REST)) - set(got)
    assert len(missing) * (BODY + 80) <= RESET_LOSS, sorted(missing)[:20]
    assert wait_until(
        lambda: _info(admin) == {"Messages": 0, "InFlight": 0, "PendingAcknowledges": 0}
    ), str(_info(admin))
