"""The adversary's review of SEND streaks (session 21, adv21; bodies21's fast path:
``FrameParser.feed_streaks_until_error`` -> ``SendStreak`` -> ``read_send_run`` -> the
door's ``_run_messages``), against a real listener and engine over loopback sockets.

Read boundaries are made exact, not hoped for: a piece is written, then the test waits
until the client's kernel has no unacknowledged byte left (``TIOCOUTQ``) and, on the
listener's thread, the server's socket has nothing left to read (``FIONREAD``): the
listener has read that piece (and parsed it) before the next one is written.

* a streak whose read ends at every byte of a frame (the third frame of a head, after
  the parser keeps it, a SEND of the same lead with another ``content-length`` in the
  middle, the streak after it), bodies holding NULs and the whole next head;
* a 1 MiB header line right after a streak, in the same read and in the next one: the
  streak's SENDs are taken and receipted, then one ERROR, and the others are served;
* a streak past ``max_body``: SENDs of exactly ``max_body`` in a streak (more than
  ``max_body`` in all) are taken; then the same lead announcing one byte more, or a
  body without ``content-length`` running past it, is the ERROR, after the RECEIPT of
  what came before;
* a frame of the streak's head whose byte after the body is not NUL (a lying
  ``content-length``): those before it are taken, then the ERROR.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import socket
import termios
from collections.abc import Iterator

import pytest
import zmq

from broker.stomp.frames import Command, Frame, Limits
from broker.stomp.server import ListenerOptions
from broker.stomp.session import SessionConfig
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker

Ctx = zmq.Context[zmq.Socket[bytes]]

MAX_BODY = 1024


@pytest.fixture
def limited(zctx: Ctx) -> Iterator[Broker]:
    """Two doors on one engine; the STOMP sessions take bodies up to ``MAX_BODY``."""
    session = SessionConfig(limits=Limits(max_body=MAX_BODY), die_delay=0.1, heartbeat=(0, 0))
    made = Broker(zctx, options=ListenerOptions(port=0, session=session))
    yield made
    made.stop()


@pytest.fixture
def raws(limited: Broker) -> Iterator[list[Raw]]:
    made: list[Raw] = []
    yield made
    for raw in made:
        raw.close()


def _client(b: Broker, made: list[Raw]) -> Raw:
    raw = Raw(b.listener.port)
    made.append(raw)
    raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    raw.connect()
    return raw


def _consumer(b: Broker, made: list[Raw], queue: str) -> Raw:
    raw = _client(b, made)
    raw.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nack:auto\nreceipt:s\n\n\x00".encode())
    assert raw.next().header("receipt-id") == "s"
    return raw


def _unread(fd: int, request: int) -> int:
    count = array.array("i", [0])
    fcntl.ioctl(fd, request, count, True)
    return count[0]


def _read_by_listener(b: Broker, raw: Raw) -> bool:
    """Every byte ``raw`` wrote is acknowledged by the server's kernel and read by the
    listener (its socket has nothing left to read)."""
    if _unread(raw.sock.fileno(), termios.TIOCOUTQ):
        return False
    ours = raw.sock.getsockname()

    def look() -> bool:
        for conn in b.listener.connections.values():
            transport = conn.transport
            if transport is not None and transport.get_extra_info("peername") == ours:
                fd = transport.get_extra_info("socket").fileno()
                return _unread(fd, termios.FIONREAD) == 0
        return True  # (gone: it read all it will)

    return b.listener.call(look)


def _write_in_two(b: Broker, raw: Raw, data: bytes, cut: int) -> None:
    """``data`` as two reads of the listener, the first ending before byte ``cut``."""
    raw.send(data[:cut])
    assert wait_until(lambda: _read_by_listener(b, raw))
    raw.send(data[cut:])


def _frame(head: bytes, body: bytes) -> bytes:
    return head + body + b"\x00"


def _head(queue: str, length: int, extra: str = "") -> bytes:
    return f"SEND\ndestination:/queue/{queue}\n{extra}content-length:{length}\n\n".encode()


def _marker(consumer: Raw, producer: Raw, queue: str) -> list[bytes]:
    """Bodies the consumer gets before a marker the producer sends now (nothing more
    came than what the test counted)."""
    producer.send(f"SEND\ndestination:/queue/{queue}\n\nmarker\x00".encode())
    bodies = []
    while (body := consumer.next().body) != b"marker":
        bodies.append(body)
    return bodies


# -- a streak read in two pieces, cut at every byte ----------------------------------------

BODY = 40


def _round(r: int) -> tuple[bytes, list[bytes], tuple[int, int]]:
    """One round's stream: four SENDs of one head, one of the same lead with another
    content-length, two of the first head again; every body holds NULs and the head.
    Returns the stream, its bodies, and where the third SEND starts and the sixth ends
    (the stretch every cut falls in)."""
    head = _head("cut", BODY)
    other = _head("cut", BODY + 7)
    bodies = []
    for i in range(7):
        size = BODY + 7 if i == 4 else BODY
        start = f"{r:04d}.{i}\x00".encode()
        bodies.append((start + head + b"\x00" * size)[:size])
    frames = [_frame(other if i == 4 else head, body) for i, body in enumerate(bodies)]
    start = len(frames[0]) + len(frames[1])
    end = start + sum(len(f) for f in frames[2:6])
    return b"".join(frames), bodies, (start, end)


def test_a_streak_cut_at_every_byte_of_its_frames_arrives_whole_and_in_order(
    limited: Broker, raws: list[Raw]
) -> None:
    """The listener reads each round in two pieces, the first ending at byte ``cut`` for
    every ``cut`` from inside the third SEND of a head (the parser keeps the head after
    two) to the end of the sixth (past the other content-length and into the streak
    after it).  Each round's SENDs reach the consumer whole, in order, once."""
    consumer = _consumer(limited, raws, "cut")
    producer = _client(limited, raws)
    _, _, (first, last) = _round(0)
    for r, cut in enumerate(range(first + 1, last)):
        data, bodies, _ = _round(r)
        _write_in_two(limited, producer, data, cut)
        got = [consumer.next() for _ in bodies]
        assert [f.body for f in got] == bodies, cut
        assert {f.header("destination") for f in got} == {"/queue/cut"}
    assert _marker(consumer, producer, "cut") == []


