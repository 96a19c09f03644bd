"""The private parts of ``concurrent.futures._base`` the lean client future relies on,
pinned by name, and the fallback to the plain ``concurrent.futures.Future`` when they are
not there (``broker.client.future``).

An upgrade of Python that renames or reshapes one of them fails
``test_the_relied_on_internal_is_there`` for that name.  The fallback is forced for real in
a child process (its standard library changed before the client is imported) that then
pushes acknowledged messages to a ``broker serve`` process and reads their futures through
``result``, ``wait`` and ``as_completed``.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import subprocess
import sys
import threading
import types
from collections.abc import Callable
from concurrent.futures import _base
from typing import Any

import pytest

from broker.client import future as chooser
from broker.client.lean_future import LeanFuture
from tests.broker.test_durable_serve import Broker
from tests.polling import WAIT

# Each relied-on internal with a check written here, apart from the module's own check
# (an oracle that does not share its bugs).
PINNED: dict[str, Callable[[], bool]] = {
    **{
        f"concurrent.futures._base.{name}": (
            lambda name=name: isinstance(getattr(_base, name, None), str)
        )
        for name in ("PENDING", "RUNNING", "CANCELLED", "CANCELLED_AND_NOTIFIED", "FINISHED")
    },
    "concurrent.futures._base.LOGGER": lambda: isinstance(_base.LOGGER, logging.Logger),
    "concurrent.futures.Future()._state": lambda: cf.Future()._state == _base.PENDING,
    "concurrent.futures.Future()._waiters": lambda: cf.Future()._waiters == [],
    "concurrent.futures.Future()._condition": (
        lambda: isinstance(cf.Future()._condition, type(threading.Condition()))
    ),
    **{
        f"concurrent.futures._base._Waiter.{name}": (
            lambda name=name: callable(getattr(_base._Waiter, name, None))
        )
        for name in ("add_result", "add_exception", "add_cancelled")
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_relied_on_internal_is_there(name: str) -> None:
    assert PINNED[name](), f"{name} changed: broker.client.future falls back to the plain Future"


def test_the_module_names_exactly_the_pinned_internals() -> None:
    """A reliance added to the module without a pin here (or the reverse) fails."""
    assert sorted(chooser.RELIED_ON) == sorted(PINNED)


def test_this_python_gets_the_lean_future() -> None:
    assert chooser.PROBLEMS == []
    assert chooser.internals_problems(_base) == [] and chooser.probe_problems(LeanFuture) == []
    assert chooser.ClientFuture is LeanFuture


def test_the_check_names_each_internal_that_is_missing() -> None:
    changed = types.SimpleNamespace(**vars(_base))
    del changed.CANCELLED_AND_NOTIFIED
    changed.LOGGER = print
    changed._Waiter = type("_Waiter", (), {"add_result": lambda self, f: None})
    assert chooser.internals_problems(changed) == [
        "concurrent.futures._base.CANCELLED_AND_NOTIFIED is not a str state",
        "concurrent.futures._base.LOGGER is not a logging.Logger",
        "concurrent.futures._base._Waiter.add_exception is not a method",
        "concurrent.futures._base._Waiter.add_cancelled is not a method",
    ]
    assert chooser.internals_problems(None) == ["concurrent.futures._base cannot be imported"]


def test_the_probe_refuses_a_future_whose_settling_does_not_wake_wait() -> None:
    class Deaf(LeanFuture):
        def set_result(self, result: Any) -> None:
            with self._lock:
                self._result = result
                self._state = _base.FINISHED  # (its waiters are never told)

    assert chooser.probe_problems(Deaf) == [
        "settling the lean future does not wake concurrent.futures.wait"
    ]
    assert chooser.probe_problems(cf.Future) == []  # (the plain future passes it)


# The child: changes one relied-on internal (LOGGER, which the plain future only uses to
# log a callback's error), imports the client, pushes acknowledged messages to the broker
# at argv[1] and reports what it saw.
_CHILD = """
import concurrent.futures as cf, json, logging, sys
from concurrent.futures import _base
_base.LOGGER = "not a logger"
logging.basicConfig(level=logging.WARNING)
from broker.client.blocking import Client
from broker.client import future as chooser
from broker.client.lean_future import LeanFuture

