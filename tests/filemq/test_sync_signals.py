"""``filemq sync`` as a daemon (no ``--once``) takes SIGTERM/SIGINT from its start.

Was: it installed its handlers only once its client was made (imports, a ZeroMQ
context, patterns read), and said nothing when it was up: a SIGTERM in between killed
it (exit -15, DEST's lock and the index not saved).  Now the handlers come first, a
signal before the client exists stops the client as soon as it is made, and a line
says it is up.  Real processes; waits poll with deadlines.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

from filemq.server import FileServer

from . import test_subscribe_cli
from .conftest import write_tree
from .test_relay import STOP_WAIT
from .test_subscribe_cli import WAIT, Proc, files

procs = test_subscribe_cli.procs  # the fixture: every process started is killed at the end

READY = r"filemq: syncing (\S+) into (\S+) until stopped"

# ``filemq`` whose client is made only once the file named first exists: it says so
# on stderr and waits there (a slow start-up, as on a loaded machine, held open until the
# test has sent its signal: the signal is pending or taken before the file is seen).
HELD_START = """
import os, sys, time
import filemq.client
flag = sys.argv.pop(1)
made = filemq.client.SyncClient.__init__
def held(self, *args, **kwargs):
    print("making the client", file=sys.stderr, flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    made(self, *args, **kwargs)
filemq.client.SyncClient.__init__ = held
from filemq.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write_tree(src, {"a.txt": b"alpha", "d/b.txt": b"beta"})
    return src


def test_a_sigterm_as_soon_as_sync_says_it_is_up_stops_it_cleanly(
    tmp_path: Path, procs: list[Proc], serve: Callable[..., FileServer]
) -> None:
    server = serve(_source(tmp_path))
    dest = tmp_path / "dest"
    proc = Proc(tmp_path, "sync", "sync", server.endpoint, str(dest))
    procs.append(proc)
    ready = proc.wait_stderr(READY)
    assert ready.groups() == (server.endpoint + "/", str(dest))
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(STOP_WAIT) == 0, proc.stderr()
    assert "Traceback" not in proc.stderr()
    again = Proc(tmp_path, "again", "sync", server.endpoint, str(dest), "--once")
    procs.append(again)  # DEST's lock was let go
    assert again.popen.wait(WAIT) == 0, again.stderr()
    assert files(dest) == files(tmp_path / "src")


def test_a_sigterm_while_sync_starts_stops_it_cleanly(
    tmp_path: Path, procs: list[Proc], serve: Callable[..., FileServer]
) -> None:
    server = serve(_source(tmp_path))
    held = tmp_path / "go-on"
    proc = Proc(
        tmp_path, "held", "sync", server.endpoint, str(tmp_path / "dest"),
        program=[sys.executable, "-c", HELD_START, str(held)],
    )  # fmt: skip
    procs.append(proc)
    proc.wait_stderr("making the client")
    proc.popen.send_signal(signal.SIGTERM)
    held.touch()  # (after the signal: it came while the client was being made)
    assert proc.popen.wait(STOP_WAIT) == 0, proc.stderr()
    assert "Traceback" not in proc.stderr()
    assert "syncing" in proc.stderr()  # it still said it was up, then stopped


def test_sync_once_prints_no_readiness_line(
    tmp_path: Path, procs: list[Proc], serve: Callable[..., FileServer]
) -> None:
    server = serve(_source(tmp_path))
    proc = Proc(tmp_path, "once", "sync", server.endpoint, str(tmp_path / "dest"), "--once")
    procs.append(proc)
    assert proc.popen.wait(WAIT) == 0, proc.stderr()
    assert "until stopped" not in proc.stderr()
