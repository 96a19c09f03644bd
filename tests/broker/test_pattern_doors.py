"""The broker-wide pattern limit across both doors (adversary tests).

``Limits.max_patterns`` bounds the distinct patterns the broker holds at once, whichever
door they came through: TMQP pattern joins (``JOIN`` with ``Pattern: yes``, refused 482)
and STOMP wildcard subscriptions (refused with an ERROR naming the SUBSCRIBE's receipt).
One door fills the broker, the other's next pattern is refused, nothing else breaks, and
freeing one (a leave, an UNSUBSCRIBE, a disconnect, a holder killed with SIGKILL) lets the
next one in.  A client joining and leaving in a loop leaves nothing behind (the engine's
``patterns`` figure returns to 0).  Real sockets: a TMQP server and a STOMP listener on
one engine (``tests.stomp.two_doors``), small limits so the tests stay fast (and once
at the default 1,000).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator

import pytest
import zmq

from broker.client.blocking import Client, RemoteError
from broker.engine.engine import Engine
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.protocol import Outgoing, ResultCode
from broker.stomp.session import SessionConfig
from tests.polling import WAIT, wait_until
from tests.stomp.two_doors import Broker

Ctx = zmq.Context[zmq.Socket[bytes]]
MAX_PATTERNS = 6
MAX_PATTERN_JOINS = 4  # of one TMQP client


@pytest.fixture
def broker(zctx: Ctx) -> Iterator[Broker]:
    limits = dataclasses.replace(
        Limits(), max_patterns=MAX_PATTERNS, max_pattern_joins=MAX_PATTERN_JOINS
    )
    made = Broker(zctx, Engine(config=dataclasses.replace(BrokerConfig(), limits=limits)))
    yield made
    made.stop()


@pytest.fixture
def tmqp(broker: Broker) -> Iterator[Callable[[], Client]]:
    made: list[Client] = []

    def make() -> Client:
        client = Client(broker.endpoint, context=broker.zctx, timeout=WAIT).connect()
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


class Stomp:
    """A raw STOMP 1.2 connection: frames written by hand, whole frames read back."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.buffer = b""
        self.send(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        assert self.next_frame().startswith(b"CONNECTED\n")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_frame(self) -> bytes:
        while b"\x00" not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, f"connection closed; read {self.buffer!r}"
            self.buffer += chunk
        frame, _, self.buffer = self.buffer.partition(b"\x00")
        return frame.lstrip(b"\n")

    def subscribe(self, sub: str, destination: str) -> bytes:
        """SUBSCRIBE with a receipt; the answer (RECEIPT or ERROR)."""
        self.send(
            f"SUBSCRIBE\nid:{sub}\ndestination:{destination}\nreceipt:r-{sub}\n\n\x00".encode()
        )
        return self.next_frame()

    def unsubscribe(self, sub: str) -> None:
        self.send(f"UNSUBSCRIBE\nid:{sub}\nreceipt:u-{sub}\n\n\x00".encode())
        assert self.next_frame().startswith(f"RECEIPT\nreceipt-id:u-{sub}".encode())

    def close(self) -> None:
        self.sock.close()


def _patterns(broker: Broker) -> int:
    """The engine's figure: distinct patterns held, both doors (read on the engine
    thread, in order with the doors' operations)."""
    box: list[int] = []

    def read(now: float) -> list[Outgoing]:
        value = broker.door.stats()["patterns"]
        assert isinstance(value, int)
        box.append(value)
        return []

    broker.door.submit(read)
    assert wait_until(lambda: bool(box))
    return box[0]


def _receipted(frame: bytes, sub: str) -> bool:
    return frame.startswith(f"RECEIPT\nreceipt-id:r-{sub}".encode())


def _refused(frame: bytes, sub: str) -> bool:
    return frame.startswith(b"ERROR\n") and f"receipt-id:r-{sub}\n".encode() in frame


def _join_refused(client: Client, pattern: str) -> None:
    with pytest.raises(RemoteError) as info:
        client.join_pattern(pattern)
    assert info.value.code == ResultCode.LIMIT_EXCEEDED


def _deliveries_still_flow(broker: Broker, tmqp: Callable[[], Client], watcher: Client) -> None:
    """The pattern already joined still gets its messages; a plain join still works."""
    producer = tmqp()
    producer.push("keep.new", 0, b"to the old pattern", ack=True)
    got = watcher.receive(timeout=WAIT)
    assert got is not None and got.payload == b"to the old pattern"
    plain = tmqp()
    plain.join("plain.channel")
    producer.push("plain.channel", 0, b"plain", ack=True)
    got = plain.receive(timeout=WAIT)
    assert got is not None and got.payload == b"plain"


def test_stomp_fills_the_broker_then_tmqp_gets_482_until_one_is_freed(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    watcher = tmqp()
    watcher.join_pattern("keep.*")
    holder = Stomp(broker.listener.port)
    late = tmqp()
    try:
        for i in range(MAX_PATTERNS - 1):
            assert _receipted(holder.subscribe(f"w{i}", f"/queue/w{i}.*"), f"w{i}")
        assert wait_until(lambda: _patterns(broker) == MAX_PATTERNS)
        _join_refused(late, "late.*")
        _deliveries_still_flow(broker, tmqp, watcher)
        # the STOMP door refuses the same way, and its holder is not disturbed
        other = Stomp(broker.listener.port)
        assert _refused(other.subscribe("x", "/queue/more.*"), "x")
        other.close()
        holder.send(b"SEND\ndestination:/queue/w0.a\nreceipt:s\n\nfor w0\x00")
        message = holder.next_frame()
        assert message.startswith(b"MESSAGE\n") and message.endswith(b"\n\nfor w0"), message
        assert holder.next_frame().startswith(b"RECEIPT\nreceipt-id:s")
        # one freed (UNSUBSCRIBE): the next one is in, and the one after it is not
        holder.unsubscribe("w0")
        late.join_pattern("late.*")
        _join_refused(late, "later.*")
        # a pattern held already costs nothing more, through either door
        late.join_pattern("keep.*")
        assert _receipted(holder.subscribe("again", "/queue/w1.*"), "again")
        # the STOMP holder disconnects: all its patterns go
        holder.send(b"DISCONNECT\nreceipt:bye\n\n\x00")
        assert holder.next_frame().startswith(b"RECEIPT\nreceipt-id:bye")
        assert wait_until(lambda: _patterns(broker) == 2)  # keep.*, late.*
        late.join_pattern("later.*")
    finally:
        holder.close()


def test_tmqp_fills_the_broker_then_stomp_gets_an_error_until_one_is_freed(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    watcher = tmqp()
    watcher.join_pattern("keep.*")
    first, second = tmqp(), tmqp()
    for i in range(MAX_PATTERN_JOINS):
        first.join_pattern(f"a{i}.*")
    _join_refused(first, "a.more.*")  # its own limit (one client), before the broker's
    second.join_pattern("b0.*")
    assert wait_until(lambda: _patterns(broker) == MAX_PATTERNS)
    stomp = Stomp(broker.listener.port)
    try:
        assert _refused(stomp.subscribe("s", "/topic/prices.*"), "s")
        stomp.close()
        _deliveries_still_flow(broker, tmqp, watcher)
        # a plain STOMP subscription is no pattern: still accepted
        stomp = Stomp(broker.listener.port)
        assert _receipted(stomp.subscribe("p", "/queue/plain"), "p")
        # the TMQP holder leaves one: the STOMP wildcard is in
        second.leave_pattern("b0.*")
        assert _receipted(stomp.subscribe("s", "/topic/prices.*"), "s")
        assert _refused(stomp.subscribe("t", "/topic/volumes.*"), "t")
        stomp.close()
        # the TMQP holder of four disconnects: four free
        first.close()
        assert wait_until(lambda: _patterns(broker) == 1)  # keep.* (the STOMP one closed)
        stomp = Stomp(broker.listener.port)
        for i in range(MAX_PATTERNS - 1):
            assert _receipted(stomp.subscribe(f"s{i}", f"/topic/t{i}.*"), f"s{i}")
    finally:
        stomp.close()


_HOLDER = textwrap.dedent(
    """
    import socket, sys
    sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    sock.sendall(b"CONNECT\\naccept-version:1.2\\nhost:localhost\\n\\n\\x00")
    for i in range(int(sys.argv[2])):
        sock.sendall(b"SUBSCRIBE\\nid:k%d\\ndestination:/queue/k%d.*\\n\\n\\x00" % (i, i))
    sock.sendall(b"BEGIN\\ntransaction:t\\nreceipt:held\\n\\n\\x00")
    data = b""
    while b"receipt-id:held" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            sys.exit(1)
        data += chunk
    print("holding", flush=True)
    sys.stdin.read()
    """
)


def test_a_holder_killed_with_sigkill_frees_its_patterns(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(broker.listener.port), str(MAX_PATTERNS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "holding"
        assert wait_until(lambda: _patterns(broker) == MAX_PATTERNS)
        client = tmqp()
        _join_refused(client, "late.*")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(WAIT)
        assert wait_until(lambda: _patterns(broker) == 0)
        client.join_pattern("late.*")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def test_joining_and_leaving_in_a_loop_leaks_nothing(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    client = tmqp()
    stomp = Stomp(broker.listener.port)
    try:
        for i in range(100):
            client.join_pattern(f"loop{i % 7}.*")
            client.join_pattern(f"loop{i % 7}.*")  # (the same again: one)
            assert _receipted(stomp.subscribe(f"s{i}", f"/queue/loop{i % 5}.*"), f"s{i}")
            client.leave_pattern(f"loop{i % 7}.*")
            stomp.unsubscribe(f"s{i}")
        # and refused ones leave nothing either
        for i in range(MAX_PATTERN_JOINS):
            client.join_pattern(f"full{i}.*")
        for _ in range(20):
            _join_refused(client, "one.more.*")
        assert _patterns(broker) == MAX_PATTERN_JOINS
        for i in range(MAX_PATTERN_JOINS):
            client.leave_pattern(f"full{i}.*")
        assert wait_until(lambda: _patterns(broker) == 0)
        # the whole budget is there again
        for i in range(MAX_PATTERNS):
            assert _receipted(stomp.subscribe(f"t{i}", f"/topic/t{i}.*"), f"t{i}")
        assert _patterns(broker) == MAX_PATTERNS
    finally:
        stomp.close()


def test_the_default_limit_of_1000_spans_both_doors(zctx: Ctx) -> None:
    """At the defaults: STOMP connections hold 1,000 wildcards, at most 16 each (their own
    ``max_wildcard_subscriptions``: one connection can no longer take them all), a TMQP
    pattern join is then 482; one UNSUBSCRIBE lets it in."""
    limit = Limits().max_patterns
    each = SessionConfig().max_wildcard_subscriptions
    broker = Broker(zctx)
    client = Client(broker.endpoint, context=broker.zctx, timeout=WAIT).connect()
    holders: list[Stomp] = []
    try:
        for start in range(0, limit, each):
            holder = Stomp(broker.listener.port)
            holders.append(holder)
            holder.send(
                b"".join(
                    b"SUBSCRIBE\nid:w%d\ndestination:/topic/w%d.*\n\n\x00" % (i, i)
                    for i in range(start, min(start + each, limit))
                )
                + b"BEGIN\ntransaction:t\nreceipt:all\n\n\x00"
            )
        for holder in holders:
            assert holder.next_frame().startswith(b"RECEIPT\nreceipt-id:all")
        assert _patterns(broker) == limit
        _join_refused(client, "late.*")
        holders[0].unsubscribe("w0")
        client.join_pattern("late.*")
        assert _patterns(broker) == limit
    finally:
        for holder in holders:
            holder.close()
        client.close()
        broker.stop()
