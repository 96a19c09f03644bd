"""``broker serve --stomp``: STOMP on the broker process itself, over real sockets, with
stomp.py and raw frames; logins checked by the broker's authorizer, persistent SENDs on
its durable store (kill -9 after the RECEIPT, restart: the message is there)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

from broker.stomp.frames import Command, Frame
from tests.broker.test_cli import free_port, start_serve
from tests.polling import WAIT, wait_until
from tests.stomp.test_listener import Raw, Recorder

#: A config whose broker lets in the token ``s3cret`` (all actions) and, without a
#: token, only consumers (``join``): no SEND, no channel creation.
TOKENS = '[tokens]\ns3cret = "all"\nreader = ["join"]\n'


def tokens(top: str) -> str:
    """The token table after top-level keys (TOML puts what follows a table in it)."""
    return top + TOKENS


class Serve:
    """One ``broker serve --stomp`` process; stopped with SIGTERM (or killed)."""

    def __init__(self, tmp: Path, *extra: str, config: str | None = None) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.extra = extra
        self.config = config
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        args = [
            "--bind",
            f"tcp://127.0.0.1:{free_port()}",
            "--stomp",
            f"tcp://127.0.0.1:{self.port}",
            *self.extra,
        ]
        if self.config is not None:
            path = self.tmp / "broker.toml"
            path.write_text(self.config)
            args += ["--config", str(path)]
        return start_serve(*args)

    def restart(self) -> None:
        self.proc = self._start()

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(WAIT)
        self._close_pipes()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait(WAIT)
        else:
            code = self.proc.returncode
        self._close_pipes()
        return code

    def _close_pipes(self) -> None:
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[Callable[..., Serve]]:
    made: list[Serve] = []

    def make(*extra: str, config: str | None = None) -> Serve:
        server = Serve(tmp_path, *extra, config=config)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def raws() -> Iterator[Callable[[int], Raw]]:
    made: list[Raw] = []

    def make(port: int) -> Raw:
        raw = Raw(port)
        made.append(raw)
        return raw

    yield make
    for raw in made:
        raw.close()


def connect_frame(**headers: str) -> bytes:
    lines = ["CONNECT"] + [f"{k.replace('_', '-')}:{v}" for k, v in headers.items()]
    return ("\n".join(lines) + "\n\n\x00").encode()


def stomp12(port: int, login: str | None = None, passcode: str | None = None) -> Any:
    conn = stomp.Connection12([("127.0.0.1", port)])
    conn.set_listener("rec", Recorder())
    conn.connect(login, passcode, wait=True)
    return conn


def bodies(conn: Any) -> list[str]:
    rec = recorder(conn)
    with rec.lock:
        return [m.body for m in rec.messages]


def recorder(conn: Any) -> Recorder:
    rec: Recorder = conn.get_listener("rec")
    return rec


# -- CONNECT: the broker's authorizer decides -------------------------------------------


def test_connect_with_a_known_token_is_connected(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    server = serve_factory(config=tokens("require_token = true\n"))
    raw = raws(server.port)
    raw.send(connect_frame(accept_version="1.2", host="localhost", login="u", passcode="s3cret"))
    frame = raw.next()
    assert frame.command is Command.CONNECTED and frame.header("version") == "1.2"


@pytest.mark.parametrize("passcode", ["wrong", None])
def test_connect_refused_by_the_authorizer_gets_error_not_connected(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw], passcode: str | None
) -> None:
    server = serve_factory(config=tokens("require_token = true\n"))
    bad = raws(server.port)
    headers = {"accept_version": "1.2", "host": "localhost", "login": "u"}
    if passcode is not None:
        headers["passcode"] = passcode
    bad.send(connect_frame(**headers))
    frame = bad.next()
    assert frame.command is Command.ERROR
    assert "authentication failed" in (frame.header("message") or "")
    assert bad.closed_by_server()
    assert [f.command for f in bad.frames] == []  # no CONNECTED, nothing after the ERROR
    # the broker keeps serving: a good login still works, end to end
    conn = stomp12(server.port, "u", "s3cret")
    conn.subscribe("/queue/auth-ok", id="s")
    conn.send("/queue/auth-ok", "fine", receipt="r")
    assert wait_until(lambda: bodies(conn) == ["fine"])
    conn.disconnect()


def test_stomp_py_with_a_bad_passcode_fails_to_connect(
    serve_factory: Callable[..., Serve],
) -> None:
    server = serve_factory(config=tokens("require_token = true\n"))
    conn = stomp.Connection12([("127.0.0.1", server.port)])
    rec = Recorder()
    conn.set_listener("rec", rec)
    with pytest.raises(stomp.exception.ConnectFailedException):
        conn.connect("u", "nope", wait=True)
    assert wait_until(lambda: len(rec.errors) == 1)
    assert "authentication failed" in rec.errors[0].headers["message"]


def test_actions_are_authorized_per_token(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    """Without a token (anonymous: ``join`` only) a SEND and the creation of a channel
    are refused with an ERROR; the token holder's traffic is untouched."""
    server = serve_factory(config=tokens('anonymous = ["join"]\n'))
    writer = stomp12(server.port, "w", "s3cret")
    writer.send("/queue/guarded", "first", receipt="r1")
    assert wait_until(lambda: recorder(writer).receipts == ["r1"])

    anon = raws(server.port)
    anon.send(connect_frame(accept_version="1.2", host="localhost"))
    assert anon.next().command is Command.CONNECTED
    anon.send(b"SEND\ndestination:/queue/guarded\nreceipt:x\n\nforged\x00")
    error = anon.next()
    assert error.command is Command.ERROR and error.header("receipt-id") == "x"
    assert anon.closed_by_server()

    creator = raws(server.port)
    creator.send(connect_frame(accept_version="1.2", host="localhost"))
    assert creator.next().command is Command.CONNECTED
    creator.send(b"SUBSCRIBE\nid:1\ndestination:/queue/brand-new\nreceipt:y\n\n\x00")
    error = creator.next()
    assert error.command is Command.ERROR and "not authorized" in (error.header("message") or "")

    reader = raws(server.port)  # anonymous may consume: gets only the token holder's message
    reader.send(connect_frame(accept_version="1.2", host="localhost"))
    assert reader.next().command is Command.CONNECTED
    reader.send(b"SUBSCRIBE\nid:1\ndestination:/queue/guarded\n\n\x00")
    message = reader.next()
    assert message.command is Command.MESSAGE and message.body == b"first"
    writer.send("/queue/guarded", "second", receipt="r2")
    assert reader.next().body == b"second"
    writer.disconnect()


