"""``python -m broker.stomp``: one line on start, one line and a documented code on error."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from tests.polling import WAIT

CMD = [sys.executable, "-m", "broker.stomp"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--bind", "nonsense"], "expected tcp://HOST:PORT"),
        (["--bind", "tcp://0.0.0.0:0"], "needs --tls-cert/--tls-key or --insecure"),
        (["--tls-cert", "x.pem"], "go together"),
        (["--ws", "ws://10.0.0.1:1"], "same host"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str], match: str) -> None:
    done = run_cli(*args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and match in done.stderr
    assert "Traceback" not in done.stderr


def test_port_in_use_is_one_line_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("--bind", f"tcp://127.0.0.1:{port}")
    assert done.returncode == 1
    assert done.stderr.startswith("python -m broker.stomp: cannot listen on 127.0.0.1:")
    assert done.stderr.count("\n") == 1


def test_serves_then_stops_on_sigterm_with_0() -> None:
    proc = subprocess.Popen(
        [*CMD, "--bind", "tcp://127.0.0.1:0", "--ws", "ws://127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on tcp://127.0.0.1:") and " and ws://" in line
        port = int(line.split()[2].rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
            assert sock.recv(4096).startswith(b"CONNECTED\n")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
