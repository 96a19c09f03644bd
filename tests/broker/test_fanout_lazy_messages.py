"""The message API over a hostile fan-out stream, read lazily, on real sockets.

A fan-out run's deliveries become ``Message`` objects whose frames decode their fields
only when read (``tmqp.decode_run``: each frame holds its run's buffer and where it
starts).  A fake broker (``test_fanout_hostile.HostileBroker``) grants the client's
JOIN a stream on a PUB this test owns and sends runs built with the broker's own packer
(``broker.fanout.pack_run``) whose *deliveries* are damaged inside an intact table
(lengths that lie, a string that is not UTF-8, a header block that does not parse,
random octets, a PING, two octets), plus garbage messages under the stream's token.
Every field of every message handed out must be what was sent under its number, read
as late as the application likes (after later runs arrived and were read), and every
other number a reported gap; the runs after the damage are read.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import zmq

from broker import tmqp
from broker.client.blocking import Client
from broker.client.message import Kind, Message
from broker.fanout import head, pack_run
from broker.protocol import MessageType
from tests.broker.test_fanout_hostile import TOKEN, HostileBroker, hostile, join_stream
from tests.polling import wait_until

__all__ = ["hostile"]  # (the fixture, used by name)

Ctx = zmq.Context[zmq.Socket[bytes]]
PING = bytes.fromhex("89FF000000000000")


def _payload(n: int) -> bytes:
    """Number ``n``'s payload: its digits, then non-ASCII octets for odd numbers (their
    runs take the frame-by-frame string check, the others the one ``isascii``)."""
    return b"%04d" % n + (bytes([0x80 | n % 128, 0xFF]) if n % 2 else b"")


def _frame(n: int) -> tmqp.Frame:
    return tmqp.Frame(message_type=int(MessageType.QUEUE), ttl=9, content_type=n,
                      message_id=f"id-{n}", source=f"src-{n}", target="news",
                      payload=_payload(n))  # fmt: skip


def _damaged(n: int, how: str, rng: random.Random) -> bytes:
    """Delivery ``n`` damaged so that ``decode`` refuses it."""
    good = tmqp.encode(_frame(n))[0]
    if how == "id too long":
        return good[:2] + bytes([good[2] + 40]) + good[3:]
    if how == "source not UTF-8":
        start = 8 + good[2]
        return good[:start] + b"\xff\xfe" + good[start + 2 :]
    if how == "bad header block":
        return bytes([2, 0x20 | 16, 0, 0, 0, 1, 0, 1, 3, 0]) + b"k\r\nx"
    if how == "random":
        return bytes(rng.randrange(256) for _ in range(40))
    if how == "ping":
        return PING
    assert how == "two octets"
    return b"\x02\x10"


DAMAGE = ["id too long", "source not UTF-8", "bad header block", "random", "ping", "two octets"]


def _runs(rng: random.Random) -> tuple[list[bytes], set[int]]:
    """Runs of numbers 1..60 in runs of 1-9 (the damaged deliveries among them) with
    garbage under the token before some, the last run intact; the numbers sent intact."""
    out: list[bytes] = []
    intact: set[int] = set()
    n = 1
    while n <= 60:
        size = min(rng.randint(1, 9), 61 - n)
        deliveries: list[bytes] = []
        lengths: list[int] = []
        for i in range(n, n + size):
            if i < 55 and rng.random() < 0.25:
                deliveries.append(_damaged(i, rng.choice(DAMAGE), rng))
                lengths.append(0)
            else:
                deliveries.append(tmqp.encode(_frame(i))[0])
                lengths.append(len(_payload(i)))
                intact.add(i)
        if rng.random() < 0.3:  # garbage under the token, claiming the next number
            garbage = bytes(rng.randrange(256) for _ in range(rng.randint(1, 60)))
            out.append(head(TOKEN, n) + garbage)
        out.append(pack_run(head(TOKEN, n), deliveries, lengths))
        n += size
    return out, intact


def _fields(m: Message) -> tuple[Any, ...]:
    return (m.kind, m.id, m.source, m.channel, m.queue_id, m.payload, m.headers,
            m.needs_ack, m.frame.ttl)  # fmt: skip


def _expected(n: int) -> tuple[Any, ...]:
    return (Kind.QUEUE, f"id-{n}", f"src-{n}", "news", n, _payload(n), (), False, 9)


@pytest.mark.parametrize("threaded", [True, False], ids=["threaded", "poll-on-call"])
def test_damaged_deliveries_are_gaps_and_late_reads_of_the_others_are_exact(
    zctx: Ctx, hostile: HostileBroker, threaded: bool
) -> None:
    """Messages are taken as they come but their fields are read only at the end, after
    every later run arrived and was read (each message keeps its own run's octets), and
    the first few as soon as taken (the reader then decodes the next batches at once):
    either way every field is what was sent under its number."""
    runs, intact = _runs(random.Random(13))
    client = Client(hostile.fake.endpoint, context=zctx, threaded=threaded, timeout=60)
    with client:
        join_stream(client, hostile, threaded)
        for run in runs:
            hostile.pub.send(run)
        held: list[Message] = []
        read_at_once: list[tuple[Any, ...]] = []

        def read_to_the_end() -> bool:
            message = client.receive(timeout=0.05)
            if message is not None:
                held.append(message)
                if len(held) <= 3:
                    read_at_once.append(_fields(message))
            return bool(held) and held[-1].payload.startswith(b"0060")

        assert wait_until(read_to_the_end, timeout=30), f"got {len(held)}"
        numbers = [int(m.payload[:4]) for m in held]
        assert [_fields(m) for m in held] == [_expected(n) for n in numbers]
        assert read_at_once == [_expected(n) for n in numbers[:3]]
        assert numbers == sorted(set(numbers)) and set(numbers) == intact
        missed = {n for gap in client.fanout_gaps for n in range(gap.first, gap.last + 1)}
        assert missed == set(range(1, 61)) - intact


def test_a_message_held_unread_keeps_its_fields_while_the_next_deliveries_arrive(
    zctx: Ctx, hostile: HostileBroker
) -> None:
    """A poll-on-call consumer takes message 1 and reads nothing of it; runs 2..40 come
    one by one and are taken (their fields read, so the reader decodes later batches at
    once, then lazily again); message 1's fields, read last, are still its own."""
    client = Client(hostile.fake.endpoint, context=zctx, threaded=False, timeout=60)
    with client:
        join_stream(client, hostile, threaded=False)
        taken: list[Message] = []

        def take(n: int) -> bool:
            hostile.pub.send(pack_run(head(TOKEN, n), [tmqp.encode(_frame(n))[0]],
                                      [len(_payload(n))]))  # fmt: skip
            message = client.receive(timeout=0.2)
            if message is not None:
                taken.append(message)
            return message is not None

        def take_next(n: int) -> bool:
            return (bool(taken) and taken[-1].queue_id == n) or take(n)  # (a field read)

        assert wait_until(lambda: take(1), timeout=30)
        first = taken.pop()
        for n in range(2, 41):
            # (sent again until taken: a copy of a number already read is skipped)
            assert wait_until(lambda n=n: take_next(n), timeout=30)
        assert _fields(first) == _expected(1)
        assert [_fields(m) for m in taken] == [_expected(n) for n in range(2, 41)]
        assert client.fanout_gaps == []
