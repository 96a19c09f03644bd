"""The ``broker`` command line: a real ``broker serve`` process, client commands in-process."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.cli import main
from tests.ports import free_port  # (the one rule: tests/ports.py; kept importable here)


def start_serve(*args: str) -> subprocess.Popen[bytes]:
    """``broker serve ARGS`` started and ready; memory only unless ``--data`` is given."""
    if "--data" not in args:
        args = (*args, "--data", "none")
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "serve", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    assert proc.stderr is not None
    # a deadline, not a delay: at load 40-60 on 2 cores a Python process's start alone
    # took 25-35 s (15 s here failed the FILEMQ events tests: 'did not start: b''')
    deadline = time.monotonic() + 60
    line = b""
    while time.monotonic() < deadline and b"broker serving on" not in line:
        ready, _, _ = select.select([proc.stderr], [], [], 0.1)
        if ready:
            chunk = os.read(proc.stderr.fileno(), 4096)
            if not chunk:
                break
            line += chunk
    if b"broker serving on" not in line:  # warnings (a damaged store...) may come first
        proc.kill()
        proc.wait(5)
        pytest.fail(f"broker serve did not start: {line!r}")
    return proc


def stop_serve(proc: subprocess.Popen[bytes], wait: float = 10.0) -> int:
    """Stop a :func:`start_serve` process: SIGTERM, then a kill if it has not exited
    within ``wait`` seconds (it never outlives the test, a failed one included); its
    stderr pipe closed.  Returns its exit code (the kill's when it came to that)."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(wait)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(wait)
        return proc.returncode
    finally:
        if proc.poll() is None:  # (the wait raised something else: killed all the same)
            proc.kill()
            proc.wait(wait)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = free_port()
    proc = start_serve("--bind", f"tcp://127.0.0.1:{port}")
    yield f"tcp://127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_admin_push_pull_round(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    c = ("--connect", endpoint)
    assert (
        run(capsys, "admin", *c, "create", "cli-jobs", "4", "--options", '{"Status": 3}')[0] == 0
    )
    code, out, _ = run(capsys, "push", *c, "cli-jobs", "4", "hello", "--ack", "--count", "2")
    assert code == 0 and len(out.split()) == 2  # one message id per acknowledged push
    code, out, _ = run(capsys, "pull", *c, "cli-jobs", "4", "--count", "5")
    assert code == 0 and out == "hello\nhello\n"
    code, out, _ = run(capsys, "admin", *c, "info", "cli-jobs", "4")
    assert code == 0 and json.loads(out)["Status"] == "Pull"
    code, out, _ = run(capsys, "admin", *c, "list")
    assert any(ch["Name"] == "cli-jobs" for ch in json.loads(out))
    code, out, _ = run(capsys, "admin", *c, "list", "cli-jobs")
    assert [q["Id"] for q in json.loads(out)] == [4]
    assert run(capsys, "admin", *c, "delete", "cli-jobs")[0] == 0


def test_push_from_stdin_and_consume(
    endpoint: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = ("--connect", endpoint)
    assert (
        run(capsys, "admin", *c, "create", "cli-feed", "1", "--options", '{"Status": 1}')[0] == 0
    )
    # a push queue keeps messages until a consumer joins
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from stdin")))
    assert run(capsys, "push", *c, "cli-feed", "1", "-", "--ack")[0] == 0
    code, out, _ = run(capsys, "consume", *c, "cli-feed", "--count", "1", "--json", "--wait", "5")
    record = json.loads(out)
    assert code == 0 and record["payload"] == "from stdin" and record["kind"] == "queue"


def test_stats(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "stats", "--connect", endpoint)
    stats = json.loads(out)
    assert code == 0 and "frames_in" in stats["server"] and "clients" in stats["engine"]


def test_output_to_a_closed_pipe_exits_quietly(endpoint: str) -> None:
    # ``broker stats | head -3``: the reader is gone before the first line is written
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "broker", "stats", "--connect", endpoint],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=30,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == b""  # no BrokenPipeError traceback, no "Exception ignored"
    assert proc.returncode == 141


def test_remote_error_exit_status(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "admin", "--connect", endpoint, "info", "no-such-channel")
    assert code == 1 and "status 404" in err


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"server": {"port": 1}}')
    code, _, err = run(capsys, "serve", "--config", str(bad))
    assert code == 2 and "unknown keys" in err
    code, _, err = run(capsys, "serve", "--bind", "tcp://0.0.0.0:0")
    assert code == 2 and "without CURVE" in err
    code, _, err = run(capsys, "admin", "--connect", "tcp://127.0.0.1:1", "update", "x")
    assert code == 2 and "--options" in err
    # rules are per channel join: a pattern with them is refused before any connection
    for rule in (("--selector", "a > 1"), ("--credit", "3,100")):
        code, _, err = run(capsys, "consume", "--connect", "tcp://127.0.0.1:1", "--pattern",
                             "o.*", *rule)  # fmt: skip
        assert code == 2 and "not to --pattern" in err and len(err.strip().splitlines()) == 1


def test_serve_with_a_toml_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[server]\nbind = "tcp://127.0.0.1:{port}"\n'
        '[broker]\nnode_name = "cli-node"\nauto_create_channel = false\n'
        '[tokens]\nadmin = "all"\n'
    )
    proc = start_serve("--config", str(config))
    try:
        c = ("--connect", f"tcp://127.0.0.1:{port}", "--token", "admin")
        code, out, _ = run(capsys, "stats", *c)
        assert code == 0 and json.loads(out)["engine"]["node"] == "cli-node"
        code, _, err = run(capsys, "push", "--connect", c[1], "--token", "nope", "x", "1", "y")
        assert code == 3 and "refused" in err  # access refused
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_consume_stops_on_sigterm_with_one_line(
    endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # SIGTERM used to raise KeyboardInterrupt wherever the main thread was (it can be
    # dropped inside a ZeroMQ frame's finaliser); now it asks for a stop: exit 0, one line.
    c = ("--connect", endpoint)
    assert (
        run(capsys, "admin", *c, "create", "cli-term", "1", "--options", '{"Status": 1}')[0] == 0
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "consume", *c, "cli-term"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        # pushed until the consumer has joined and printed one (a push queue keeps them)
        assert run(capsys, "push", *c, "cli-term", "1", "first", "--ack")[0] == 0
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready and proc.stdout.readline() == b"first\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        _, err = proc.communicate(5)
        assert err.decode().splitlines() == ["broker consume: stopping (SIGTERM)"], err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
