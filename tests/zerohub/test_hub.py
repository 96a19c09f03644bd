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
from tests.ports import free_port


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


def test_hub_with_a_curve_broker_federates_and_sends_file_events(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """A CURVE hub broker: ``[federation] secret`` is also its federation client's key,
    ``[files] events_secret`` the events client's (both allowed by the broker); the link
    goes to a CURVE ``broker serve``.  (Before: both were refused with a CURVE broker.)"""
    import json

    from tests.broker.test_cli import start_serve
    from tests.federation.kit import stats_or_none
    from zerohub import config
    from zerohub.hub import build
    from zerohub.zmqkit import new_certificate

    keys = tmp_path / "keys"
    hub_pub, hub_sec = new_certificate("hub", keys)
    remote_pub, remote_sec = new_certificate("remote", keys)
    fed_pub, fed_sec = new_certificate("fed", keys)
    events_pub, events_sec = new_certificate("events", keys)
    client_pub, client_sec = new_certificate("client", keys)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    for name, public in (("fed", fed_pub), ("events", events_pub), ("client", client_pub)):
        (allowed / f"{name}.key").write_bytes(public.read_bytes())
    remote_endpoint = f"tcp://127.0.0.1:{free_port()}"
    remote = start_serve(
        "--bind", remote_endpoint, "--broker-id", "R", "--federate",
        "--curve-secret", str(remote_sec), "--allow", str(allowed),
        "--link-secret", str(fed_sec),
    )  # fmt: skip
    src = tmp_path / "public"
    src.mkdir()
    (tmp_path / "hub.toml").write_text(
        '[files]\nbind = "tcp://127.0.0.1:*"\nstate = false\nevents = "files.events/3"\n'
        f'events_secret = "{events_sec}"\n[[files.publish]]\ndir = "public"\n'
        f'[broker]\nbind = "tcp://127.0.0.1:*"\ncurve_secret = "{hub_sec}"\n'
        f'allow = "{allowed}"\n'
        f'[federation]\nlinks = ["{remote_endpoint}"]\nbroker_id = "HUB"\n'
        f'secret = "{fed_sec}"\nserver_key = "{remote_pub}"\n'
    )
    hub = build(config.load(tmp_path / "hub.toml"), zctx)
    endpoints = hub.start()
    keys_of = {"curve_secret": client_sec, "timeout": 10}
    try:
        with (
            Client(endpoints.broker, context=zctx, server_key=hub_pub, **keys_of).connect() as pub,
            Client(
                remote_endpoint, context=zctx, server_key=remote_pub, **keys_of
            ).connect() as sub,
        ):
            events: list[dict[str, object]] = []
            with contextlib.suppress(RemoteError):  # the hub made it first
                pub.create_queue("files.events", 3)
            pub.on_message(lambda m: events.append(json.loads(m.payload)))
            pub.join("files.events")
            (src / "new.txt").write_bytes(b"news")
            assert wait_until(lambda: any(e["path"] == "/new.txt" for e in events), 30), events
            got: list[bytes] = []
            sub.create_queue("news", 0, {"Status": "Broadcast"})
            sub.on_message(lambda m: got.append(bytes(m.payload)))
            sub.join("news")
            pub.create_queue("news", 0, {"Status": "Broadcast"})

            def wanted() -> bool:
                stats = stats_or_none(pub)
                peers = {} if stats is None else stats["peers"]
                return "R" in peers and "news" in peers["R"]["interest"]

            assert wait_until(wanted, 30)
            pub.push("news", 0, "over CURVE", ack=True)
            assert wait_until(lambda: got == [b"over CURVE"], 30), got
    finally:
        hub.stop()
        remote.send_signal(signal.SIGTERM)
        remote.wait(20)
        if remote.stderr is not None:
            remote.stderr.close()
