"""``broker bridge mqtt``: usage errors are one line and exit 2; a real run moves messages
both ways between a ``broker serve`` process and mosquitto, and stops on SIGTERM with 0."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.cli import main
from tests.bridge.peers import Mosquitto
from tests.bridge.test_mqtt import WAIT, RemoteClient, consume
from tests.broker.test_cli import start_serve
from tests.polling import wait_until
from tests.ports import free_port


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--map", "orders=zh/orders"], "--map wants [out:|in:]CHANNEL/QUEUE=REMOTE"),
        (["--map", "orders/x=zh/orders"], "queue id must be a number"),
        (["--map", "orders/70000=zh"], "queue id must be a number"),
        (["--map", "in:orders/1="], "--map wants"),
        (["--map", "a/1=b", "--url", "http://h:1"], "URL must start with mqtt://"),
        (["--map", "a/1=b", "--url", "mqtt://h:99999"], "bad URL"),
        (["--map", "a/1=b", "--window", "0"], "window must be at least 1"),
        (["--map", "a/1=b", "--backoff", "x"], "--backoff wants FIRST:MAX"),
        (["--map", "a/1=b", "--backoff", "5:1"], "backoff wants 0 < FIRST <= MAX"),
        (["--map", "a/1=b", "--dead-letter", "dead"], "--map wants"),
        (["--map", "a/1=b", "--url", "mqtt://h", "--kind", "amqp"], "must start with amqp://"),
        (["--map", "a/1=b", "--url", "amqp://:5/", "--kind", "amqp"], "URL has no host"),
    ],
)
def test_bad_route_url_or_limit_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    kind = "mqtt"
    if "--kind" in argv:
        kind = argv[argv.index("--kind") + 1]
        argv = argv[: argv.index("--kind")]
    base = ["bridge", kind, "--url", f"{kind}://127.0.0.1:1", "--connect", "tcp://127.0.0.1:1"]
    code = main([*base, *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("broker: ") and message in err, err


def test_unreachable_local_broker_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    code = main(["bridge", "mqtt", "--url", "mqtt://127.0.0.1:1", "--map", "a/1=b",
                 "--connect", f"tcp://127.0.0.1:{port}", "--timeout", "0.5"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "no answer" in err, err


@pytest.fixture
def serve() -> Iterator[str]:
    port = free_port()
    proc = start_serve("--bind", f"tcp://127.0.0.1:{port}")
    yield f"tcp://127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_bridge_command_moves_messages_both_ways_and_stops_on_sigterm(
    tmp_path: Path, serve: str
) -> None:
    from broker.client.blocking import Client

    mosquitto = Mosquitto(tmp_path)
    mosquitto.start()
    downstream = RemoteClient(mosquitto.port, "downstream", "zh/out")
    bridge = subprocess.Popen(
        [sys.executable, "-m", "broker", "bridge", "mqtt", "--url", mosquitto.url,
         "--connect", serve, "--map", "out/1=zh/out", "--map", "in:in/2=zh/in",
         "--remote-client-id", "cli-bridge"],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    upstream = None
    try:
        with Client(serve, timeout=5.0) as local:
            local.create_queue("in", 2, {"Status": "Push"})
            local.join("in")
            # once the bridge joined "out", its queue requests acks
            assert wait_until(lambda: _has_queue(local, "out", 1), WAIT)
            for i in range(20):
                local.push("out", 1, f"o{i}".encode())
            expected = {f"o{i}".encode() for i in range(20)}
            assert wait_until(lambda: downstream.distinct() == expected, WAIT)
            assert wait_until(lambda: local.queue_info("out", 1)["Acks"] == 20, WAIT)
            upstream = RemoteClient(mosquitto.port, "upstream")
            # the bridge subscribed when its session shows up on mosquitto: retry until then
            assert wait_until(lambda: _published_and_seen(upstream, local), WAIT)
        bridge.send_signal(signal.SIGTERM)
        assert bridge.wait(15) == 0
        assert bridge.stderr is not None and b"Traceback" not in bridge.stderr.read()
    finally:
        if bridge.poll() is None:
            bridge.kill()
            bridge.wait(10)
        if bridge.stderr is not None:
            bridge.stderr.close()
        downstream.close()
        if upstream is not None:
            upstream.close()
        mosquitto.stop()


def _has_queue(local: object, channel: str, queue_id: int) -> bool:
    from broker.client.blocking import RemoteError

    try:
        return bool(local.queue_info(channel, queue_id)["RequestAcknowledge"])  # type: ignore[attr-defined]
    except RemoteError:
        return False


def _published_and_seen(upstream: RemoteClient, local: object) -> bool:
    upstream.publish("zh/in", b"ping")
    return consume(local, 1, timeout=0.5) == {b"ping"}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[[bridge]]\nkind = 'mqtt'\nurl = 'mqtt://h'\nmap = ['a/1=b']\nwindw = 3\n",
            "bridge #1: unknown key 'windw'",
        ),
        (
            "[[bridge]]\nkind = 'pigeon'\nurl = 'x'\nmap = ['a/1=b']\n",
            "kind must be mqtt, amqp, stomp or zmq",
        ),
        ("[[bridge]]\nkind = 'amqp'\nurl = 'amqp://h'\nmap = 'a/1=b'\n", "map must be a list"),
        ("[[bridge]]\nkind = 'amqp'\nurl = 'amqp://h'\nmap = ['a=b']\n", "--map wants"),
        (
            "[[bridge]]\nkind = 'mqtt'\nurl = 'mqtt://h'\nmap = ['a/1=b']\nbackoff = 'x'\n",
            "must be numbers",
        ),
        ("[other]\nx = 1\n", "wants [[bridge]] tables only"),
        ("[[bridge]\n", "bridges.toml"),
    ],
)
def test_bad_bridges_toml_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bridges.toml"
    path.write_text(text)
    code = main(["bridge", "run", str(path), "--connect", "tcp://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_bridge_run_toml_starts_every_bridge(tmp_path: Path, serve: str) -> None:
    from broker.client.blocking import Client

    mosquitto = Mosquitto(tmp_path)
    mosquitto.start()
    downstream = RemoteClient(mosquitto.port, "downstream", "zh/#")
    config = tmp_path / "bridges.toml"
    config.write_text(
        f"[[bridge]]\nkind = 'mqtt'\nurl = '{mosquitto.url}'\nmap = ['a/1=zh/a']\n"
        f"window = 5\nbackoff = [0.05, 1]\nclient_id = 'one'\n\n"
        f"[[bridge]]\nkind = 'mqtt'\nurl = '{mosquitto.url}'\nmap = ['b/1=zh/b']\n"
    )
    bridge = subprocess.Popen(
        [sys.executable, "-m", "broker", "bridge", "run", str(config), "--connect", serve],
        stderr=subprocess.PIPE,
    )
    try:
        with Client(serve, timeout=5.0) as local:
            assert wait_until(lambda: _has_queue(local, "a", 1) and _has_queue(local, "b", 1))
            local.push("a", 1, b"to-a")
            local.push("b", 1, b"to-b")
            assert wait_until(lambda: downstream.distinct() == {b"to-a", b"to-b"}, WAIT)
        bridge.send_signal(signal.SIGTERM)
        assert bridge.wait(15) == 0
    finally:
        if bridge.poll() is None:
            bridge.kill()
            bridge.wait(10)
        if bridge.stderr is not None:
            bridge.stderr.close()
        downstream.close()
        mosquitto.stop()
