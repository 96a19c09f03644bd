"""``zerohub serve`` (``zerohub.hub``): the README's main job, one process serving files and
messages."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import zmq

from broker.client.blocking import Client, RemoteError
from filemq.client import SyncClient
from tests.filemq.procs import read_endpoint
from tests.polling import wait_until

from .support import free_port


def test_file_server_and_broker_in_one_process(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    src = tmp_path / "public"
    src.mkdir()
    (src / "hello.txt").write_bytes(b"hello")
    broker_endpoint = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zerohub",
            "serve",
            "--publish",
            str(src),
            "--bind",
            "tcp://127.0.0.1:*",
            "--broker-bind",
            broker_endpoint,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        endpoint = read_endpoint(proc.stderr)
        assert endpoint
        result = SyncClient(zctx, endpoint, tmp_path / "mirror", once=True, index_path=None).run()
        assert result.synced
        assert (tmp_path / "mirror" / "hello.txt").read_bytes() == b"hello"
        with Client(broker_endpoint, context=zctx, timeout=10).connect() as client:
            client.create_queue("files", 1, {"Status": 3})
            client.push("files", 1, b"hello.txt changed")
            names = [c["Name"] for c in client.channels()]
            assert names == ["files"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_hub_file_events_to_its_own_broker(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """``[files] events = "CHANNEL/QUEUE"``: a JSON event per file change, on the hub's
    own broker."""
    import json

    src = tmp_path / "public"
    src.mkdir()
    broker_endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = tmp_path / "hub.toml"
    config.write_text(
        f'[files]\nbind = "tcp://127.0.0.1:{free_port()}"\nevents = "files.events/3"\n'
        f'state = false\n[[files.publish]]\ndir = "{src}"\nat = "/pub"\n'
        f'[broker]\nbind = "{broker_endpoint}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "zerohub", "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert read_endpoint(proc.stderr)
        got: list[dict[str, object]] = []
        with Client(broker_endpoint, context=zctx, timeout=10).connect() as client:
            with contextlib.suppress(RemoteError):  # the hub made it first
                client.create_queue("files.events", 3)
            client.on_message(lambda m: got.append(json.loads(m.payload)))
            client.join("files.events")
            (src / "new.txt").write_bytes(b"news")
            assert wait_until(lambda: any(e["path"] == "/pub/new.txt" for e in got), 30), got
            [event] = [e for e in got if e["path"] == "/pub/new.txt"]
            assert event["event"] == "created" and event["size"] == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_hub_broker_links_to_another_broker(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """``[federation] links = [...]``: the hub's broker forwards to a linked broker."""
    from tests.broker.test_cli import start_serve
    from tests.federation.kit import stats_or_none

    remote_endpoint = f"tcp://127.0.0.1:{free_port()}"
    remote = start_serve("--bind", remote_endpoint, "--broker-id", "R", "--federate")
    metrics_port = free_port()
    src = tmp_path / "public"
    src.mkdir()
    broker_endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = tmp_path / "hub.toml"
    config.write_text(
        f'[files]\nbind = "tcp://127.0.0.1:{free_port()}"\nstate = false\n'
        f'[[files.publish]]\ndir = "{src}"\n[broker]\nbind = "{broker_endpoint}"\n'
        f'[federation]\nlinks = ["{remote_endpoint}"]\nbroker_id = "HUB"\n'
        f'[metrics]\nenabled = true\naddress = "127.0.0.1:{metrics_port}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "zerohub", "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert read_endpoint(proc.stderr)
        got: list[bytes] = []
        with (
            Client(remote_endpoint, context=zctx, timeout=10).connect() as sub,
            Client(broker_endpoint, context=zctx, timeout=10).connect() as pub,
        ):
            sub.create_queue("news", 0, {"Status": "Broadcast"})
            sub.on_message(lambda m: got.append(bytes(m.payload)))
            sub.join("news")
            pub.create_queue("news", 0, {"Status": "Broadcast"})

            def wanted() -> bool:
                stats = stats_or_none(pub)
                peers = {} if stats is None else stats["peers"]
                return "R" in peers and "news" in peers["R"]["interest"]

            assert wait_until(wanted, 30)
            pub.push("news", 0, "from the hub", ack=True)
            assert wait_until(lambda: got == [b"from the hub"], 30), got
        import urllib.request

        url = f"http://127.0.0.1:{metrics_port}/metrics"

        def scrape() -> str:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return str(answer.read().decode())

        assert wait_until(lambda: "zerohub_federation_confirmed_total 1.0" in scrape(), 20)
        assert 'zerohub_federation_peer_up{peer="R"} 1.0' in scrape()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        for p in (proc, remote):
            if p.poll() is None:
                p.kill()
                p.wait()
            if p.stderr is not None:
                p.stderr.close()
