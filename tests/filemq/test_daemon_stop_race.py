"""A ``filemq sync`` daemon stops on a SIGTERM that comes at the unluckiest moment.

A signal's Python handler runs in the main thread between two bytecodes, wherever that
thread is.  The daemon's handler calls the mirror's ``stop()``, which sets a
``threading.Event``; the mirror waited between reconnects with that Event's ``wait``,
which holds the Event's own lock while it begins to wait: a SIGTERM arriving then made
``set()`` wait for that lock for ever (the daemon never exited).  A loaded machine
decides that moment; here the child sends itself SIGTERM exactly then (from inside the
wait on the mirror's stop Event, if the mirror ever waits on it), after its server was
killed so that it waits to reconnect.  The parent sends SIGTERM too once the child says
it is waiting (the child waits without that Event now).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.polling import WAIT, wait_until

from .conftest import write_tree
from .test_cli import _env, _start_server, processes

__all__ = ["processes"]  # the fixture, used by name

_CHILD = """
import os, signal, sys, threading
import filemq.client as fc

plain_init = fc.SyncClient.__init__
stops = []

def init(self, *args, **kwargs):
    plain_init(self, *args, **kwargs)
    stops.append(self._stop)  # (the Event the daemon's stop() sets)

fc.SyncClient.__init__ = init
plain_wait = threading.Condition.wait
fired = []

def wait(self, timeout=None):
    # the caller holds this Condition's lock (Event.wait does): SIGTERM now
    if not fired and stops and self is stops[0]._cond:
        fired.append(True)
        os.kill(os.getpid(), signal.SIGTERM)
    return plain_wait(self, timeout)

threading.Condition.wait = wait
from filemq.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_sigterm_while_waiting_to_reconnect_stops_the_daemon_with_0(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    write_tree(tmp_path / "src", {"a": b"a"})
    server, endpoint = _start_server(tmp_path, processes, "--publish", str(tmp_path / "src"))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, "-v", "sync", endpoint, str(tmp_path / "d")],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=_env(tmp_path),
    )
    processes.append(child)
    assert child.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(child.stderr.readline, "")))
    reader.start()  # (its lines, read as they come: the waits below are deadlines)
    try:

        def said(words: str) -> bool:
            return any(words in line for line in list(lines))

        assert wait_until(lambda: said("resync of / complete"), WAIT * 6), lines
        server.kill()  # (kill -9: the daemon loses its connection and waits to reconnect)
        server.wait(WAIT)
        assert wait_until(lambda: said("reconnecting to"), WAIT * 6), lines
        child.send_signal(signal.SIGTERM)
        assert wait_until(lambda: child.poll() is not None, WAIT * 6), "it never exited"
        assert child.returncode == 0, lines
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        reader.join(WAIT)
