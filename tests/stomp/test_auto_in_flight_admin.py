"""``ack:auto`` deliveries on their way to a STOMP consumer, met by a TMQP client's browse,
switch to Stopped (a purge of what is in flight) and options change: on one engine
behind both doors (``tests.stomp.two_doors.Broker``), real sockets on loopback.

The consumer does not read: its connection fills and the listener holds the rest of
what the engine handed it (each of those still in flight on the engine).  Each case runs
three ways -- AUTO deliveries as runs (the door's way, ``flow.AUTO_RUN``), one by one
(``flow.AUTO``) and all tracked (``publish_many`` told the ids are not the door's own) --
and must give the same: what the TMQP client reads and what the queue counts, the tracked
path's outcome.  Then the consumer reads: every message once, in order."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.engine.flow import AUTO, AUTO_RUN
from broker.stomp.frames import Command
from broker.stomp.server import ListenerOptions
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import FAST, Broker, Ctx

MAX_OUTBOUND = 16 * 1024
BODY = 2000  # octets of each message: several fill the connection
COUNT = 60
QUEUE = "inflight"


class Side:
    """A two-door broker whose engine makes AUTO runs, AUTO deliveries one by one or
    none (``mode``), counting those it made (on the engine thread)."""

    def __init__(self, zctx: Ctx, mode: str) -> None:
        engine = Engine()
        self.autos = 0
        self.runs = 0
        publish_many = engine.publish_many

        def publish(client_id: str, messages: Any, now: float, **kw: Any) -> Any:
            if mode == "tracked":
                kw["unique_ids"] = False  # (every delivery tracked)
            result = publish_many(client_id, messages, now, **kw)
            for client in engine.clients.values():
                self.autos += sum(1 for t in client.unsent if t[0] == AUTO)
                self.runs += sum(1 for t in client.unsent if t[0] == AUTO_RUN)
            return result

        engine.publish_many = publish  # type: ignore[method-assign]
        if mode != "auto-runs":  # its consumers' transports take no runs: a Tracked
            by_taking = engine.acknowledge_taken  # frame per delivery (Client.auto_runs)

            def one_by_one(client_id: str, channel: str, on: bool = True, **_: Any) -> bool:
                return by_taking(client_id, channel, on)

            engine.acknowledge_taken = one_by_one  # type: ignore[method-assign]
        options = ListenerOptions(port=0, session=FAST, max_outbound=MAX_OUTBOUND)
        self.broker = Broker(zctx, engine, options)
        self.raws: list[Raw] = []
        try:
            self.admin = Client(self.broker.endpoint, context=zctx, timeout=10.0).connect()
        except BaseException:
            self.broker.stop()
            raise

    def raw(self, rcvbuf: int | None = None) -> Raw:
        """A connected raw STOMP 1.2 client (``rcvbuf``: its socket's receive buffer, and
        the listener's send buffer to it shrunk alike: the connection soon fills)."""
        listener = self.broker.listener
        before = listener.call(lambda: set(listener.connections))
        raw = Raw(listener, rcvbuf=rcvbuf)
        self.raws.append(raw)
        raw.connect()
        if rcvbuf is not None:
            (cid,) = listener.call(lambda: set(listener.connections)) - before

            def shrink() -> None:
                transport = listener.connections[cid].transport
                assert transport is not None
                sock = transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, rcvbuf)

            listener.call(shrink)
        return raw

    def held(self) -> int:
        """Deliveries the listener holds for connections that have no room."""
        figures = self.broker.listener.backend.figures()  # type: ignore[attr-defined]
        return int(figures["held_deliveries"])

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = self.admin.queue_info(QUEUE, 0)
        return info

    def stop(self) -> None:
        for raw in self.raws:
            raw.close()
        self.admin.close()
        self.broker.stop()


@pytest.fixture(params=["auto-runs", "auto-transits", "tracked"])
def side(zctx: Ctx, request: Any) -> Iterator[Side]:
    made = Side(zctx, request.param)
    yield made
    made.stop()
    if request.param == "auto-runs":
        assert made.runs > 0, "no run of AUTO deliveries was made"
    elif request.param == "auto-transits":
        assert made.autos > 0 and made.runs == 0, "no AUTO delivery was made"
    else:
        assert made.autos == 0 and made.runs == 0


def _bodies() -> list[bytes]:
    return [f"{QUEUE}-{i:04d}-".encode().ljust(BODY, b".") for i in range(COUNT)]


