"""Running the zerohub command lines as real processes, peers that never answer, and the
connections a client dialled."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.polling import wait_until

WAIT = 30.0  # generous deadline for anything a test waits for


def cli(
    prog: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m PROG ARGS`` to its end."""
    return subprocess.run(
        [sys.executable, "-m", prog, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        check=False,
    )


def one_line(stderr: str) -> str:
    """The single line a failing command printed (fails the test on anything else)."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    return lines[0]


def _threads_stopped(pid: int) -> bool:
    """Every thread of process ``pid`` is in the stopped state ("T" in its ``stat``)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
        states = []
        for tid in threads:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
    except FileNotFoundError:  # (the process, or a thread, ended meanwhile)
        return False
    return all(state == "T" for state in states)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGSTOP ``proc`` and wait until every thread of it has stopped.

    ``kill`` returns with the signal pending: the kernel wakes one thread (the main one,
    a server's waiting for its stop signal) to take it, and only when that thread has run
    are the others stopped.  Under load that took 10-30 ms, and meanwhile the server's
    own threads answered a client dialling it: a FILEMQ sync subscribed (then waited 30 s
    for a silent server) or even completed (session 15, 1 test run in 6 at load 6-20).
    """
    proc.send_signal(signal.SIGSTOP)
    assert wait_until(lambda: _threads_stopped(proc.pid), WAIT), f"{proc.args} never stopped"


def dialled_ports(server_port: int) -> set[int]:
    """The local ports of this machine's TCP connections to ``server_port`` on loopback
    (``/proc/net/tcp``: each connection the client dialled, kept there in TIME_WAIT)."""
    ports = set()
    with open("/proc/net/tcp") as table:
        next(table)  # (the header)
        for row in table:
            local, remote = row.split()[1:3]
            if remote == f"0100007F:{server_port:04X}":
                ports.add(int(local.split(":")[1], 16))
    return ports


class SilentPeer:
    """A TCP listener on loopback that accepts connections and never says a word.

    To a ZeroMQ client it is a server that never answers its greeting; accepting a
    connection is the sign that the client is connecting (no sleep needed).
    """

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = int(self.listener.getsockname()[1])
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.accepted: list[socket.socket] = []

    def wait_connection(self, timeout: float = WAIT) -> None:
        ready, _, _ = select.select([self.listener], [], [], timeout)
        assert ready, "nobody connected"
        conn, _addr = self.listener.accept()
        self.accepted.append(conn)

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.listener.close()


@contextmanager
def silent_peer() -> Iterator[SilentPeer]:
    peer = SilentPeer()
    try:
        yield peer
    finally:
        peer.close()


class GreetingPeer:
    """A TCP listener on loopback whose thread treats the n-th connection (from 0) as
    ``answers(n)`` says: ``"silent"`` holds it open and never writes (a stopped server),
    ``"hang up"`` reads the ZMTP signature and closes it (as a CURVE server may do to a
    plain client's greeting)."""

    def __init__(self, answers: Callable[[int], str]) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.05)
        self.endpoint = f"tcp://127.0.0.1:{self.server.getsockname()[1]}"
        self.answers = answers
        self.accepted = 0
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            answer = self.answers(self.accepted)
            self.accepted += 1
            if answer == "silent":
                self.held.append(conn)
                continue
            with conn:
                conn.settimeout(WAIT)
                conn.recv(10)  # (the signature: a ZMTP peer did reach us)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(WAIT)
        for conn in self.held:
            conn.close()
        self.server.close()


def ctrl_c_reaches_it() -> None:
    """``preexec_fn``: SIGINT back to its default in the child, as in a foreground job.

    A suite run as a background job of a shell script (``pytest ... &``) has SIGINT
    ignored, children inherit that, and Python then leaves it ignored: the child never
    saw the test's Ctrl-C (the test hung until its deadline, "flaky under load" because
    loaded runs were the ones started in the background).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_while_connecting(prog: str, *args: str, env: Mapping[str, str] | None = None) -> str:
    """Start ``PROG ARGS`` against a silent peer (``{endpoint}`` in ARGS), SIGINT it once
    it is connecting; returns the one line it printed (and checks exit status 130)."""
    with silent_peer() as peer:
        argv = [a.replace("{endpoint}", peer.endpoint) for a in args]
        proc = subprocess.Popen(
            [sys.executable, "-m", prog, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=ctrl_c_reaches_it,
        )
        try:
            peer.wait_connection()
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=WAIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 130, (proc.returncode, err)
    assert out == ""
    return one_line(err)


def run_into_closed_pipe(
    prog: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = WAIT
) -> subprocess.CompletedProcess[bytes]:
    """Run ``PROG ARGS`` with stdout a pipe whose reader is already gone (``| head``)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", prog, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            check=False,
        )
    finally:
        os.close(write_end)
