"""``Session.deliver_run`` (the run sink): what a run of deliveries makes is what
``deliver`` of each in turn makes -- the same bytes, the same count taken, the same
refusal -- with the transport's room read once and counted down per frame.  Sans-IO,
with a room that runs out in the middle of the run."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from broker.stomp.backend import Delivery
from broker.stomp.frames import Command, Version
from broker.stomp.memory import MemoryBackend
from broker.stomp.session import Session, SessionConfig

from .kit import Peer, World


class Transport:
    """The listener's rule: deliveries are taken while the unsent bytes stay below
    ``limit``; a refusal is remembered (the listener then calls ``resume``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.session: Session | None = None
        self.refusals = 0

    def room(self) -> int:
        assert self.session is not None
        return self.limit - self.session.pending_output

    def writable(self) -> bool:
        if self.room() > 0:
            return True
        self.refusals += 1
        return False


class Recording(MemoryBackend):
    """The in-memory backend, recording the tags each ACK settles."""

    def __init__(self) -> None:
        super().__init__()
        self.acked: list[list[int]] = []

    def ack(self, connection_id: int, tags: Sequence[int]) -> None:
        self.acked.append(list(tags))
        super().ack(connection_id, tags)


def _peer(
    version: Version, ack: str, limit: int, config: SessionConfig | None = None
) -> tuple[Peer, Transport]:
    world = World(config=config) if config is not None else World()
    world.backend = Recording()
    transport = Transport(limit)
    peer = world.peer(version, writable=transport.writable)
    peer.session.room = transport.room
    transport.session = peer.session
    peer.connect()
    headers = {"id": "s", "destination": "/queue/q", "ack": ack, "receipt": "sub"}
    if version is Version.V1_0:
        headers.pop("id")
    peer.send(Command.SUBSCRIBE, headers)
    assert [f.command for f in peer.read()] == [Command.RECEIPT]
    return peer, transport


#: Message ids with one character each to escape on 1.1+ (``\r`` on 1.2 only), by index.
_ESCAPED_IDS = {9: "back\\slash", 10: "co:lon", 11: "new\nline", 12: "car\rriage"}


def _deliveries(sub: str, version: Version = Version.V1_2) -> list[Delivery]:
    out = []
    for i in range(14):
        headers = (("n", str(i)),) if i % 3 == 0 else ()
        if i == 7:
            headers = (("tricky:name", "a\nb"),)  # escaped on 1.1+, left out on 1.0
        # ids and destinations to escape, a destination changing within the run
        message_id = "m:5\\x" if i == 5 else f"m{i}"
        if version is not Version.V1_0:
            message_id = _ESCAPED_IDS.get(i, message_id)
        destination = "/queue/r:x" if i in (4, 5, 8) else "/queue/q"
        out.append(Delivery(sub, 100 + i, message_id, destination, headers, b"x" * (20 + i)))
    return out


@pytest.mark.parametrize("version", [Version.V1_0, Version.V1_1, Version.V1_2])
@pytest.mark.parametrize("ack", ["auto", "client-individual"])
@pytest.mark.parametrize("limit", [1, 400, 1000, 100_000])
def test_a_run_makes_what_each_delivery_in_turn_makes(
    version: Version, ack: str, limit: int
) -> None:
    sub = "/queue/q" if version is Version.V1_0 else "s"
    run_peer, run_transport = _peer(version, ack, limit)
    each_peer, each_transport = _peer(version, ack, limit)
    deliveries = _deliveries(sub, version)
    took = run_peer.session.deliver_run(deliveries)
    each = 0
    for delivery in deliveries:
        if not each_peer.session.deliver(delivery):
            break
        each += 1
    assert took == each
    assert (limit == 100_000) == (took == len(deliveries))  # (the room ran out, or not)
    assert run_transport.refusals == each_transport.refusals == (took < len(deliveries))
    run_bytes = run_peer.session.take_output(0.0)
    assert run_bytes == each_peer.session.take_output(0.0)
    assert run_bytes.count(b"\0") == took
    if ack != "auto" and took:
        # the deliveries taken wait for their ACK in both: the last one settles alone
        last = deliveries[took - 1]
        acked = []
        for peer in (run_peer, each_peer):
            if version is Version.V1_2:
                named = {"id": str(last.tag)}
            else:
                named = {"message-id": last.message_id, "subscription": sub}
            peer.send(Command.ACK, {**named, "receipt": "a"})
            assert [f.command for f in peer.read()] == [Command.RECEIPT]
            backend = peer.session.backend
            assert isinstance(backend, Recording)
            acked.append(backend.acked)
        assert acked[0] == acked[1] == [[last.tag]]


def test_a_run_stops_at_a_delivery_for_an_unknown_subscription() -> None:
    peer, _ = _peer(Version.V1_2, "auto", 100_000)
    deliveries = _deliveries("s")
    deliveries[4] = deliveries[4]._replace(subscription="gone")
    assert peer.session.deliver_run(deliveries) == 4
    assert peer.session.take_output(0.0).count(b"MESSAGE\n") == 4


def test_a_closed_session_takes_no_run() -> None:
    peer, _ = _peer(Version.V1_2, "auto", 100_000)
    peer.send(Command.DISCONNECT)
    assert peer.session.deliver_run(_deliveries("s")) == 0


@pytest.mark.parametrize(
    "config",
    [
        SessionConfig(add_user_header="who"),
        SessionConfig(add_timestamp_header="when"),
        SessionConfig(add_redeliveries_header="again"),
    ],
)
def test_a_run_with_headers_to_add_makes_what_each_delivery_makes(config: SessionConfig) -> None:
    """The run's own encoding of the usual ``ack:auto`` MESSAGE is not used when the
    broker adds headers: the same bytes as each delivery in turn."""
    run_peer, _ = _peer(Version.V1_2, "auto", 100_000, config)
    each_peer, _ = _peer(Version.V1_2, "auto", 100_000, config)
    deliveries = [d._replace(sender="u", timestamp_ms=5, redeliveries=1) for d in _deliveries("s")]
    assert run_peer.session.deliver_run(deliveries) == len(deliveries)
    for delivery in deliveries:
        assert each_peer.session.deliver(delivery)
    run_bytes = run_peer.session.take_output(0.0)
    assert run_bytes == each_peer.session.take_output(0.0)
    assert run_bytes.count(b"\0") == len(deliveries)
