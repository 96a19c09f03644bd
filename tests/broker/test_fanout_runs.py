"""Fan-out runs (``broker.fanout``, ``Fanout: 3``) on real sockets, bytes built by hand.

The broker's door gathers consecutive deliveries of a stream into one published message
(token, first number, count, a table of (payload start, end) offsets, the deliveries);
the client's reader takes each delivery (or payload) with its number (first + index).
These tests build the expected octets from the spec, not from the code under test, and
feed the reader runs that are cut or malformed: what precedes the damage is read, the
rest is a reported gap, never silent.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
import zmq

from broker import tmqp
from broker.client.fanout import FanoutReader
from broker.client.session import Fanout
from broker.fanout import RUN_MAX
from broker.server.fanout import FanoutDoor
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
TOKEN = bytes(range(16))
TICKET = bytes(range(100, 116))
OTHER = bytes(range(50, 66))


def spec_head(token: bytes, seq: int) -> bytes:
    return token + struct.pack("<Q", seq)


def spec_run(token: bytes, seq: int, deliveries: list[bytes]) -> bytes:
    """A run as the spec lays it out; each delivery's payload is its last ``_PAYLOAD``
    octets (``_delivery``), none for one that is not a delivery (shorter than 8)."""
    count = len(deliveries)
    at = 16 + 8 + 2 + 8 * count
    rows: list[int] = []
    for delivery in deliveries:
        at += len(delivery)
        rows += [at - (_PAYLOAD if len(delivery) >= 8 else 0), at]
    table = struct.pack("<H", count) + struct.pack(f"<{2 * count}I", *rows)
    return spec_head(token, seq) + table + b"".join(deliveries)


_PAYLOAD = 3  # octets of every payload here


def spec_delivery(number: int) -> bytes:
    payload = b"%03d" % number
    frame = tmqp.Frame(False, False, 17, False, False, 16, 1, "m-1", "p-1", "news", (), payload)
    return tmqp.encode(frame)[0]


class _Claims:
    """The engine's side of a claim: TICKET gets TOKEN applied."""

    def fanout_claim(self, topic: bytes) -> tuple[bytes, list[Any]] | None:
        return (TOKEN, []) if topic == TICKET else None


@pytest.fixture
def door(zctx: Ctx) -> Iterator[tuple[FanoutDoor, zmq.Socket[bytes]]]:
    counters: dict[str, int] = {}
    door = FanoutDoor.bind(zctx, "tcp://127.0.0.1:*", 1000, 0.0, None, _Claims(), counters)
    sub = zctx.socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, TOKEN)
    sub.setsockopt(zmq.SUBSCRIBE, TICKET)
    sub.connect(door.endpoint)

    def claimed() -> bool:
        door.on_readable(0.0)
        return counters["fanout_subscribed"] >= 1

    assert wait_until(claimed)
    door.publish(spec_head(TOKEN, 0), b"")  # a marker: the pipe has the token from here on
    assert sub.poll(10_000) and sub.recv() == spec_head(TOKEN, 0)
    yield door, sub
    sub.close(linger=0)
    door.close(0.0)


def _received(sub: zmq.Socket[bytes], count: int) -> list[bytes]:
    got = []
    for _ in range(count):
        assert sub.poll(10_000), f"{len(got)} of {count} messages came: {got}"
        got.append(sub.recv())
    return got


def test_the_door_sends_consecutive_deliveries_as_one_run(
    door: tuple[FanoutDoor, zmq.Socket[bytes]],
) -> None:
    fan, sub = door
    d = [spec_delivery(i) for i in range(7)]
    fan.publish(spec_head(TOKEN, 1), d[1])
    fan.publish(spec_head(TOKEN, 2), d[2])
    fan.publish(spec_head(TOKEN, 4), d[4])  # not the next number: a new run
    fan.publish(spec_head(OTHER, 9), d[0])  # another stream: a new run (not for this SUB)
    fan.publish(spec_head(TOKEN, 5), d[5])
    fan.publish(spec_head(TOKEN, 5), b"")  # a marker goes after the run before it
    fan.publish(spec_head(TOKEN, 6), d[6])
    fan.flush()
    assert _received(sub, 5) == [
        spec_run(TOKEN, 1, [d[1], d[2]]),
        spec_run(TOKEN, 4, [d[4]]),
        spec_run(TOKEN, 5, [d[5]]),
        spec_head(TOKEN, 5),
        spec_run(TOKEN, 6, [d[6]]),
    ]
    assert fan.counters["fanout_published"] == 6
    assert fan.counters["fanout_sends"] == 5
    assert fan.counters["fanout_markers"] == 2


def test_a_run_ends_at_its_entry_limit(door: tuple[FanoutDoor, zmq.Socket[bytes]]) -> None:
    fan, sub = door
    d = spec_delivery(1)
    for seq in range(1, RUN_MAX + 2):
        fan.publish(spec_head(TOKEN, seq), d)
    fan.flush()
    first, second = _received(sub, 2)
    assert first == spec_run(TOKEN, 1, [d] * RUN_MAX)
    assert second == spec_run(TOKEN, RUN_MAX + 1, [d])


