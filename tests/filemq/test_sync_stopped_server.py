"""A FILEMQ sync against a ``filemq serve`` process stopped (SIGSTOP) mid-handshake.

The stopped server's kernel accepts the connection; the client's greeting goes unanswered
until its handshake timer (shortened here through the client's context: libzmq's default
is 30 s) ends that connection and libzmq dials again.  Stopped for good: the sync gives up
at its connect timeout with "no answer"; resumed: the sync completes.

Was (session 13): the timer's failure without detail read as "the server requires CURVE"
(``SyncRefused``) at the first expiry.  The plain client against a real CURVE server
(one line on stderr, no lost connection first): ``test_cli_safety.py``.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import pytest
import zmq

from filemq.client import SyncClient, SyncError, SyncRefused
from tests.polling import WAIT, wait_until
from tests.zerohub.support import dialled_ports, stop_process

from .conftest import read_tree, write_tree
from .test_cli import _start_server, processes

__all__ = ["processes"]  # the fixture, used by name

Ctx = zmq.Context[zmq.Socket[bytes]]
_HANDSHAKE_IVL_MS = 200  # the client's handshake timer: expires while the server is stopped


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_a_server_stopped_past_the_timeout_is_no_answer_not_curve(
    tmp_path: Path, processes: list[subprocess.Popen[str]], zctx: Ctx
) -> None:
    write_tree(tmp_path / "src", {"a": b"a"})
    proc, endpoint = _start_server(tmp_path, processes, "--publish", str(tmp_path / "src"))
    zctx.setsockopt(zmq.HANDSHAKE_IVL, _HANDSHAKE_IVL_MS)
    timeout = 10 * _HANDSHAKE_IVL_MS / 1000
    client = SyncClient(
        zctx, endpoint, tmp_path / "d", once=True, connect_timeout=timeout, max_retries=0
    )
    before = dialled_ports(_port(endpoint))
    stop_process(proc)
    try:
        with pytest.raises(SyncError) as failed:
            client.run()
    finally:
        proc.send_signal(signal.SIGCONT)
    assert not isinstance(failed.value, SyncRefused)
    assert (
        str(failed.value) == f"no answer from {endpoint} in {timeout:g} s (is the server running?)"
    )
    assert len(dialled_ports(_port(endpoint)) - before) >= 2  # (the timer ended a handshake)
    assert read_tree(tmp_path / "d") == {}


def test_a_sync_outlives_a_server_stopped_mid_handshake(
    tmp_path: Path, processes: list[subprocess.Popen[str]], zctx: Ctx
) -> None:
    write_tree(tmp_path / "src", {"a": b"a", "b/c": b"c" * 1000})
    proc, endpoint = _start_server(tmp_path, processes, "--publish", str(tmp_path / "src"))
    zctx.setsockopt(zmq.HANDSHAKE_IVL, _HANDSHAKE_IVL_MS)
    client = SyncClient(
        zctx, endpoint, tmp_path / "d", once=True, connect_timeout=WAIT * 12, max_retries=0
    )
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(client.run())
        except BaseException as exc:  # (kept for the assertion)
            outcome.append(exc)

    port = _port(endpoint)
    before = dialled_ports(port)
    stop_process(proc)
    try:
        worker = threading.Thread(target=run)
        worker.start()
        seen: set[int] = set()

        def redialled() -> bool:
            seen.update(dialled_ports(port) - before)
            return len(seen) >= 2 or bool(outcome)

        assert wait_until(redialled, WAIT * 3)
    finally:
        proc.send_signal(signal.SIGCONT)
    worker.join(WAIT * 13)
    assert not worker.is_alive()
    assert not isinstance(outcome[0], BaseException), outcome[0]
    assert read_tree(tmp_path / "d") == {"a": b"a", "b/c": b"c" * 1000}
