"""The write side of ``Session.deliver_plain`` against ``deliver_run`` (the oracle:
its per-delivery encoder), sans-IO: runs generated from a seed with ids to escape,
non-ASCII ids, NULs in bodies, one body size or many, at every room that changes the
count taken; a NUL in an id at each position; a run far larger than the room drained
flush by flush, each flush bounded; and what the plain wire hands the transport."""

from __future__ import annotations

import random

import pytest

from broker.stomp.backend import Delivery
from broker.stomp.errors import EncodeError
from broker.stomp.frames import Version
from broker.stomp.wire import PlainWire

from .test_deliver_run import _peer

#: Characters an id is made of: plain ones, those escaped on 1.1+ (CR: 1.2 only), and
#: non-ASCII ones (two and three UTF-8 bytes).
_ID_CHARS = "abc-019" + "\\:\n\r" + "é€"


def _run(rng: random.Random, count: int, one_size: bool) -> tuple[list[str], list[bytes]]:
    ids = [
        "".join(rng.choice(_ID_CHARS) for _ in range(rng.randrange(1, 9))) for _ in range(count)
    ]
    size = rng.randrange(0, 40)
    bodies = []
    for _ in range(count):
        n = size if one_size else rng.randrange(0, 40)
        bodies.append(bytes(rng.choice(b"\0x\n:") for _ in range(n)))  # (NULs inside)
    return ids, bodies


def _deliveries(destination: str, ids: list[str], bodies: list[bytes]) -> list[Delivery]:
    return [
        Delivery("s", 1 + i, mid, destination, (), body)
        for i, (mid, body) in enumerate(zip(ids, bodies, strict=True))
    ]


def _frame_ends(data: bytes | bytearray, bodies: list[bytes]) -> list[int]:
    """Offsets just past each frame's NUL (bodies hold NULs: their lengths skip them)."""
    ends, at = [], 0
    for body in bodies:
        at = data.index(b"\n\n", at) + 2 + len(body) + 1
        ends.append(at)
        if at >= len(data):
            break
    return ends


@pytest.mark.parametrize("version", [Version.V1_1, Version.V1_2])
@pytest.mark.parametrize("one_size", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_generated_runs_are_the_run_sinks_bytes_at_every_room(
    version: Version, one_size: bool, seed: int
) -> None:
    rng = random.Random(seed)
    count = rng.choice([1, 2, 3, 7, 20])
    ids, bodies = _run(rng, count, one_size)
    destination = rng.choice(["/queue/q", "/queue/a:b\\c", "/queue/é"])
    whole_peer, _ = _peer(version, "auto", 1 << 20)
    assert whole_peer.session.deliver_run(_deliveries(destination, ids, bodies)) == count
    whole = bytes(whole_peer.session.take_output(0.0))
    # every room that ends at a frame's edge, one byte either side, and none
    rooms = {0, 1, len(whole), len(whole) + 1}
    for end in _frame_ends(whole, bodies):
        rooms.update((end - 1, end, end + 1))
    for room in sorted(r for r in rooms if r >= 0):
        plain_peer, plain_transport = _peer(version, "auto", room)
        run_peer, run_transport = _peer(version, "auto", room)
        took = plain_peer.session.deliver_plain("s", destination, ids, bodies)
        assert took == run_peer.session.deliver_run(_deliveries(destination, ids, bodies))
        assert plain_transport.refusals == run_transport.refusals
        out = plain_peer.session.take_output(0.0)
        assert out == run_peer.session.take_output(0.0)
        assert out == whole[: len(out)]


@pytest.mark.parametrize("position", [0, 1, 3, 5])
@pytest.mark.parametrize("room", [1, 60, 130, 1 << 20])
def test_a_nul_in_an_id_at_any_position_is_what_the_run_sink_does(
    position: int, room: int
) -> None:
    """The messages before it are written (as far as the room goes), then EncodeError
    -- unless the room ran out before it: then a refusal, as the run sink does."""
    ids = [f"id-{i}" for i in range(6)]
    ids[position] = "bad\0id"
    bodies = [b"b" * 20 for _ in ids]
    plain_peer, plain_transport = _peer(Version.V1_2, "auto", room)
    run_peer, run_transport = _peer(Version.V1_2, "auto", room)
    outcomes = []
    for call in (
        lambda: plain_peer.session.deliver_plain("s", "/queue/q", ids, bodies),
        lambda: run_peer.session.deliver_run(_deliveries("/queue/q", ids, bodies)),
    ):
        try:
            outcomes.append(call())
        except EncodeError:
            outcomes.append("refused")
    assert outcomes[0] == outcomes[1]
    if room == 1 << 20 or position == 0:  # (reached with room left: refused)
        assert outcomes[0] == "refused"
    assert plain_transport.refusals == run_transport.refusals
    assert plain_peer.session.take_output(0.0) == run_peer.session.take_output(0.0)


def test_a_run_far_larger_than_the_room_drains_flush_by_flush_in_order() -> None:
    """10,000 MESSAGEs against a 16 KiB room: each call takes what fits (output at most
    the room plus one frame), the caller offers the rest after each flush, and what
    the transport gets in the end is every frame once, in order, as the run sink
    writes them."""
    count, room = 10_000, 16 * 1024
    ids = [f"stomp-7-{i}" for i in range(count)]
    bodies = [b"%d;" % i + b"x" * (i % 300) for i in range(count)]
    frame_max = max(map(len, bodies)) + 100
    plain_peer, plain_transport = _peer(Version.V1_2, "auto", room)
    run_peer, _ = _peer(Version.V1_2, "auto", room)
    wire = PlainWire()
    sent = bytearray()
    start = calls = 0
    while start < count:
        took = plain_peer.session.deliver_plain("s", "/queue/q", ids[start:], bodies[start:])
        assert took > 0
        out = plain_peer.session.take_output(0.0)
        assert len(out) < room + frame_max
        wire.send(out)
        sent += wire.take()
        start += took
        calls += 1
    assert calls > 10  # (the room did bind)
    assert plain_transport.refusals == calls - 1  # (each call but the last stopped short)
    expected = bytearray()
    deliveries = _deliveries("/queue/q", ids, bodies)
    start = 0
    while start < count:
        start += run_peer.session.deliver_run(deliveries[start:])
        expected += run_peer.session.take_output(0.0)
    assert sent == expected
    assert sent.count(b"MESSAGE\n") == count


def test_the_output_taken_is_not_changed_by_what_is_written_after() -> None:
    """``take_output`` hands its buffer over: later deliveries go to a new one, and
    the plain wire passes on what it was sent as it came, alone or joined."""
    peer, _ = _peer(Version.V1_2, "auto", 1 << 20)
    assert peer.session.deliver_plain("s", "/queue/q", ["a"], [b"one"]) == 1
    first = peer.session.take_output(0.0)
    kept = bytes(first)
    assert peer.session.deliver_plain("s", "/queue/q", ["b", "c"], [b"two", b"3"]) == 2
    assert peer.session.pending_output > 0
    second = peer.session.take_output(0.0)
    assert first == kept
    assert bytes(second).count(b"MESSAGE\n") == 2
    assert peer.session.take_output(0.0) == b""
    wire = PlainWire()
    wire.send(first)
    assert wire.take() == kept
    wire.send(b"")
    wire.send(first)
    wire.send(second)
    assert wire.take() == kept + bytes(second)
    assert wire.take() == b""