seen = {"problems": chooser.PROBLEMS, "plain": chooser.ClientFuture is cf.Future}
with Client(sys.argv[1], timeout=30).connect() as client:
    client.create_queue("fb", 1, {"Status": 3})
    client.join("fb")
    futures = [client.push_async("fb", 1, b"m%d" % i) for i in range(50)]
    futures += client.push_many_async("fb", 1, [b"b%d" % i for i in range(50)])
    seen["types"] = sorted({type(f).__name__ for f in futures})
    seen["lean"] = any(isinstance(f, LeanFuture) for f in futures)
    first = cf.wait(futures, timeout=30, return_when=cf.FIRST_COMPLETED)
    seen["first"] = len(first.done) >= 1
    done, pending = cf.wait(futures, timeout=30)
    seen["done"], seen["pending"] = len(done), len(pending)
    ok = [f for f in cf.as_completed(futures, timeout=30) if f.exception() is None]
    seen["completed"] = len(ok)
    seen["ids"] = len({f.result(30).message_id for f in futures})
    pulled = []
    while batch := client.pull("fb", 1, count=100, timeout=30):
        pulled += [bytes(m.payload).decode() for m in batch]
    seen["pulled"] = pulled
print(json.dumps(seen))
"""


def _child(code: str, endpoint: str) -> tuple[dict[str, Any], str]:
    """Run ``code`` in a child process against the broker at ``endpoint``: what it
    printed (JSON) and its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", code, endpoint], capture_output=True, text=True, timeout=WAIT * 6
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_a_changed_standard_library_falls_back_to_the_plain_future(served: Broker) -> None:
    seen, stderr = _child(_CHILD, served.endpoint)
    assert seen["problems"] == ["concurrent.futures._base.LOGGER is not a logging.Logger"]
    assert seen["plain"] and seen["types"] == ["Future"] and not seen["lean"]
    assert "the client's futures are plain concurrent.futures.Future" in stderr
    assert seen["first"] and (seen["done"], seen["pending"]) == (100, 0)
    assert seen["completed"] == 100 and seen["ids"] == 100
    assert seen["pulled"] == [f"m{i}" for i in range(50)] + [f"b{i}" for i in range(50)]


# The child: counts the calls of concurrent.futures.wait (the probe's) from before the
# client is imported, then reports when the choice is made: not at import, not by a
# poll-on-call client's requests (its futures are its own), at a threaded client's first
# request (an acknowledged push).
_FIRST_USE = """
import concurrent.futures as cf, json, sys
calls = []
real = cf.wait
def counted(*args, **kwargs):
    calls.append(1)
    return real(*args, **kwargs)
cf.wait = counted
from broker.client.blocking import Client
from broker.client import future as chooser
chosen = lambda: "ClientFuture" in vars(chooser)
seen = {"import": [chosen(), len(calls)]}
with Client(sys.argv[1], timeout=30, threaded=False).connect() as client:
    client.create_queue("fu", 1, {"Status": 3})
    client.push("fu", 1, b"p", ack=True)
    seen["poll-on-call"] = [chosen(), len(calls)]
with Client(sys.argv[1], timeout=30).connect() as client:
    seen["threaded connect"] = [chosen(), len(calls)]
    future = client.push_async("fu", 1, b"t")
    seen["first push"] = [chosen(), len(calls), type(future).__name__]
    future.result(30)
    client.push("fu", 1, b"u", ack=True)
    seen["second push"] = [chosen(), len(calls)]
print(json.dumps(seen))
"""


def test_the_choice_is_made_at_the_threaded_clients_first_request_not_at_import(
    served: Broker,
) -> None:
    seen, _ = _child(_FIRST_USE, served.endpoint)
    assert seen["import"] == [False, 0]
    assert seen["poll-on-call"] == [False, 0]
    assert seen["threaded connect"] == [False, 0]  # (the handshake needs no future)
    assert seen["first push"] == [True, 1, "LeanFuture"]
    assert seen["second push"] == [True, 1]  # (once per process)
