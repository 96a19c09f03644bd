"""Threads reading the fields of the same waiting frames of a run at once (a ``Message``
handed to another thread): each read gives the frame's field, never an error.

Was: the first read decoded the frame and stored its fields one by one under the plain
slots class (no ``__getattr__`` hook there); a second thread reading a field at that
moment got ``AttributeError`` (a slot not stored yet), or found ``_encoded`` already
cleared.  The runs are made as the broker makes them (``broker.fanout.pack_run`` of
encoded deliveries) and read as the client reads them (``tmqp.decode_run`` with the
ends from the run's table, ``messages_of``); ``sys.setswitchinterval(1e-6)`` makes the
threads take turns inside each other's decode.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from broker import fanout, tmqp
from broker.client.message import messages_of
from broker.protocol import MessageType
from tests.polling import WAIT

_ROUNDS = 40  # runs decoded, each read by every thread at once
_DELIVERIES = 48  # per run
_THREADS = 6
_FIELDS = ("message_id", "source", "target", "ttl", "content_type", "pending_ack", "payload")


@pytest.fixture
def switch_often() -> Iterator[None]:
    """The interpreter switches threads every microsecond (restored after)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _run(round_: int) -> tuple[bytes, list[tmqp.Frame]]:
    """A run of ``_DELIVERIES`` deliveries as the broker packs one; the frames expected."""
    frames = [
        tmqp.Frame(
            message_type=MessageType.QUEUE,
            pending_ack=i % 2 == 0,
            ttl=i % 31,
            content_type=round_ * 100 + i,
            message_id=f"r{round_}-m{i}",
            source=f"producer-{i % 7}",
            target="prices",
            payload=b"%d:%d" % (round_, i) * (1 + i % 5),
        )
        for i in range(_DELIVERIES)
    ]
    deliveries = [b"".join(tmqp.encode(f)) for f in frames]
    payloads = [len(f.payload) for f in frames]
    head = fanout.head(b"T" * fanout.TOKEN_SIZE, round_)
    return fanout.pack_run(head, deliveries, payloads), frames


def _decode(run: bytes) -> list[Any]:
    """The run's deliveries as the client makes them: waiting frames, in messages."""
    count = fanout.COUNT.unpack_from(run, fanout.HEAD_SIZE)[0]
    rows = fanout.table(count).unpack_from(run, fanout.TABLE_AT)
    at = fanout.TABLE_AT + fanout.ROW.size * count
    frames, bad = tmqp.decode_run(run, at, rows[1::2])
    assert bad == [] and len(frames) == count
    assert all(tmqp.waiting_fields(f) for f in frames)
    return messages_of(frames)


def _read_all(
    messages: list[Any],
    expected: list[tmqp.Frame],
    first: int,
    start: threading.Barrier,
    out: list[str],
) -> None:
    """Every field of every message from the ``first`` on (wrapping), read once all the
    threads are at the start (an odd ``first``: each frame compared and hashed whole
    first); what was wrong or raised goes to ``out``."""
    try:
        start.wait()
        count = len(messages)
        for k in range(count):
            i = (first + k) % count
            frame = messages[i].frame
            whole = first % 2 == 1  # (half the threads compare the whole value first)
            if whole and (frame != expected[i] or hash(frame) != hash(expected[i])):
                out.append(f"frame {i}: whole value differs")
            for name in _FIELDS:
                if getattr(frame, name) != getattr(expected[i], name):
                    out.append(f"frame {i}: {name} differs")
    except BaseException as exc:  # (kept for the assertion)
        out.append(repr(exc))


def test_threads_reading_the_same_waiting_frames_get_their_fields(
    switch_often: None,
) -> None:
    for round_ in range(_ROUNDS):
        run, expected = _run(round_)
        messages = _decode(run)
        start = threading.Barrier(_THREADS, timeout=WAIT)
        problems: list[str] = []
        threads = [
            threading.Thread(
                target=_read_all,
                # (each thread its first frame, 5 apart: they meet in the run; odd: whole)
                args=(messages, expected, 5 * t, start, problems),
            )
            for t in range(_THREADS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 3)
        assert not any(t.is_alive() for t in threads)
        assert problems == [], (round_, problems[:3])
        assert [m.frame for m in messages] == expected
        assert not any(tmqp.waiting_fields(m.frame) for m in messages)
        assert {type(m.frame) for m in messages} == {tmqp.Frame}
