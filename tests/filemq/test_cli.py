"""The ``filemq`` command line in real processes: keys, serve, sync (plain and CURVE)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import read_tree, write_tree
from .procs import read_endpoint

FILEMQ = [sys.executable, "-m", "filemq"]


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stderr:
            p.stderr.close()


def _start_server(
    tmp_path: Path, procs: list[subprocess.Popen[str]], *args: str
) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*FILEMQ, "serve", "--bind", "tcp://127.0.0.1:*", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
    )
    procs.append(proc)
    assert proc.stderr is not None
    # (line by line: a select() on the pipe misses lines already in the reader's buffer)
    endpoint = read_endpoint(proc.stderr)
    assert endpoint, "server did not report its endpoint"
    return proc, endpoint


def _sync(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FILEMQ, "sync", *args], capture_output=True, text=True, timeout=60, env=_env(tmp_path)
    )


def test_serve_and_sync_once(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    tree = {"a.txt": b"hello", "d/e/f.bin": os.urandom(100_000), "empty": b""}
    write_tree(tmp_path / "src", tree)
    write_tree(tmp_path / "docs", {"readme": b"docs"})
    proc, endpoint = _start_server(
        tmp_path,
        processes,
        "--publish",
        str(tmp_path / "src"),
        "--publish",
        f"{tmp_path / 'docs'}:/docs",
    )
    done = _sync(tmp_path, endpoint, str(tmp_path / "dest"), "--once", "--path", "/docs")
    assert done.returncode == 0, done.stderr
    assert read_tree(tmp_path / "dest") == {"readme": b"docs"}
    done = _sync(tmp_path, endpoint, str(tmp_path / "all"), "--once")
    assert done.returncode == 0, done.stderr
    assert read_tree(tmp_path / "all") == {**tree, "docs/readme": b"docs"}
    assert "4 files (100009 bytes) received" in done.stderr  # a summary, not a line per file
    assert "received d/e/f.bin" not in done.stderr
    done = subprocess.run(
        [*FILEMQ, "-v", "sync", endpoint, str(tmp_path / "verbose"), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert "received d/e/f.bin" in done.stderr  # -v, not a TTY: a log line per file
    assert list((tmp_path / "cache" / "filemq" / "mirrors").glob("*.idx"))  # index kept
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_curve_via_cli(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    for name in ("server", "client", "stranger"):
        made = subprocess.run(
            [*FILEMQ, "keys", "new", name, "--dir", str(keys)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert made.returncode == 0, made.stderr
    assert (keys / "client.key").exists() and (keys / "client.key_secret").exists()
    allowed.mkdir()
    (allowed / "client.key").write_bytes((keys / "client.key").read_bytes())
    write_tree(tmp_path / "src", {"s": b"secret"})
    _proc, endpoint = _start_server(
        tmp_path,
        processes,
        "--publish",
        str(tmp_path / "src"),
        "--curve-secret",
        str(keys / "server.key_secret"),
        "--allow",
        str(allowed),
    )
    ok = _sync(
        tmp_path,
        endpoint,
        str(tmp_path / "ok"),
        "--once",
        "--no-index",
        "--server-key",
        str(keys / "server.key"),
        "--curve-secret",
        str(keys / "client.key_secret"),
    )
    assert ok.returncode == 0, ok.stderr
    assert read_tree(tmp_path / "ok") == {"s": b"secret"}
    denied = _sync(
        tmp_path,
        endpoint,
        str(tmp_path / "no"),
        "--once",
        "--no-index",
        "--server-key",
        str(keys / "server.key"),
        "--curve-secret",
        str(keys / "stranger.key_secret"),
    )
    assert denied.returncode == 3 and "key not allowed" in denied.stderr
    assert read_tree(tmp_path / "no") == {}


def test_insecure_bind_refused_and_no_server(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    refused = subprocess.run(
        [*FILEMQ, "serve", "--bind", "tcp://0.0.0.0:*", "--publish", str(tmp_path / "src")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2 and "--insecure" in refused.stderr  # usage: nothing ran
    nobody = _sync(
        tmp_path,
        "tcp://127.0.0.1:1",
        str(tmp_path / "d"),
        "--once",
        "--no-index",
        "--timeout",
        "0.3",
        "--retries",
        "0",
    )
    assert nobody.returncode == 1
