"""Shared fixtures: ZeroMQ contexts that must end clean, loopback endpoints, leak checks;
the two-door broker of ``tests.stomp.two_doors`` as a plugin."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from zmq.utils.garbage import GarbageCollectorThread

# ``broker``, ``tmqp``, ``stomp_client``: one engine behind a TMQP and a STOMP door
pytest_plugins = ("tests.stomp.two_doors",)


@pytest.fixture
def zctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    """A private ZeroMQ context; the test fails if sockets are left open."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.term() if _wait_closed(ctx) else pytest.fail("sockets left open on the test's context")


def _wait_closed(ctx: zmq.Context[zmq.Socket[bytes]], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [s for s in ctx._sockets if not s.closed]:  # type: ignore[attr-defined]
            return True
        time.sleep(0.01)
    for sock in list(ctx._sockets):  # type: ignore[attr-defined]
        sock.close(linger=0)
    ctx.term()
    return False


@pytest.fixture
def loopback() -> str:
    """Endpoint to bind: an OS-chosen port on 127.0.0.1 (read LAST_ENDPOINT after bind)."""
    return "tcp://127.0.0.1:*"


@pytest.fixture(autouse=True)
def no_thread_leaks() -> Iterator[None]:
    """Every thread a test starts must be stopped by the end of the test."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        # (pyzmq's one garbage-collector thread, started by the first zero-copy send of
        # the process, lives as long as the process: not a test's leak)
        extra = [t for t in extra if not isinstance(t, GarbageCollectorThread)]
        if not extra:
            return
        time.sleep(0.02)
    names = ", ".join(t.name for t in extra)
    pytest.fail(f"threads left running: {names}")


_data_homes = itertools.count(1)


@pytest.fixture(scope="session", autouse=True)
def private_data_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``broker serve`` keeps its data under ``$XDG_DATA_HOME`` by default: no test may
    write into the real home.  The whole session (module fixtures included) gets a temp
    ``XDG_DATA_HOME``; :func:`own_data_home` gives each test its own below it."""
    base = tmp_path_factory.mktemp("xdg-data")
    before = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(base / "session")
    yield base
    if before is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = before


@pytest.fixture(autouse=True)
def own_data_home(private_data_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's brokers keep their default data apart from every other test's (a
    directory is locked by one broker, and definitions would leak between tests)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(private_data_home / f"t{next(_data_homes)}"))
