"""The ZeroMQ socket bridge: real zmq application sockets, a real ``broker serve`` and
``broker bridge zmq`` processes."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import zmq

from broker.bridge.config import parse_route
from broker.bridge.connectors.zmq_sockets import SocketSpec
from broker.bridge.errors import ConfigError
from broker.client.blocking import Client, Message
from tests.broker.test_cli import start_serve
from tests.polling import wait_until
from tests.ports import free_port

Ctx = zmq.Context[zmq.Socket[bytes]]
WAIT = 30.0
STOP_WAIT = 60.0  # a process's stop on a machine at load 40-60 (a deadline, not a delay)


@pytest.fixture
def zctx() -> Iterator[Ctx]:
    ctx: Ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def serve() -> Iterator[str]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = start_serve("--bind", endpoint)
    yield endpoint
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(STOP_WAIT) == 0


# ``broker bridge`` whose main thread is slow to take its signals (as on a loaded
# machine, where it may be descheduled for seconds): one second before stop_signals.
LATE_SIGNALS = """
import contextlib, sys, time
import zerohub.cli
taken = zerohub.cli.stop_signals
@contextlib.contextmanager
def late(*args, **kwargs):
    time.sleep(1.0)
    with taken(*args, **kwargs) as stop:
        yield stop
zerohub.cli.stop_signals = late
from broker.cli import main
sys.exit(main(sys.argv[1:]))
"""


def bridge(serve: str, *maps: str, late_signals: bool = False) -> subprocess.Popen[bytes]:
    args = [a for m in maps for a in ("--map", m)]
    program = ["-c", LATE_SIGNALS] if late_signals else ["-m", "broker"]
    return subprocess.Popen(
        [sys.executable, *program, "bridge", "zmq", "--connect", serve, *args],
        stderr=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen[bytes]) -> bytes:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(STOP_WAIT)
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    assert code == 0, err
    assert b"Traceback" not in err
    return err


@contextlib.contextmanager
def running(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """``proc`` for the block; killed at its end if it still runs (a test that failed)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def local_client(
    serve: str, zctx: Ctx, bridged_out: str, bridged_in: str | None = None
) -> Iterator[tuple[Client, list[Message]]]:
    """A client of the broker, once the bridge consumes channel ``bridged_out``; with
    ``bridged_in``, it takes (into the list) what the bridge pushes to that channel's
    queue 2."""
    with Client(serve, context=zctx, timeout=10) as local:
        got: list[Message] = []
        if bridged_in is not None:
            local.create_queue(bridged_in, 2, {"Status": "Push"})
            local.on_message(got.append)
            local.join(bridged_in)
        assert wait_until(lambda: _consumers(local, bridged_out) >= 1, WAIT)
        yield local, got


def test_push_out_and_pull_in(serve: str, zctx: Ctx) -> None:
    out_port, in_port = free_port(), free_port()
    app_pull = zctx.socket(zmq.PULL)  # an existing application: it binds, the bridge connects
    app_pull.bind(f"tcp://127.0.0.1:{out_port}")
    app_push = zctx.socket(zmq.PUSH)
    app_push.bind(f"tcp://127.0.0.1:{in_port}")
    proc = bridge(serve, f"out:jobs/1=push:tcp://127.0.0.1:{out_port}",
                  f"in:results/2=pull:tcp://127.0.0.1:{in_port}")  # fmt: skip
    try:
        with running(proc):
            with local_client(serve, zctx, "jobs", "results") as (local, got):
                for i in range(50):
                    local.push("jobs", 1, f"j{i}", ack=True)
                received: set[bytes] = set()
                app_pull.rcvtimeo = 10_000
                while len(received) < 50:
                    received.add(app_pull.recv())
                assert received == {f"j{i}".encode() for i in range(50)}
                assert wait_until(lambda: local.queue_info("jobs", 1)["Acks"] == 50, WAIT)
                for i in range(50):
                    app_push.send(f"r{i}".encode())
                assert wait_until(lambda: len(got) >= 50, WAIT)
                assert [bytes(m.payload) for m in got] == [f"r{i}".encode() for i in range(50)]
            finish(proc)
    finally:
        app_push.close(linger=0)


