"""``broker`` command line: errors that say why, and auto-creation as a configured choice."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.zerohub.support import cli, one_line
from zerohub.cli import ExitCode

from .test_cli import start_serve


@pytest.fixture
def serving() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def _serve(serving: list[subprocess.Popen[bytes]], *args: str) -> str:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    serving.append(start_serve("--bind", endpoint, *args))
    return endpoint


def _keys(tmp_path: Path, *names: str) -> Path:
    keys = tmp_path / "keys"
    for name in names:
        made = cli("filemq", "keys", "new", name, "--dir", str(keys))
        assert made.returncode == 0, made.stderr
    return keys


def test_a_client_without_keys_is_told_the_broker_requires_curve(
    tmp_path: Path, serving: list[subprocess.Popen[bytes]]
) -> None:
    keys = _keys(tmp_path, "server", "client", "stranger")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "client.key").write_bytes((keys / "client.key").read_bytes())
    endpoint = _serve(
        serving, "--curve-secret", str(keys / "server.key_secret"), "--allow", str(allowed)
    )
    # a long --timeout: only the handshake failure may end these commands in time
    plain = cli("broker", "stats", "--connect", endpoint, "--timeout", "120", timeout=30)
    line = one_line(plain.stderr)
    assert plain.returncode == ExitCode.REFUSED
    assert line == (
        f"broker: the broker at {endpoint} requires CURVE (handshake failed): "
        "pass --server-key SERVER.key --curve-secret CLIENT.key_secret"
    )
    curve = ("--server-key", str(keys / "server.key"), "--connect", endpoint, "--timeout", "120")
    stranger = cli(
        "broker", "stats", *curve, "--curve-secret", str(keys / "stranger.key_secret"), timeout=30
    )
    assert stranger.returncode == ExitCode.REFUSED
    assert "refused this client's CURVE key" in one_line(stranger.stderr)
    ok = cli("broker", "stats", *curve, "--curve-secret", str(keys / "client.key_secret"))
    assert ok.returncode == 0, ok.stderr
    assert "clients" in json.loads(ok.stdout)["engine"]


def test_pull_from_a_queue_that_is_not_a_pull_queue_says_why(
    serving: list[subprocess.Popen[bytes]],
) -> None:
    c = ("--connect", _serve(serving))
    for status in ("Push", "RoundRobin"):
        created = cli("broker", "admin", *c, "create", "jobs", "1", "--options",
                      json.dumps({"Status": status}))  # fmt: skip
        assert created.returncode == 0, created.stderr
        assert cli("broker", "push", *c, "jobs", "1", "work", "--ack").returncode == 0
        done = cli("broker", "pull", *c, "jobs", "1")
        line = one_line(done.stderr)
        assert done.returncode == ExitCode.FAILURE
        assert line == (
            f"broker: queue jobs/1 has status {status}: pull works on Pull and Cache queues "
            "(status 406)"
        )
        assert cli("broker", "admin", *c, "delete", "jobs").returncode == 0


@pytest.mark.parametrize("auto", [True, False])
def test_auto_creation_is_a_configured_choice(
    auto: bool, tmp_path: Path, serving: list[subprocess.Popen[bytes]]
) -> None:
    config = tmp_path / "broker.toml"
    flag = "true" if auto else "false"
    config.write_text(f"[broker]\nauto_create_channel = {flag}\nauto_create_queue = {flag}\n")
    c = ("--connect", _serve(serving, "--config", str(config)))

    def channels() -> dict[str, list[int]]:
        listed = cli("broker", "admin", *c, "list")
        assert listed.returncode == 0, listed.stderr
        names = [ch["Name"] for ch in json.loads(listed.stdout)]
        queues = {}
        for name in names:
            out = cli("broker", "admin", *c, "list", name).stdout
            queues[name] = [q["Id"] for q in json.loads(out)]
        return queues

    pushed = cli("broker", "push", *c, "orders", "7", "hello", "--ack")
    joined = cli("broker", "consume", *c, "events", "--wait", "0.2")
    if auto:
        assert pushed.returncode == 0 and joined.returncode == 0, pushed.stderr + joined.stderr
        assert channels() == {"orders": [7], "events": []}
        got = cli("broker", "consume", *c, "orders", "--count", "1", "--wait", "10")
        assert got.stdout == "hello\n"
        return
    assert pushed.returncode == ExitCode.FAILURE
    assert "no such channel" in one_line(pushed.stderr)
    assert joined.returncode == ExitCode.FAILURE and "404" in one_line(joined.stderr)
    assert cli("broker", "admin", *c, "create", "orders").returncode == 0
    pushed = cli("broker", "push", *c, "orders", "7", "hello", "--ack")
    assert pushed.returncode == ExitCode.FAILURE and "no such queue" in one_line(pushed.stderr)
    assert channels() == {"orders": []}  # only what an admin created
