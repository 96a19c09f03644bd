"""The threaded client's future class, chosen once at its first use: :data:`ClientFuture`.

The lean future (``broker.client.lean_future.LeanFuture``: no ``threading.Condition`` per
future) leans on private parts of ``concurrent.futures._base`` so that the module's
``wait`` and ``as_completed`` work on it.  This module names them (:data:`RELIED_ON`),
checks at the first use (the threaded client's first request; not at import, which every
CLI start pays) that each is there with the shape the lean future expects
(:func:`internals_problems`), then tries the lean future once against the real
``concurrent.futures.wait`` (:func:`probe_problems`).  When everything fits,
:data:`ClientFuture` is the lean future; when anything does not (another Python, a
changed standard library), it is the plain ``concurrent.futures.Future``: slower to make
and settle, the same behaviour, and :data:`PROBLEMS` says why.  The test
``tests/broker/test_client_future_internals.py`` pins each relied-on part by name, so an
upgrade that changes one fails there, clearly, instead of falling back unnoticed.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

__all__ = ["PROBLEMS", "RELIED_ON", "ClientFuture", "internals_problems", "probe_problems"]

#: The states the lean future sets and compares (``concurrent.futures._base``).
STATE_NAMES = ("PENDING", "RUNNING", "CANCELLED", "CANCELLED_AND_NOTIFIED", "FINISHED")
#: Attributes of a future that ``wait``/``as_completed`` read or change, with their type.
FUTURE_ATTRIBUTES: tuple[tuple[str, type], ...] = (
    ("_state", str),
    ("_waiters", list),
    ("_condition", type(threading.Condition())),
)
#: The methods of the waiters ``wait``/``as_completed`` put in ``_waiters``, which the lean
#: future calls when it is settled or cancelled (``_base._Waiter``).
WAITER_METHODS = ("add_result", "add_exception", "add_cancelled")
#: Everything above, named as an upgrade note would name it.
RELIED_ON = (
    *(f"concurrent.futures._base.{name}" for name in STATE_NAMES),
    "concurrent.futures._base.LOGGER",
    *(f"concurrent.futures.Future().{name}" for name, _ in FUTURE_ATTRIBUTES),
    *(f"concurrent.futures._base._Waiter.{name}" for name in WAITER_METHODS),
)


def internals_problems(base: Any) -> list[str]:
    """What of :data:`RELIED_ON` ``base`` (the module ``concurrent.futures._base``, or
    None when it cannot be imported) lacks or shapes otherwise; empty when all fit."""
    if base is None:
        return ["concurrent.futures._base cannot be imported"]
    problems: list[str] = []
    states = [getattr(base, name, None) for name in STATE_NAMES]
    for name, value in zip(STATE_NAMES, states, strict=True):
        if not isinstance(value, str):
            problems.append(f"concurrent.futures._base.{name} is not a str state")
    if len(set(states)) != len(states):
        problems.append("the states of concurrent.futures._base are not distinct")
    if not isinstance(getattr(base, "LOGGER", None), logging.Logger):
        problems.append("concurrent.futures._base.LOGGER is not a logging.Logger")
    if getattr(base, "Future", None) is not Future:
        problems.append("concurrent.futures._base.Future is not concurrent.futures.Future")
    standard = Future()  # type: ignore[var-annotated]
    for name, kind in FUTURE_ATTRIBUTES:
        if not isinstance(getattr(standard, name, None), kind):
            problems.append(f"concurrent.futures.Future().{name} is not a {kind.__name__}")
    if getattr(standard, "_state", None) != states[0]:
        problems.append("a new concurrent.futures.Future's _state is not PENDING")
    waiter = getattr(base, "_Waiter", None)
    for name in WAITER_METHODS:
        if not callable(getattr(waiter, name, None)):
            problems.append(f"concurrent.futures._base._Waiter.{name} is not a method")
    return problems


class _Recording(list[Any]):
    """A ``_waiters`` list that keeps every waiter ``wait`` installs (for the probe)."""

    def __init__(self) -> None:
        super().__init__()
        self.installed: list[Any] = []

    def append(self, item: Any) -> None:
        self.installed.append(item)
        super().append(item)


def probe_problems(future_class: type[Future[Any]]) -> list[str]:
    """Try ``future_class`` once against the real ``concurrent.futures.wait``, on this
    thread without blocking: ``wait`` sees a settled future done and an open one not done,
    installs its waiter in the open one's ``_waiters`` and takes it out again, and settling
    a future that holds that waiter wakes it.  What went otherwise; empty when all did."""
    try:
        settled, open_one = future_class(), future_class()
        settled.set_result(None)
        recording = _Recording()
        open_one._waiters = recording
        done, not_done = wait_futures([settled, open_one], timeout=0)
        if done != {settled} or not_done != {open_one}:
            return ["concurrent.futures.wait does not read the lean future's state"]
        if len(recording.installed) != 1 or recording:
            return ["concurrent.futures.wait does not install its waiter in _waiters"]
        waiter = recording.installed[0]
        recording.append(waiter)
        open_one.set_result(None)
        if not waiter.event.is_set():
            return ["settling the lean future does not wake concurrent.futures.wait"]
    except Exception as exc:  # (any surprise: the lean future is not safe here)
        return [f"concurrent.futures.wait on the lean future raised {exc!r}"]
    return []


def _choose() -> tuple[type[Future[Any]], list[str]]:
    """The lean future when its internals fit and it passes the probe, else the plain
    future; and the problems found."""
    try:
        from concurrent.futures import _base
    except ImportError:
        _base = None  # type: ignore[assignment]
    problems = internals_problems(_base)
    if problems:
        return Future, problems
    try:
        from broker.client.lean_future import LeanFuture
    except ImportError as exc:
        return Future, [f"broker.client.lean_future cannot be imported: {exc}"]
    problems = probe_problems(LeanFuture)
    return (Future if problems else LeanFuture), problems


#: The class of the threaded client's futures (see the module docstring) and the problems
#: that made it the plain one: set by :func:`__getattr__` at the first read (declared here,
#: not assigned, so that the first read comes there).
ClientFuture: type[Future[Any]]
PROBLEMS: list[str]
#: The choice is made once, by the first thread that asks.
_CHOOSING = threading.Lock()


def __getattr__(name: str) -> Any:
    """:data:`ClientFuture` and :data:`PROBLEMS`, chosen at the first use (the threaded
    client's first request, or a reader of either name), not at import: a program that
    imports the client and never waits on its futures (a CLI, a poll-on-call client)
    pays nothing.  Both become plain module attributes then: later reads are ordinary
    lookups (this function is not called again)."""
    if name not in ("ClientFuture", "PROBLEMS"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _CHOOSING:
        chosen = globals().get("ClientFuture")
        if chosen is None:
            chosen, problems = _choose()
            if problems:
                logging.getLogger(__name__).warning(
                    "the client's futures are plain concurrent.futures.Future: %s",
                    "; ".join(problems),
                )
            globals()["PROBLEMS"] = problems
            globals()["ClientFuture"] = chosen
    return globals()[name]
