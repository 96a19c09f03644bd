"""Fixtures for the FILEMQ tests: file trees, a running server, a one-shot sync."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq.client import SyncClient, SyncResult
from filemq.mirror import LOCK_NAME
from filemq.server import FileServer, Mount

Tree = dict[str, bytes]


def write_tree(root: Path, tree: Tree) -> None:
    for name, data in tree.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def renamed_over(path: Path) -> None:
    """A new file (new inode) with other contents of the same size and the same mtime
    renamed over ``path``: only its inode tells the change."""
    st = path.stat()
    fresh = path.with_name(path.name + ".new")
    fresh.write_bytes(path.read_bytes().upper())
    os.utime(fresh, ns=(st.st_atime_ns, st.st_mtime_ns))
    fresh.rename(path)


def read_tree(root: Path) -> Tree:
    """Every file under ``root`` (temp files too), but the lock of a mirror running there."""
    out: Tree = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name == LOCK_NAME and dirpath == str(root):
                continue
            path = Path(dirpath) / name
            out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


@pytest.fixture
def serve(zctx: zmq.Context[Any], loopback: str) -> Iterator[Callable[..., FileServer]]:
    """Start a FileServer publishing mounts; stopped at the end of the test."""
    servers: list[FileServer] = []

    def start(*mounts: tuple[Path, str] | Path, **kwargs: Any) -> FileServer:
        parsed = [Mount(m, "/") if isinstance(m, Path) else Mount(m[0], m[1]) for m in mounts]
        kwargs.setdefault("endpoint", loopback)
        server = FileServer(zctx, parsed, **kwargs)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def sync_once(zctx: zmq.Context[Any]) -> Callable[..., SyncResult]:
    """Run one ``--once`` sync in this thread and return its result."""

    def run(endpoint: str, dest: Path, **kwargs: Any) -> SyncResult:
        kwargs.setdefault("once", True)
        kwargs.setdefault("connect_timeout", 5.0)
        kwargs.setdefault("idle_timeout", 5.0)
        return SyncClient(zctx, endpoint, dest, **kwargs).run()

    return run