def _held_in_flight(side: Side) -> tuple[Raw, list[bytes], int]:
    """A consumer (``ack:auto``) that does not read, ``COUNT`` messages sent to it in
    one write (read as runs), the listener holding what its connection has no room
    for; returns the consumer, the bodies and how many it was handed (acknowledged by
    taking) once the engine's in flight is exactly what the listener holds."""
    consumer = side.raw(rcvbuf=4096)
    consumer.send(
        f"SUBSCRIBE\nid:s\ndestination:/queue/{QUEUE}\nack:auto\nreceipt:sub\n\n\x00".encode()
    )
    assert consumer.next().command is Command.RECEIPT
    producer = side.raw()
    bodies = _bodies()
    frames = [f"SEND\ndestination:/queue/{QUEUE}\n\n".encode() + b + b"\x00" for b in bodies]
    frames.append(b"BEGIN\ntransaction:t\nreceipt:sent\n\n\x00")
    producer.send(b"".join(frames))
    assert producer.next().command is Command.RECEIPT  # (all SENDs taken by then)

    def settled() -> bool:
        held = side.held()
        info = side.info()
        return held > 0 and info["PendingAcknowledges"] == held and info["Acks"] + held == COUNT

    assert wait_until(settled), (side.held(), side.info())
    taken = side.info()["Acks"]
    assert 0 < taken < COUNT
    return consumer, bodies, taken


def _read_all(consumer: Raw, bodies: list[bytes]) -> None:
    """The consumer reads: every message once, in order."""
    got = []
    for _ in bodies:
        frame = consumer.next()
        assert frame.command is Command.MESSAGE, frame
        got.append(bytes(frame.body))
    assert got == bodies


def _listed(side: Side) -> list[int]:
    return [b.sequence for b in side.admin.browse(QUEUE, 0, 0, 1000)]


def test_a_browse_lists_the_auto_deliveries_in_flight(side: Side) -> None:
    consumer, bodies, taken = _held_in_flight(side)
    # listed until acknowledged (by taking), as the tracked path lists them
    assert _listed(side) == list(range(taken + 1, COUNT + 1))
    bounds = side.admin.queue_bounds(QUEUE, 0)
    assert (bounds.first, bounds.last) == (taken + 1, COUNT)
    _read_all(consumer, bodies)
    assert wait_until(lambda: side.info()["Acks"] == COUNT)
    info = side.info()
    assert (info["Deliveries"], info["SentMessages"], info["PendingAcknowledges"]) == (
        COUNT,
        COUNT,
        0,
    )
    assert _listed(side) == []


def test_a_switch_to_stopped_drops_the_auto_deliveries_in_flight(side: Side) -> None:
    """Stopped clears what is in flight: dropped (counted removed, nothing pending) as
    tracked deliveries are; those the listener still writes count as sent, not
    acknowledged."""
    consumer, bodies, taken = _held_in_flight(side)
    side.admin.update_queue(QUEUE, 0, {"Status": 6})  # Stopped
    info = side.info()
    assert (info["RemovedMessages"], info["PendingAcknowledges"], info["InFlight"]) == (
        COUNT - taken,
        0,
        0,
    )
    _read_all(consumer, bodies)  # (already handed to the listener: written)
    assert wait_until(lambda: side.info()["Deliveries"] == COUNT)
    info = side.info()
    assert (info["Acks"], info["SentMessages"], info["RemovedMessages"]) == (
        taken,
        COUNT,
        COUNT - taken,
    )


def test_retain_turned_on_keeps_the_auto_deliveries_then_taken(side: Side) -> None:
    """An options change while AUTO deliveries are out meets them as tracked ones: with
    ``Retain`` turned on, each is kept once taken (acknowledged), readable by sequence."""
    consumer, bodies, taken = _held_in_flight(side)
    side.admin.update_queue(QUEUE, 0, {"Retain": True})
    _read_all(consumer, bodies)
    assert wait_until(lambda: side.info()["Acks"] == COUNT)
    info = side.info()
    assert (info["RetainedMessages"], info["PendingAcknowledges"]) == (COUNT - taken, 0)
    assert _listed(side) == list(range(taken + 1, COUNT + 1))
    listed = side.admin.browse(QUEUE, 0, 0, 1000)
    assert [bytes(b.message.payload) for b in listed] == bodies[taken:]