def test_pub_out_with_topic_and_sub_in(serve: str, zctx: Ctx) -> None:
    out_port, in_port = free_port(), free_port()
    app_pub = zctx.socket(zmq.PUB)
    app_pub.bind(f"tcp://127.0.0.1:{in_port}")
    proc = bridge(serve, f"out:news/1=pub@tcp://127.0.0.1:{out_port}#news",
                  f"in:ticks/2=sub:tcp://127.0.0.1:{in_port}#tick")  # fmt: skip
    app_sub = zctx.socket(zmq.SUB)
    app_sub.setsockopt(zmq.SUBSCRIBE, b"news")
    app_sub.connect(f"tcp://127.0.0.1:{out_port}")
    try:
        with running(proc):
            with local_client(serve, zctx, "news", "ticks") as (local, got):
                # PUB drops until the subscription arrived: publish until one comes through
                app_sub.rcvtimeo = 200

                def seen_news() -> bool:
                    local.push("news", 1, "hello", ack=True)
                    try:
                        return app_sub.recv_multipart() == [b"news", b"hello"]
                    except zmq.Again:
                        return False

                assert wait_until(seen_news, WAIT)

                def seen_tick() -> bool:
                    app_pub.send_multipart([b"tick", b"42"])
                    app_pub.send_multipart([b"other", b"ignored"])
                    return any(bytes(m.payload) == b"42" for m in got)

                assert wait_until(seen_tick, WAIT, step=0.1)
                tick = next(m for m in got if bytes(m.payload) == b"42")
                assert tick.header("Zmq-Topic") == "tick"
                assert all(bytes(m.payload) != b"ignored" for m in got)
            finish(proc)
    finally:
        app_pub.close(linger=0)
        app_sub.close(linger=0)


def test_bad_zmq_remotes() -> None:
    for text in ("out:a/1=sub:tcp://h:1", "in:a/1=pub:tcp://h:1", "out:a/1=push:h:1",
                 "out:a/1=push:udp://h:1", "in:a/1=pull"):  # fmt: skip
        with pytest.raises(ConfigError):
            SocketSpec.parse(parse_route(text))
    spec = SocketSpec.parse(parse_route("in:a/1=sub@tcp://127.0.0.1:5#t"))
    assert spec.bind and spec.topic == b"t" and spec.endpoint == "tcp://127.0.0.1:5"


def test_bad_zmq_map_is_one_line_exit_2(serve: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "broker", "bridge", "zmq", "--connect", serve,
         "--map", "out:a/1=sub:tcp://127.0.0.1:1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def _consumers(client: Client, channel: str) -> int:
    try:
        return int(client.channel_info(channel)["ActiveClients"])
    except Exception:
        return 0


def stop_lines(serve: str, zctx: Ctx, channel: str, *, late_signals: bool = False) -> list[str]:
    """The ``stopping`` lines of a bridge (out to a PUSH socket) stopped by SIGTERM as soon
    as the broker sees it consume ``channel`` (it must exit 0, no traceback)."""
    out_port = free_port()
    app_pull = zctx.socket(zmq.PULL)
    app_pull.bind(f"tcp://127.0.0.1:{out_port}")
    proc = bridge(
        serve, f"out:{channel}/1=push:tcp://127.0.0.1:{out_port}", late_signals=late_signals
    )
    with running(proc):
        with local_client(serve, zctx, channel):
            pass
        err = finish(proc)
    return [line for line in err.decode().splitlines() if "stopping" in line]


def test_sigterm_stops_the_bridge_with_one_line(serve: str, zctx: Ctx) -> None:
    # SIGTERM used to raise KeyboardInterrupt wherever the main thread was (it can be
    # dropped inside a ZeroMQ frame's finaliser); now it asks for a stop: exit 0, one line.
    assert stop_lines(serve, zctx, "quiet") == ["broker bridge: stopping (SIGTERM)"]


def test_a_sigterm_as_soon_as_the_broker_sees_the_bridge_stops_it_cleanly(
    serve: str, zctx: Ctx
) -> None:
    """Was (seen under load): the bridge joined the broker before it took its signals,
    and a SIGTERM in between killed it (exit -15, no stop line, nothing unsubscribed)."""
    stops = stop_lines(serve, zctx, "early", late_signals=True)
    assert stops == ["broker bridge: stopping (SIGTERM)"]
