"""A connection pipelines receipted SENDs, then a frame that does not parse.

What the client may rely on: every SEND written before the bad frame is taken (in
order, once) and gets its RECEIPT, all of them before the one ERROR; nothing after the
bad frame takes effect; the connection closes.  Before session 14 the SENDs read in the
same read as the bad frame were dropped (the parser's error discarded the frames it had
completed) and the SENDs still waiting for the engine lost their RECEIPT (the ERROR
ended the session at once), although the engine took them.

Sans-IO (the in-memory backend, deterministic) and over real sockets against
``broker serve --stomp`` (the engine's asynchronous answers, a run longer than the
window of unanswered SENDs, a refused SEND in the middle).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.stomp.frames import Command, Frame
from tests.stomp.kit import World
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve

GARBAGE = b"\x16\x03\x01 not stomp\n\n\x00"


def _sends(queue: str, start: int, count: int, receipts: bool = True) -> bytes:
    return b"".join(
        b"SEND\ndestination:/queue/%s\ncontent-length:5\n%s\nm%04d\x00"
        % (queue.encode(), b"receipt:r%d\n" % i if receipts else b"", i)
        for i in range(start, start + count)
    )


def _until_error(raw: Raw) -> list[Frame]:
    """Frames the server sends up to and including its ERROR."""
    frames: list[Frame] = []
    while not frames or frames[-1].command is not Command.ERROR:
        frames.append(raw.next())
    return frames


# -- sans-IO: the session on the in-memory backend -------------------------------------


def test_sends_read_with_the_bad_frame_are_taken_and_receipted_before_the_error() -> None:
    world = World()
    consumer = world.connected()
    consumer.send(Command.SUBSCRIBE, {"id": "s", "destination": "/queue/q"})
    producer = world.connected()
    producer.send_bytes(_sends("q", 0, 3) + GARBAGE + _sends("q", 3, 2))
    frames = producer.read()
    assert [f.command for f in frames] == [Command.RECEIPT] * 3 + [Command.ERROR]
    assert [f.header("receipt-id") for f in frames[:3]] == ["r0", "r1", "r2"]
    assert "unknown command" in str(frames[3].header("message"))
    assert [f.body for f in consumer.read()] == [b"m0000", b"m0001", b"m0002"]
    producer.send_bytes(_sends("q", 5, 1))  # input after the ERROR is ignored
    assert producer.read() == []
    world.clock.advance(world.config.die_delay)
    producer.tick()
    assert producer.session.closed
    assert consumer.read() == []


def test_a_bad_frame_alone_in_its_read_still_gets_one_error() -> None:
    world = World()
    producer = world.connected()
    producer.send_bytes(_sends("q", 0, 2))
    assert [f.header("receipt-id") for f in producer.read()] == ["r0", "r1"]
    producer.send_bytes(GARBAGE)
    assert [f.command for f in producer.read()] == [Command.ERROR]


# -- broker serve --stomp: the engine answers SENDs later ------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Serve]:
    """One ``broker serve --stomp`` per test (``raws``: ``tests/stomp/conftest.py``)."""
    served = Serve(tmp_path)
    yield served
    assert served.stop() == 0


def _consumer(raws: Callable[[], Raw], queue: str) -> Raw:
    consumer = raws()
    consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/%s\nreceipt:sub\n\n\x00" % queue.encode())
    assert consumer.next().command is Command.RECEIPT
    return consumer


def _bodies_until_late(consumer: Raw, raws: Callable[[], Raw], queue: str) -> list[bytes]:
    """What ``consumer`` got before a late message a fresh producer sends now (nothing
    else can arrive after it: the bad connection is closed)."""
    late = raws()
    late.send(_sends(queue, 9999, 1))
    assert late.next().header("receipt-id") == "r9999"
    got: list[bytes] = []
    while not got or got[-1] != b"m9999":
        got.append(consumer.next().body)
    return got[:-1]


@pytest.mark.parametrize("count", [50, 1500], ids=["in-window", "past-the-window"])
def test_pipelined_sends_then_garbage_all_receipted_before_the_error(
    raws: Callable[[], Raw], count: int
) -> None:
    """``count`` receipted SENDs and garbage in one write (1500: more than the 1000
    unanswered SENDs a connection may have, so some wait parked behind the window)."""
    consumer = _consumer(raws, "piped")
    producer = raws()
    producer.send(_sends("piped", 0, count) + GARBAGE + _sends("piped", count, 3))
    frames = _until_error(producer)
    assert [f.header("receipt-id") for f in frames[:-1]] == [f"r{i}" for i in range(count)]
    assert "unknown command" in str(frames[-1].header("message"))
    assert producer.closed_by_server()
    assert _bodies_until_late(consumer, raws, "piped") == [b"m%04d" % i for i in range(count)]


def test_a_refused_send_before_the_garbage_is_the_one_error(raws: Callable[[], Raw]) -> None:
    """A SEND the broker refuses (a header it sets itself) in the middle: the SENDs
    before it receipted, its ERROR (with its receipt id) the only one, nothing after it
    taken -- not the SENDs behind it, not the garbage's ERROR."""
    consumer = _consumer(raws, "refused")
    producer = raws()
    refused = b"SEND\ndestination:/queue/refused\nDelivery-Count:7\nreceipt:bad\n\nno\x00"
    producer.send(_sends("refused", 0, 20) + refused + _sends("refused", 20, 5) + GARBAGE)
    frames = _until_error(producer)
    assert [f.header("receipt-id") for f in frames] == [f"r{i}" for i in range(20)] + ["bad"]
    assert producer.closed_by_server()
    assert _bodies_until_late(consumer, raws, "refused") == [b"m%04d" % i for i in range(20)]
