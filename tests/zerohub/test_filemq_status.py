"""``filemq status URL`` against a real ``zerohub serve`` process: what its file server
publishes (mounts, files, bytes) and how its subscribers keep up (a subscriber that gives
no credit shows its lag), read from the console's JSON or from the Prometheus text; bad
URLs, a closed port, a refusing or foreign HTTP server: one line and a documented code."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import zmq

from filemq import fmq_msg
from tests.polling import wait_until
from tests.ports import free_port
from tests.zerohub.support import cli, one_line
from zerohub.cli import ExitCode


def status(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("filemq", "status", url, *args)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A ``zerohub serve`` process with the console and the metrics on; (files endpoint,
    console URL, metrics URL)."""
    public = tmp_path / "public"
    (public / "sub").mkdir(parents=True)
    (public / "a.txt").write_bytes(b"a" * 1000)
    (public / "sub" / "b.bin").write_bytes(os.urandom(70_000))
    other = tmp_path / "other"
    other.mkdir()
    (other / "c.txt").write_bytes(b"c" * 5)
    console, metrics = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "zerohub", "serve",
            "--bind", "tcp://127.0.0.1:*", "--broker-bind", "tcp://127.0.0.1:*",
            "--publish", str(public), "--publish", f"{other}:/other", "--no-state",
            "--console", f"127.0.0.1:{console}", "--metrics", f"127.0.0.1:{metrics}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        while not any(line.startswith("zerohub: serving") for line in lines):
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        files = "".join(lines).split(" on tcp://")[-1].split()[0]
        yield f"tcp://{files}", f"http://127.0.0.1:{console}", f"http://127.0.0.1:{metrics}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_status_shows_mounts_files_bytes_and_a_lagging_subscriber(
    served: tuple[str, str, str], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    files, console, metrics = served
    result = status(console, "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert [(m["at"], m["files"], m["bytes"]) for m in figures["mounts"]] == [
        ("/", 2, 71_000),
        ("/other", 1, 5),
    ]
    assert (figures["files"], figures["bytes"], figures["clients"]) == (3, 71_005, 0)

    # a subscriber that gives no credit: its files wait for it (its lag)
    dealer = zctx.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        dealer.connect(files)
        for message in (fmq_msg.Ohai(), fmq_msg.Icanhaz("/", {"RESYNC": "1"}, {})):
            dealer.send_multipart(fmq_msg.encode(message))

        def lagging(url: str) -> bool:
            answer = status(url, "--json")
            subs = json.loads(answer.stdout)["subscribers"] if answer.returncode == 0 else []
            return [s["queued"] for s in subs] == [4]  # three files and the resync marker

        assert wait_until(lambda: lagging(console), timeout=30)
        assert lagging(metrics)  # the same figures from the Prometheus text

        text = status(console)
        assert text.returncode == 0 and text.stderr == ""
        first, *rest = text.stdout.splitlines()
        assert first.startswith("2 mounts, 3 files, 71005 bytes; 1 subscribers, 4 files queued")
        assert rest[0].startswith("mount /: 2 files, 71000 bytes  /")
        assert rest[1].startswith("mount /other: 1 files, 5 bytes  /")
        assert rest[2].startswith("subscriber ") and "4 files queued" in rest[2]
        assert rest[2].endswith("  /")
        from_metrics = status(metrics)
        assert from_metrics.returncode == 0
        assert from_metrics.stdout.splitlines()[0] == first
    finally:
        dealer.close()


class _Stranger(BaseHTTPRequestHandler):
    """An HTTP server that is not a hub: it refuses (421) or answers a web page (200)."""

    code = 200

    def do_GET(self) -> None:
        body = b"<html>hello</html>"
        self.send_response(self.code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def stranger(code: int) -> Iterator[str]:
    handler = type("Handler", (_Stranger,), {"code": code})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_status_errors_are_one_line_with_a_documented_code() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    answer = status(closed)
    assert answer.returncode == ExitCode.FAILURE
    assert one_line(answer.stderr).startswith(f"filemq: cannot read {closed}/api/status")
    for bad in ("tcp://127.0.0.1:5670", "http://", "http://host:port", "127.0.0.1:9465"):
        answer = status(bad)
        assert answer.returncode == ExitCode.USAGE, (bad, answer.stderr)
        assert "http://HOST:PORT" in one_line(answer.stderr)
    with stranger(200) as url:
        answer = status(url)
        assert answer.returncode == ExitCode.FAILURE
        assert "not a zerohub status" in one_line(answer.stderr)
        assert status(url, "--timeout", "0").returncode == ExitCode.USAGE
    with stranger(421) as url:
        answer = status(url)
        assert answer.returncode == ExitCode.REFUSED
        assert "refused the request (HTTP 421)" in one_line(answer.stderr)
    with stranger(500) as url:
        answer = status(url)
        assert answer.returncode == ExitCode.FAILURE
        assert one_line(answer.stderr) == f"filemq: {url}/api/status: HTTP 500"
