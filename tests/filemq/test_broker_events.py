"""FILEMQ -> broker: file events observed by a real broker consumer (real processes)."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from broker.client.blocking import Client
from broker.client.errors import RemoteError
from broker.protocol import ResultCode
from filemq.broker_events import BrokerEvents, EventsConfigError, EventTarget
from tests.broker.test_cli import start_serve
from tests.polling import wait_until
from tests.ports import free_port
from zerohub.file_events import connector

from .procs import read_endpoint

FILEMQ = [sys.executable, "-m", "filemq"]
Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def zctx() -> Iterator[Ctx]:
    ctx: Ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[Any]]]:
    made: list[subprocess.Popen[Any]] = []
    yield made
    for p in made:
        if p.poll() is None:
            p.kill()
        p.wait(10)
        if p.stderr is not None:
            p.stderr.close()


@pytest.fixture
def broker(procs: list[subprocess.Popen[Any]]) -> str:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    procs.append(start_serve("--bind", endpoint))
    return endpoint


def consumer(endpoint: str, zctx: Ctx, got: list[dict[str, Any]]) -> Client:
    client = Client(endpoint, context=zctx, timeout=10).connect()
    try:
        client.create_queue("files", 0)
    except RemoteError as err:  # a late broker: the buffered events' push made it first
        if err.code != ResultCode.ALREADY_CREATED:
            raise
    client.on_message(lambda m: got.append(json.loads(m.payload)))
    client.join("files")
    return client


def filemq_serve(procs: list[subprocess.Popen[Any]], pub: Path, *args: str) -> str:
    proc = subprocess.Popen(
        [*FILEMQ, "serve", "--bind", "tcp://127.0.0.1:*", "--no-state", "--publish",
         f"{pub}:/docs", *args],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    procs.append(proc)
    assert proc.stderr is not None
    endpoint = read_endpoint(proc.stderr)
    assert endpoint, "filemq serve did not report its endpoint"
    return endpoint


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def test_server_file_events_reach_a_broker_consumer(
    procs: list[subprocess.Popen[Any]], broker: str, zctx: Ctx, tmp_path: Path
) -> None:
    pub = tmp_path / "pub"
    pub.mkdir()
    (pub / "old.txt").write_bytes(b"there before")  # no event: the server starts with it
    got: list[dict[str, Any]] = []
    sub = consumer(broker, zctx, got)
    filemq_serve(procs, pub, "--events-broker", broker, "--events-channel", "files/0")

    def kinds(path: str) -> list[str]:
        return [e["event"] for e in got if e["path"] == path]

    (pub / "a.txt").write_bytes(b"first")
    assert wait_until(lambda: kinds("/docs/a.txt") == ["created"], 30), got
    (pub / "a.txt").write_bytes(b"second version")
    assert wait_until(lambda: kinds("/docs/a.txt") == ["created", "updated"], 30), got
    (pub / "a.txt").unlink()
    assert wait_until(lambda: kinds("/docs/a.txt") == ["created", "updated", "deleted"], 30)
    created, updated, deleted = [e for e in got if e["path"] == "/docs/a.txt"]
    assert created["size"] == 5 and created["sha1"] == sha1(b"first")
    assert updated["size"] == 14 and updated["sha1"] == sha1(b"second version")
    assert isinstance(updated["mtime"], float) and updated["mtime"] > 0
    assert deleted["size"] == 0 and deleted["sha1"] == "" and deleted["mtime"] is None
    assert created["origin"].startswith("filemq serve")
    assert len({e["id"] for e in got}) == len(got)
    assert kinds("/docs/old.txt") == []
    sub.close()


def test_broker_down_does_not_stop_file_serving(
    procs: list[subprocess.Popen[Any]], tmp_path: Path
) -> None:
    pub, dest = tmp_path / "pub", tmp_path / "dest"
    pub.mkdir()
    nobody = f"tcp://127.0.0.1:{free_port()}"  # no broker there
    endpoint = filemq_serve(procs, pub, "--events-broker", nobody, "--events-buffer", "3")
    for i in range(5):
        (pub / f"f{i}.txt").write_bytes(b"x" * i)
    want = {f"f{i}.txt" for i in range(5)}

    def synced() -> bool:
        subprocess.run([*FILEMQ, "sync", endpoint, str(dest), "--path", "/docs", "--once"],
                       capture_output=True, timeout=60)  # fmt: skip
        return dest.is_dir() and {p.name for p in dest.iterdir()} >= want

    assert wait_until(synced, 60, step=0.5)
    server = procs[-1]
    server.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert server.stderr is not None
    report = server.stderr.read()
    assert "0 pushed to the broker, 2 dropped (buffer full), 3 not pushed" in report, report


def test_buffered_events_are_pushed_in_order_once_the_broker_is_up(
    procs: list[subprocess.Popen[Any]], zctx: Ctx
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    target = EventTarget.parse(endpoint, "files/0", buffer=4)
    events = BrokerEvents(target, "test", connector(target, zctx)).start()
    try:
        offered = [events.offer({"event": "created", "path": f"/p{i}"}) for i in range(6)]
        assert offered == [True] * 4 + [False] * 2
        assert events.stats()["dropped"] == 2
        procs.append(start_serve("--bind", endpoint))  # the broker comes up late
        got: list[dict[str, Any]] = []
        sub = consumer(endpoint, zctx, got)
        # at-least-once: a push whose acknowledge came late (a loaded machine) is pushed
        # again with its id, which the consumer drops
        first: dict[str, str] = {}

        def distinct() -> int:
            for e in list(got):  # (appended by the client's I/O thread)
                first.setdefault(e["id"], e["path"])
            return len(first)

        assert wait_until(lambda: distinct() >= 4, 60), got
        assert list(first.values()) == ["/p0", "/p1", "/p2", "/p3"]  # in order
        assert all(first[e["id"]] == e["path"] for e in got)  # a second copy: the same id
        assert wait_until(lambda: events.stats()["published"] == 4, 30)
        sub.close()
    finally:
        events.stop()


def test_subscriber_applied_events(
    procs: list[subprocess.Popen[Any]], broker: str, zctx: Ctx, tmp_path: Path
) -> None:
    pub, dest = tmp_path / "pub", tmp_path / "dest"
    pub.mkdir()
    (pub / "doc.txt").write_bytes(b"content")
    got: list[dict[str, Any]] = []
    sub = consumer(broker, zctx, got)
    endpoint = filemq_serve(procs, pub)
    daemon = subprocess.Popen(
        [*FILEMQ, "subscribe", endpoint, str(dest), "--path", "/docs",
         "--events-broker", broker, "--events-channel", "files/0"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    procs.append(daemon)
    assert wait_until(lambda: any(e["event"] == "applied" for e in got), 30), got
    [applied] = [e for e in got if e["event"] == "applied"]
    assert applied["change"] == "create" and applied["path"] == "doc.txt"
    assert applied["sha1"] == sha1(b"content") and applied["size"] == 7
    assert applied["local"] == str(dest / "doc.txt")
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    sub.close()


def test_bad_event_options() -> None:
    for endpoint, channel in (("http://x", None), ("tcp://h:1", "c/notanumber"),
                              ("tcp://h:1", "/0"), ("tcp://h:1", "c/70000")):  # fmt: skip
        with pytest.raises(EventsConfigError):
            EventTarget.parse(endpoint, channel)
    with pytest.raises(EventsConfigError):
        EventTarget.parse("tcp://h:1", buffer=0)
