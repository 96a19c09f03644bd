"""A hostile fan-out stream fed to the whole client over a real SUB socket.

A fake broker (a ROUTER driven by hand) grants the client's JOIN a fan-out stream whose
endpoint is a PUB this test owns; the PUB then sends runs (``broker.fanout``) built by
hand from the spec and damaged: a table of garbage offsets (ends going backwards, a
payload start inside the table), a run cut short, counts that lie (more rows than the
frame holds, fewer rows than deliveries, none, 65,535).  Whatever the API (messages,
raw payloads, numbered payloads; threaded or poll-on-call), every delivery handed out is
exactly what was sent under its number, every other number comes back as a reported
gap, never silently, and the runs after the damage are read.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from broker import tmqp
from broker.client.blocking import Client
from broker.fanout import FANOUT_ENDPOINT, FANOUT_SEQ, FANOUT_TICKET, FANOUT_TOKEN, HEAD_SIZE
from broker.protocol import MessageType, Operation
from tests.broker.test_client_session import PING, PONG, FakeBroker
from tests.broker.test_fanout_runs import spec_delivery, spec_head, spec_run
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
TOKEN = bytes(range(16))
TICKET = bytes(range(100, 116))
#: Octets before a run's table (head, count) and of one row.
TABLE_AT = HEAD_SIZE + 2
ROW = 8


class HostileBroker:
    """Accepts one client session and grants its JOIN a fan-out stream on ``pub``; answers
    PINGs; a thread until ``stop``."""

    def __init__(self, zctx: Ctx) -> None:
        self.fake = FakeBroker(zctx)
        self.pub = zctx.socket(zmq.PUB)
        self.pub.linger = 0
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="hostile-broker")
        self.thread.start()

    def _serve(self) -> None:
        try:
            # (a loaded machine may take seconds to start the client: accept waits 3 s)
            if not self.fake.sock.poll(60_000):
                raise AssertionError("no client came")
            rid, _info = self.fake.accept()
            while not self.stop.is_set():
                if not self.fake.sock.poll(20):
                    continue
                rid, data = self.fake.sock.recv_multipart()
                if data == PING:
                    self.fake.send(rid, PONG)
                    continue
                frame = tmqp.decode((data,))
                if (
                    isinstance(frame, tmqp.Frame)
                    and frame.message_type == MessageType.SERVER
                    and frame.content_type == Operation.JOIN
                ):
                    self.fake.send(rid, self._grant(frame))
        except BaseException as exc:  # reported by close()
            self.failure = exc

    def _grant(self, join: tmqp.Frame) -> bytes:
        headers = (
            (FANOUT_ENDPOINT, f"tcp://127.0.0.1:{self.port}"),
            (FANOUT_TOKEN, TOKEN.hex()),
            (FANOUT_TICKET, TICKET.hex()),
            (FANOUT_SEQ, "0"),
        )
        answer = tmqp.Frame(
            message_type=MessageType.RESPONSE, message_id=join.message_id, headers=headers
        )
        return tmqp.encode(answer)[0]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)
        self.fake.sock.close(linger=0)
        self.pub.close(linger=0)
        assert not self.thread.is_alive()
        if self.failure is not None:
            raise self.failure


@pytest.fixture
def hostile(zctx: Ctx) -> Iterator[HostileBroker]:
    broker = HostileBroker(zctx)
    yield broker
    broker.close()


def join_stream(client: Client, hostile: HostileBroker, threaded: bool) -> None:
    """``client.join("news")``, granted the hostile broker's stream: the PUB drops what
    it sends before the SUB is connected, so markers go out until one lands (from
    another thread than the one running a poll-on-call client's loop)."""
    joined = threading.Event()

    def join() -> None:
        client.join("news", timeout=30)
        joined.set()

    def markers() -> None:
        wait_until(lambda: hostile.pub.send(spec_head(TOKEN, 0)) or joined.is_set(), timeout=30)

    joiner = threading.Thread(target=join if threaded else markers)
    joiner.start()
    if threaded:
        markers()
    else:
        join()
    joiner.join(30)
    assert joined.is_set()


def _rows(run: bytes) -> list[int]:
    count = struct.unpack_from("<H", run, HEAD_SIZE)[0]
    return list(struct.unpack_from(f"<{2 * count}I", run, TABLE_AT))


def _with_rows(run: bytes, rows: list[int]) -> bytes:
    """``run`` with its table's rows replaced (same count)."""
    table = struct.pack(f"<{len(rows)}I", *rows)
    return run[:TABLE_AT] + table + run[TABLE_AT + len(table) :]


def _with_count(run: bytes, count: int) -> bytes:
    return run[:HEAD_SIZE] + struct.pack("<H", count) + run[TABLE_AT:]


def _hostile_runs() -> list[bytes]:
    """Runs of numbers 1..30, the damaged ones among good ones; the last is good."""
    d = {n: spec_delivery(n) for n in range(1, 31)}
    good = spec_run(TOKEN, 1, [d[1], d[2], d[3]])
    backwards = spec_run(TOKEN, 4, [d[4], d[5], d[6]])
    rows = _rows(backwards)
    rows[3] = rows[1] - 5  # 5 ends inside 4: its table row goes backwards
    rows[2] = rows[3] - 3  # (its payload start before that end, as a sane row has)
    backwards = _with_rows(backwards, rows)  # last end and first start still right
    into_table = spec_run(TOKEN, 7, [d[7], d[8]])
    rows = _rows(into_table)
    rows[0] = TABLE_AT  # 7's payload starts inside the table
    into_table = _with_rows(into_table, rows)
    cut = spec_run(TOKEN, 9, [d[9], d[10], d[11]])[:-2]  # cut inside 11
    too_many = _with_count(spec_run(TOKEN, 12, [d[12], d[13]]), 5)  # table runs into 12
    too_few = _with_count(spec_run(TOKEN, 14, [d[14], d[15], d[16]]), 1)
    # (too_few: its one row says 14 ends where 15 starts; the frame goes on)
    none = _with_count(spec_run(TOKEN, 17, [d[17]]), 0)
    huge = _with_count(spec_run(TOKEN, 18, [d[18], d[19]]), 65535)
    between = spec_run(TOKEN, 20, [d[20], d[21]])
    swapped = spec_run(TOKEN, 22, [d[22], d[23], d[24]])
    rows = _rows(swapped)
    rows[2:4], rows[4:6] = rows[4:6], rows[2:4]  # rows of 23 and 24 swapped
    swapped = _with_rows(swapped, rows)
    last = spec_run(TOKEN, 25, [d[n] for n in range(25, 31)])
    return [good, backwards, into_table, cut, too_many, too_few, none, huge, between, swapped,
            last]  # fmt: skip


#: Numbers whose deliveries are intact in the hostile runs and sit where their table
#: rows say: a reader may hand them out (it must hand out 1-3, 20-21 and 25-30).
INTACT = {1, 2, 3, 4, 9, 10, 14, 20, 21, 22, *range(25, 31)}
MUST = {1, 2, 3, 20, 21, *range(25, 31)}


def _read(client: Client, mode: str) -> list[tuple[int, bytes]]:
    """(number, payload) of what one read hands out (messages: the number is the
    payload's text, as the spec's deliveries carry it)."""
    if mode == "messages":
        message = client.receive(timeout=0.05)
        return [] if message is None else [(int(message.payload), message.payload)]
    got: list[Any] = client.receive_payloads(timeout=0.05)
    if mode == "payloads":
        return [(int(p) if p.isdigit() else -1, p) for p in got]
    return [(n, p) for n, p in got]


@pytest.mark.parametrize("threaded", [True, False], ids=["threaded", "poll-on-call"])
@pytest.mark.parametrize("mode", ["messages", "payloads", "numbered"])
def test_hostile_runs_are_gaps_and_later_runs_are_read(
    zctx: Ctx, hostile: HostileBroker, threaded: bool, mode: str
) -> None:
    raw = "" if mode == "messages" else mode
    client = Client(
        hostile.fake.endpoint, context=zctx, threaded=threaded, raw_fanout=raw, timeout=60
    )
    with client:  # (connects: the fake broker accepts the session)
        join_stream(client, hostile, threaded)
        for run in _hostile_runs():
            hostile.pub.send(run)
        got: list[tuple[int, bytes]] = []

        def read_to_the_end() -> bool:
            got.extend(_read(client, mode))
            return any(n == 30 for n, _ in got)

        assert wait_until(read_to_the_end, timeout=30), f"got {[n for n, _ in got]}"
        _verify(got, client.fanout_gaps)


def _verify(got: list[tuple[int, bytes]], gaps: list[Any]) -> None:
    """Every delivery handed out is what was sent under its number, once, in order;
    every other number of 1..30 is in a reported gap."""
    numbers = [n for n, _ in got]
    for n, payload in got:
        assert payload == b"%03d" % n, f"delivery {n} handed out as {payload!r}"
    assert numbers == sorted(set(numbers)), "a number handed out twice or out of order"
    assert MUST <= set(numbers) <= INTACT
    missed = {n for gap in gaps for n in range(gap.first, gap.last + 1)}
    assert missed.isdisjoint(numbers)
    assert missed | set(numbers) == set(range(1, 31)), "a number neither read nor a gap"


def test_the_asyncio_client_reads_hostile_runs_as_gaps(hostile: HostileBroker) -> None:
    from broker.client.aio import AsyncClient
    from tests.broker.test_aioclient import run

    joined = threading.Event()
    markers = threading.Thread(
        target=lambda: wait_until(
            lambda: hostile.pub.send(spec_head(TOKEN, 0)) or joined.is_set(), timeout=60
        )
    )
    markers.start()

    async def main(ctx: Any, endpoint: str) -> None:
        async with AsyncClient(endpoint, context=ctx, timeout=60) as client:
            try:
                await client.join("news", timeout=30)
            finally:
                joined.set()
                markers.join(30)  # (then this thread alone sends on the PUB)
            for hostile_run in _hostile_runs():
                hostile.pub.send(hostile_run)
            got: list[tuple[int, bytes]] = []
            while not any(n == 30 for n, _ in got):
                message = await client.receive(timeout=30)
                assert message is not None, f"got {[n for n, _ in got]}"
                got.append((int(message.payload), message.payload))
            _verify(got, client.fanout_gaps)

    run(hostile.fake.endpoint, main)
    assert joined.is_set()
