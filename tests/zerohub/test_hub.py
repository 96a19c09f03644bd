"""``zerohub serve`` (``zerohub.hub``): the README's main job, one process serving files and
messages."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import zmq

from broker.client.blocking import Client
from filemq.client import SyncClient
from tests.filemq.procs import read_endpoint

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
