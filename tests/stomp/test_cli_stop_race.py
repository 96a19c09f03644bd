"""``python -m broker.stomp`` stops on a SIGTERM that comes at the unluckiest moment.

A signal's Python handler runs in the main thread between two bytecodes, wherever that
thread is.  The listener's handler used to set a ``threading.Event`` that the main
thread was waiting on: a SIGTERM arriving while the main thread was entering that wait,
holding the Event's own lock, made the handler wait for that lock for ever (the process
never exited; at load ~8-20 it missed the 10 s exit wait of ``test_cli.py`` once).  A
loaded machine decides that moment; here the child sends itself SIGTERM exactly then:
from inside the first ``Condition.wait`` its main thread makes once the handlers are in.
"""

from __future__ import annotations

import subprocess
import sys
from subprocess import PIPE

from tests.polling import WAIT, wait_until

_CHILD = """
import os, signal, sys, threading

plain_wait = threading.Condition.wait
fired = []

def wait(self, timeout=None):
    # the caller holds the lock this Condition waits on (Event.wait does): SIGTERM now
    if (
        not fired
        and threading.current_thread() is threading.main_thread()
        and callable(signal.getsignal(signal.SIGTERM))
    ):
        fired.append(True)
        os.kill(os.getpid(), signal.SIGTERM)
    return plain_wait(self, timeout)

threading.Condition.wait = wait
from broker.stomp.cli import main
sys.exit(main(["--bind", "tcp://127.0.0.1:0"]))
"""


def test_a_sigterm_while_the_main_thread_holds_a_lock_still_stops_it_with_0() -> None:
    child = [sys.executable, "-c", _CHILD]
    with subprocess.Popen(child, stdout=PIPE, stderr=PIPE, text=True) as proc:  # (closes, waits)
        try:
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.readline().startswith("listening on tcp://127.0.0.1:")
            # a deadline, not a window: the stop itself is ~0.05 CPU s (a process's start
            # took 25-35 s at load 40-60)
            assert wait_until(lambda: proc.poll() is not None, WAIT * 6), "it never exited"
            assert proc.returncode == 0
            assert proc.stderr.read() == "python -m broker.stomp: stopping (SIGTERM)\n"
        finally:
            if proc.poll() is None:
                proc.kill()
