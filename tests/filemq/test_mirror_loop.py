"""A mirror inside the directory it mirrors is refused; a server never publishes its state."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from filemq.client import SyncResult
from filemq.server import FileServer

from .conftest import read_tree, write_tree
from .procs import read_endpoint

FILEMQ = [sys.executable, "-m", "filemq"]
WAIT = 30.0


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
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()


def _serve(procs: list[subprocess.Popen[str]], pub: Path, *args: str) -> str:
    proc = subprocess.Popen(
        [
            *FILEMQ,
            "serve",
            "--bind",
            "tcp://127.0.0.1:*",
            "--no-state",
            "--publish",
            str(pub),
            *args,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    assert proc.stderr is not None
    endpoint = read_endpoint(proc.stderr)
    assert endpoint, "server did not report its endpoint"
    return endpoint


def _depth(root: Path) -> int:
    """How many 'loop' folders deep the mirror went."""
    depth, path = 0, root
    while (path / "loop").is_dir():
        depth, path = depth + 1, path / "loop"
    return depth


def _run_until_exit(proc: subprocess.Popen[str], pub: Path) -> int:
    """Wait for ``proc`` to end; fail as soon as the copy goes three levels deep."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return code
        assert _depth(pub) < 3, "the mirror keeps copying itself into loop/loop/..."
        time.sleep(0.02)
    raise AssertionError("the mirror did not stop")


@pytest.mark.parametrize("watching", [True, False], ids=["watching", "no-watch"])
@pytest.mark.parametrize("command", ["subscribe", "sync"])
def test_mirror_inside_its_own_published_directory_is_refused(
    tmp_path: Path, processes: list[subprocess.Popen[str]], command: str, watching: bool
) -> None:
    pub = tmp_path / "pub"
    write_tree(pub, {"a.txt": b"a", "d/b.txt": b"b"})
    endpoint = _serve(processes, pub, *(() if watching else ("--no-watch",)))
    args = ["--once"] if command == "sync" else []
    client = subprocess.Popen(
        [*FILEMQ, command, endpoint, str(pub / "loop"), "--no-index", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes.append(client)
    code = _run_until_exit(client, pub)
    assert client.stderr is not None
    err = client.stderr.read()
    assert code == 1, err
    refusals = [line for line in err.splitlines() if "inside the directory it mirrors" in line]
    assert len(refusals) == 1 and "Traceback" not in err, err
    assert _depth(pub) <= 2


def _state_files(tree: dict[str, bytes]) -> list[str]:
    return [name for name in tree if name.startswith(".state/")]


def test_server_state_inside_a_published_directory_is_not_published(
    tmp_path: Path,
    serve: Callable[..., FileServer],
    sync_once: Callable[..., SyncResult],
) -> None:
    pub = tmp_path / "pub"
    write_tree(pub, {"a.txt": b"a"})
    server = serve(pub, state_dir=pub / ".state")
    assert list((pub / ".state").rglob("*.idx"))  # the state is there, inside pub
    result = sync_once(server.endpoint, tmp_path / "dest")
    assert result.synced and read_tree(tmp_path / "dest") == {"a.txt": b"a"}
    server.rescan()
    again = sync_once(server.endpoint, tmp_path / "dest")
    assert again.synced and again.files == 0 and read_tree(tmp_path / "dest") == {"a.txt": b"a"}


def test_change_notices_for_the_server_state_are_ignored(
    tmp_path: Path,
    serve: Callable[..., FileServer],
    sync_once: Callable[..., SyncResult],
) -> None:
    """What a watcher reports about the state folder (the server writes it) is not published."""
    pub = tmp_path / "pub"
    write_tree(pub, {"a.txt": b"a"})
    server = serve(pub, state_dir=pub / ".state", indexes_live=True)
    for saved in (pub / ".state").rglob("*.idx"):
        server.notify_changed("/", saved.relative_to(pub).as_posix())
    (pub / "sentinel").write_bytes(b"s")
    server.notify_changed("/", "sentinel")  # notices are handled in order
    result = sync_once(server.endpoint, tmp_path / "dest")
    got = read_tree(tmp_path / "dest")
    assert result.synced and "sentinel" in got and _state_files(got) == []