# -- virtual hosts (the manual: 1.0 -> the first one; 1.1+ must name a known one) -------


def _first(raw: Raw) -> Frame:
    return raw.next()


def test_virtual_host_rules(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    server = serve_factory()
    unknown = raws(server.port)
    unknown.send(connect_frame(accept_version="1.1", host="elsewhere.example"))
    frame = _first(unknown)
    assert frame.command is Command.ERROR
    assert "unknown virtual host" in (frame.header("message") or "")
    old = raws(server.port)  # STOMP 1.0 names no host: the first virtual host
    old.send(connect_frame(host="elsewhere.example"))
    assert _first(old).command is Command.CONNECTED
    named = raws(server.port)
    named.send(connect_frame(accept_version="1.2", host="127.0.0.1"))
    assert _first(named).command is Command.CONNECTED


# -- reliable messaging: persistent:true + receipt survives kill -9 ----------------------


def test_persistent_send_receipted_survives_kill_9(
    serve_factory: Callable[..., Serve], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    server = serve_factory("--data", str(data))
    producer = stomp12(server.port)
    for i in range(20):
        producer.send(
            "/queue/orders", f"order-{i}", headers={"persistent": "true"}, receipt=f"p{i}"
        )
    producer.send("/queue/orders", "fleeting", receipt="np")  # not persistent: memory only
    assert wait_until(lambda: len(recorder(producer).receipts) == 21)
    server.kill9()  # no chance to flush anything after the receipts
    server.restart()
    consumer = stomp12(server.port)
    consumer.subscribe("/queue/orders", id="s", ack="client-individual")
    want = [f"order-{i}" for i in range(20)]
    assert wait_until(lambda: bodies(consumer) == want), bodies(consumer)
    frames = list(recorder(consumer).messages)
    assert all(f.headers["persistent"] == "true" for f in frames)
    for frame in frames:
        consumer.ack(frame.headers["ack"])
    consumer.disconnect(receipt="bye")
    # acknowledged: deleted from the store, so a second restart has nothing to redeliver
    assert server.stop() == 0
    server.restart()
    again = stomp12(server.port)
    again.subscribe("/queue/orders", id="s")
    again.send("/queue/orders", "marker", receipt="m")
    assert wait_until(lambda: bodies(again) == ["marker"]), bodies(again)
    again.disconnect()


# -- expiration ------------------------------------------------------------------------


def test_expired_messages_are_dropped_and_ttl_sets_expires(
    serve_factory: Callable[..., Serve],
) -> None:
    server = serve_factory()
    producer = stomp12(server.port)
    producer.send("/queue/exp", "stale", headers={"expires": "1"}, receipt="a")  # 1970
    producer.send("/queue/exp", "fresh", headers={"ttl": "600000"}, receipt="b")
    producer.send("/queue/exp", "forever", receipt="c")
    assert wait_until(lambda: len(recorder(producer).receipts) == 3)
    consumer = stomp12(server.port)
    consumer.subscribe("/queue/exp", id="s")
    assert wait_until(lambda: bodies(consumer) == ["fresh", "forever"]), bodies(consumer)
    fresh = recorder(consumer).messages[0]
    assert int(fresh.headers["expires"]) > 1_700_000_000_000 and "ttl" not in fresh.headers
    bad = stomp.Connection12([("127.0.0.1", server.port)])
    rec = Recorder()
    bad.set_listener("rec", rec)
    bad.connect(wait=True)
    bad.send("/queue/exp", "x", headers={"ttl": "soon"})
    assert wait_until(lambda: len(rec.errors) == 1)
    assert "ttl must be an integer" in rec.errors[0].headers["message"]
