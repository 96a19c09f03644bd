"""Issue 11's promises that had no test of their own (session 16's audit, docs/checklists.md "Issue
11 checklist"), each through a real ``broker serve`` process and real sockets:
STOMP is off unless asked for, the connection limits of the config file
(``max_connections``, ``max_subscriptions``, ``require_host``).  (``/temp-topic/`` and
``wss://``: ``test_serve.py``'s temporary destination and TLS tests, extended.)"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.stomp.frames import Command
from tests.broker.test_cli import start_serve
from tests.polling import WAIT, wait_until
from tests.ports import free_port
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve, bodies, recorder, serve_factory, stomp12

__all__ = ["serve_factory"]  # (the fixture, imported for pytest)

_LISTEN = "0A"  # a TCP socket's state in /proc/net/tcp: listening


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its socket inodes in ``/proc/net/tcp``)."""
    inodes: set[str] = set()
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)  # the header line
            for row in rows:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == _LISTEN and inode in inodes:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def _port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_stomp_is_off_unless_asked_for(serve_factory: Callable[..., Serve]) -> None:
    """Without ``--stomp`` the broker listens on its TMQP endpoint only; with it (the
    control: the count tells the two apart), on the STOMP port as well."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = start_serve("--bind", endpoint)
    try:
        assert listening_ports(proc.pid) == {_port_of(endpoint)}
    finally:
        proc.kill()
        proc.wait(WAIT)
        if proc.stderr is not None:
            proc.stderr.close()
    server = serve_factory()
    with_stomp = listening_ports(server.proc.pid)
    assert server.port in with_stomp and len(with_stomp) == 2  # (its TMQP port: random)


def _refused_at_connect(port: int, connect: bytes) -> str:
    """The ERROR message a new connection sending ``connect`` gets, once the broker closed
    it; "" if it was let in.  (A connection past ``max_connections`` is closed at once,
    its CONNECT unread: the kernel resets it after the ERROR.)"""
    raw = Raw(port)
    try:
        raw.send(connect)
        first = raw.next()
        if first.command is not Command.ERROR:
            return ""
        with contextlib.suppress(ConnectionResetError):
            while raw.sock.recv(65536):  # (a TimeoutError: never closed)
                pass
        return str(first.header("message"))
    finally:
        raw.close()


def test_connection_limits_from_the_config_file(serve_factory: Callable[..., Serve]) -> None:
    """The config's ``[stomp]`` ``max_connections`` (default 1000), ``max_subscriptions``
    (default 1000 per connection) and ``require_host`` (default false): past a limit an
    ERROR naming it, then the close; the other connections are spared."""
    server = serve_factory(
        config="[stomp]\nmax_subscriptions = 3\nmax_connections = 2\nrequire_host = true\n"
    )
    calm: Any = stomp12(server.port)  # (stomp.py 1.2 sends a host header)
    calm.subscribe("/queue/calm", id="c", receipt="c")
    assert wait_until(lambda: "c" in recorder(calm).receipts)
    greedy = Raw(server.port)
    try:
        greedy.connect()
        one_more = b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00"
        assert "too many connections (max 2)" in _refused_at_connect(server.port, one_more)
        for i in range(3):
            greedy.send(
                f"SUBSCRIBE\nid:{i}\ndestination:/queue/q{i}\nreceipt:r{i}\n\n\x00".encode()
            )
            answer = greedy.next()
            assert answer.command is Command.RECEIPT and answer.header("receipt-id") == f"r{i}"
        greedy.send(b"SUBSCRIBE\nid:3\ndestination:/queue/q3\nreceipt:r3\n\n\x00")
        error = greedy.next()
        assert error.command is Command.ERROR and error.header("receipt-id") == "r3"
        assert "max_subscriptions=3" in str(error.header("message"))
        assert greedy.closed_by_server()
    finally:
        greedy.close()
    hostless = b"CONNECT\naccept-version:1.1\n\n\x00"
    why: list[str] = []

    def past_the_connection_limit() -> bool:  # (once the broker saw greedy go)
        why.append(_refused_at_connect(server.port, hostless))
        return "too many connections" not in why[-1]

    assert wait_until(past_the_connection_limit), why
    assert "needs a host header" in why[-1]
    calm.send("/queue/calm", "still served", receipt="s")
    assert wait_until(lambda: bodies(calm) == ["still served"])
    calm.disconnect()


def test_transaction_limits_from_the_config_file(serve_factory: Callable[..., Serve]) -> None:
    """The ``[stomp]`` keys ``max_transactions``, ``max_transaction_frames`` and
    ``max_transaction_bytes`` (session 19): past one, an ERROR naming it with the frame's
    receipt, then the close; nothing of the transaction reaches a queue."""
    server = serve_factory(
        config="[stomp]\nmax_transactions = 1\nmax_transaction_frames = 3\n"
        "max_transaction_bytes = 200\n"
    )
    cases = [
        (b"BEGIN\ntransaction:b\nreceipt:x\n\n\x00", "max_transactions=1"),
        (
            b"SEND\ndestination:/queue/t\ntransaction:a\nreceipt:x\n\n" + b"y" * 200 + b"\x00",
            "max_transaction_bytes=200",
        ),
        (
            b"SEND\ndestination:/queue/t\ntransaction:a\nreceipt:x\n\nz\x00" * 4,
            "max_transaction_frames=3",
        ),
    ]
    for frame, limit in cases:
        raw = Raw(server.port)
        try:
            raw.connect()
            raw.send(b"BEGIN\ntransaction:a\n\n\x00" + frame)
            error = raw.next()
            while error.command is Command.RECEIPT:  # (the frames kept before the limit)
                error = raw.next()
            assert error.command is Command.ERROR and error.header("receipt-id") == "x"
            assert limit in str(error.header("message"))
            assert raw.closed_by_server()
        finally:
            raw.close()
    watcher: Any = stomp12(server.port)
    watcher.subscribe("/queue/t", id="w", receipt="w")
    watcher.send("/queue/t", "only this", receipt="s")
    assert wait_until(lambda: bodies(watcher) == ["only this"])
    watcher.disconnect()