@pytest.mark.parametrize("raw", ["", "numbered"])
def test_a_cut_or_garbled_run_is_read_to_the_damage_and_the_rest_is_a_gap(
    zctx: Ctx, raw: str
) -> None:
    """Hostile input on the SUB (a run cut mid-entry, an entry too short to be a delivery,
    a message shorter than a head, another token): the reader takes what precedes the
    damage, and the numbers it could not read come back as a reported gap."""
    pub = zctx.socket(zmq.PUB)
    pub.linger = 0
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    reader = FanoutReader(zctx, None, 1000, "tcp://127.0.0.1:1", raw=raw)
    joined: Future[None] = Future()
    reader.grant(Fanout(joined, "news", f"tcp://127.0.0.1:{port}", TOKEN, 0, TICKET), 0.0)
    got: list[int] = []

    def read() -> None:
        if raw:
            reader.read_raw()
            while reader.batches:
                for n, payload in reader.batches.popleft():
                    assert payload == (b"%03d" % n if n != 8 else b"")
                    got.append(n)
        else:
            got.extend(int(frame.payload) for frame in reader.read())

    def marker_heard() -> bool:
        pub.send(spec_head(TOKEN, 0))  # (a PUB drops until the SUB is connected)
        read()
        return joined.done()

    assert wait_until(marker_heard, timeout=20)
    d = {n: spec_delivery(n) for n in range(1, 17)}
    pub.send(spec_run(TOKEN, 1, [d[1], d[2], d[3]]))
    pub.send(spec_run(TOKEN, 4, [d[4], d[5], d[6]])[:-2])  # cut in the last delivery
    pub.send(spec_run(TOKEN, 7, [d[7], b"abc", d[9]]))  # 8 is not a delivery
    pub.send(spec_run(OTHER, 10, [d[10]]))  # not this client's stream
    pub.send(spec_head(TOKEN, 10)[:20])  # shorter than a head
    pub.send(spec_run(TOKEN, 10, [d[10], d[11]]))
    pub.send(spec_run(TOKEN, 12, [d[12], d[13]])[:40])  # cut in its table
    pub.send(spec_run(TOKEN, 14, [d[14], d[15], d[16]]))
    assert wait_until(lambda: read() or got[-1:] == [16], timeout=20), f"got {got}"
    missed = sorted(n for g in reader.gaps for n in range(g.first, g.last + 1))
    if raw:  # raw reading slices payloads where the table says: 8's is empty
        assert got == [1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 14, 15, 16]
        assert missed == [6, 12, 13]
    else:  # deliveries are decoded: 8 is missed
        assert got == [1, 2, 3, 4, 5, 7, 9, 10, 11, 14, 15, 16]
        assert missed == [6, 8, 12, 13]
    reader.close()
    pub.close(linger=0)


def test_a_reader_of_fields_gets_its_next_batches_decoded_at_once(zctx: Ctx) -> None:
    """The message reader makes lazy frames (only the payload sliced) while the
    application reads payloads only; once it reads other fields of a batch, the next
    batches come decoded (``tmqp.waiting_fields`` False), which costs less than
    decoding each frame in place when read."""
    pub = zctx.socket(zmq.PUB)
    pub.linger = 0
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    reader = FanoutReader(zctx, None, 1000, "tcp://127.0.0.1:1")
    joined: Future[None] = Future()
    reader.grant(Fanout(joined, "news", f"tcp://127.0.0.1:{port}", TOKEN, 0, TICKET), 0.0)

    def marker_heard() -> bool:
        pub.send(spec_head(TOKEN, 0))
        reader.read()
        return joined.done()

    assert wait_until(marker_heard, timeout=20)
    seq = 1

    def batch() -> list[tmqp.Frame]:
        nonlocal seq
        pub.send(spec_run(TOKEN, seq, [spec_delivery(seq), spec_delivery(seq + 1)]))
        seq += 2
        got: list[tmqp.Frame] = []
        assert wait_until(lambda: bool(got.extend(reader.read()) or got), timeout=20)
        return got

    first = batch()
    assert [f.payload for f in first] == [b"001", b"002"]
    assert all(tmqp.waiting_fields(f) for f in first)  # payloads only: still lazy
    second = batch()
    assert all(tmqp.waiting_fields(f) for f in second)
    assert second[1].message_id == "m-1"  # a field read (of the batch's last): decoded
    assert not tmqp.waiting_fields(second[1]) and tmqp.waiting_fields(second[0])
    third = batch()
    assert not any(tmqp.waiting_fields(f) for f in third)  # decoded at once
    assert [(f.payload, f.source) for f in third] == [(b"005", "p-1"), (b"006", "p-1")]
    reader.close()
    pub.close(linger=0)