# -- a 1 MiB header line after a streak -----------------------------------------------------

HUGE = b"SEND\ndestination:/queue/long\nh:" + b"v" * (1024 * 1024) + b"\n\n\x00"


@pytest.mark.parametrize("later", [False, True], ids=["same-read", "next-read"])
def test_a_huge_header_line_after_a_streak_errors_after_the_streak_is_taken(
    limited: Broker, raws: list[Raw], later: bool
) -> None:
    consumer = _consumer(limited, raws, "long")
    producer = _client(limited, raws)
    head = _head("long", 8)
    streak = b"".join(_frame(head, b"m%07d" % i) for i in range(30))
    receipted = b"SEND\ndestination:/queue/long\nreceipt:before\n\nlast\x00"
    if later:
        producer.send(streak + receipted)
        assert wait_until(lambda: _read_by_listener(limited, producer))
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        producer.send(HUGE if later else streak + receipted + HUGE)  # (closed meanwhile)
    receipt = producer.next()
    assert (receipt.command, receipt.header("receipt-id")) == (Command.RECEIPT, "before")
    error = producer.next()
    assert error.command is Command.ERROR
    assert "max_header_length" in (error.header("message") or "") + error.body.decode()
    assert producer.closed_by_server()
    bodies = [consumer.next().body for _ in range(31)]
    assert bodies == [b"m%07d" % i for i in range(30)] + [b"last"]
    other = _client(limited, raws)  # the broker serves on
    assert _marker(consumer, other, "long") == []


# -- max_body -------------------------------------------------------------------------------


def _error_after_receipt(producer: Raw, receipt: str) -> Frame:
    got = producer.next()
    assert (got.command, got.header("receipt-id")) == (Command.RECEIPT, receipt), got
    error = producer.next()
    assert error.command is Command.ERROR, error
    assert producer.closed_by_server()
    return error


def test_a_streak_of_bodies_at_max_body_is_taken_and_one_byte_more_is_refused(
    limited: Broker, raws: list[Raw]
) -> None:
    consumer = _consumer(limited, raws, "big")
    producer = _client(limited, raws)
    head = _head("big", MAX_BODY)
    bodies = [(b"%04d" % i) * (MAX_BODY // 4) for i in range(20)]  # (20x max_body in all)
    over = _head("big", MAX_BODY + 1)  # the same lead, one byte more
    producer.send(
        b"".join(_frame(head, body) for body in bodies)
        + b"SEND\ndestination:/queue/big\nreceipt:r\n\nok\x00"
        + _frame(over, b"x" * (MAX_BODY + 1))
        + _frame(head, bodies[0])  # (after the bad frame: ignored)
    )
    error = _error_after_receipt(producer, "r")
    assert "max_body" in (error.header("message") or "")
    assert [consumer.next().body for _ in range(21)] == [*bodies, b"ok"]
    assert _marker(consumer, _client(limited, raws), "big") == []


def test_a_streak_without_content_length_running_past_max_body_is_refused(
    limited: Broker, raws: list[Raw]
) -> None:
    consumer = _consumer(limited, raws, "nul")
    producer = _client(limited, raws)
    head = b"SEND\ndestination:/queue/nul\n\n"
    producer.send(b"".join(_frame(head, b"n%03d" % i) for i in range(10)))
    producer.send(b"SEND\ndestination:/queue/nul\nreceipt:r\n\nok\x00")
    assert wait_until(lambda: _read_by_listener(limited, producer))
    producer.send(head + b"y" * (MAX_BODY + 10))  # no NUL within max_body
    error = _error_after_receipt(producer, "r")
    assert "max_body" in (error.header("message") or "")
    assert [consumer.next().body for _ in range(11)] == [b"n%03d" % i for i in range(10)] + [b"ok"]
    assert _marker(consumer, _client(limited, raws), "nul") == []


# -- a lying content-length inside a streak -----------------------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["one-read", "cut-before-it"])
def test_a_frame_of_the_streak_head_not_ending_in_nul_errors_after_those_before(
    limited: Broker, raws: list[Raw], split: bool
) -> None:
    consumer = _consumer(limited, raws, "lie")
    producer = _client(limited, raws)
    head = _head("lie", 6, "receipt-every:no\n")
    good = b"".join(_frame(head, b"ok%04d" % i) for i in range(12))
    bad = head + b"liar!!X" + b"\x00"  # the byte after its 6 is not NUL
    tail = b"".join(_frame(head, b"no%04d" % i) for i in range(5))
    data = good + b"SEND\ndestination:/queue/lie\nreceipt:r\n\nok\x00" + bad + tail
    if split:
        _write_in_two(limited, producer, data, len(data) - len(tail) - 3)
    else:
        producer.send(data)
    error = _error_after_receipt(producer, "r")
    assert "NUL" in (error.header("message") or "")
    bodies = [consumer.next().body for _ in range(13)]
    assert bodies == [b"ok%04d" % i for i in range(12)] + [b"ok"]
    assert _marker(consumer, _client(limited, raws), "lie") == []
