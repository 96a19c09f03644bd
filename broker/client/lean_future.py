"""The threaded client's lean future: ``concurrent.futures.Future`` without a Condition each.

The standard future builds a ``threading.Condition`` (an ``RLock`` and several Python
frames) when it is made, and takes it through Python-level ``__enter__``/``__exit__`` and
``notify_all`` at every step.  The client makes one future per acknowledged push, and a
producer usually looks at it only once it is settled (a done-callback, or ``result()`` on
a done future), so most of that work serves nobody.

:class:`LeanFuture` keeps the standard future's states, its attributes that the module's
helpers read (``_state``, ``_waiters``, ``_condition``: ``concurrent.futures.wait`` and
``as_completed`` work on it) and its rules:

* ``result(timeout)``/``exception(timeout)`` block until it is settled, cancelled, or the
  timeout (``TimeoutError``); on a settled future they return at once, without a lock.
* ``add_done_callback`` runs the callback at once when it is done, else once in the
  thread that settles or cancels it; a callback that raises is logged (the
  ``concurrent.futures`` logger, as the standard future does) and the others still run.
* ``cancel()`` succeeds while it is pending (the client then ignores its answer) and fails
  once it is settled; ``set_result``/``set_exception`` on a done future raise
  ``InvalidStateError``.

What differs is the cost: every state change holds one plain ``threading.Lock`` (taken in
C, no Python frame), and the ``Condition`` over that same lock is made only when somebody
must wait (:attr:`_condition`, made under the lock so that two threads never make two).

It leans on private parts of ``concurrent.futures._base``: import it only through
``broker.client.future``, which checks first that they are there with the shape this
class expects (else the client uses the plain ``concurrent.futures.Future``).
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures._base import (
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    LOGGER,
    PENDING,
    RUNNING,
)
from typing import Any

__all__ = ["LeanFuture"]

_CANCELLED = (CANCELLED, CANCELLED_AND_NOTIFIED)
_OVER = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)


class LeanFuture(Future[Any]):
    """A ``concurrent.futures.Future`` that makes its Condition only when one is waited
    on (see the module docstring)."""

    def __init__(self) -> None:  # (the base's __init__ would make the Condition)
        self._lock = threading.Lock()
        self._cond: threading.Condition | None = None
        self._state = PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiters = []
        self._done_callbacks: list[Any] = []

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        """The Condition over this future's lock, made the first time it is asked for
        (by a waiter here, or by ``concurrent.futures.wait``/``as_completed``)."""
        cond = self._cond
        if cond is None:
            with self._lock:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition(self._lock)
        return cond

    def __repr__(self) -> str:
        state = self._state
        if state == FINISHED:
            if self._exception is not None:
                what = f"raised {type(self._exception).__name__}"
            else:
                what = f"returned {type(self._result).__name__}"
            return f"<{type(self).__name__} at {id(self):#x} state=finished {what}>"
        return f"<{type(self).__name__} at {id(self):#x} state={state.lower()}>"

    # -- the caller's side -------------------------------------------------------------

    def done(self) -> bool:
        return self._state in _OVER

    def cancelled(self) -> bool:
        return self._state in _CANCELLED

    def running(self) -> bool:
        return self._state == RUNNING

    def result(self, timeout: float | None = None) -> Any:
        if self._state != FINISHED:
            self._wait(timeout)
        error = self._exception
        if error is not None:
            try:
                raise error
            finally:
                del error  # (no cycle through the traceback's frame)
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state != FINISHED:
            self._wait(timeout)
        return self._exception

    def _wait(self, timeout: float | None) -> None:
        """Block until finished (return), cancelled (``CancelledError``) or ``timeout``
        seconds passed (``TimeoutError``)."""
        cond = self._condition
        with cond:
            if self._state == PENDING or self._state == RUNNING:
                cond.wait(timeout)
            state = self._state
        if state in _CANCELLED:
            raise CancelledError()
        if state != FINISHED:
            raise TimeoutError()

    def add_done_callback(self, fn: Any) -> None:
        with self._lock:
            if self._state not in _OVER:
                self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:
            LOGGER.exception("exception calling callback for %r", self)

    def cancel(self) -> bool:
        with self._lock:
            state = self._state
            if state in (RUNNING, FINISHED):
                return False
            if state in _CANCELLED:
                return True
            self._state = CANCELLED
            if self._cond is not None:
                self._cond.notify_all()
        self._run_callbacks()
        return True

    # -- the settling side (the client's I/O thread) ----------------------------------

    def set_running_or_notify_cancel(self) -> bool:
        with self._lock:
            state = self._state
            if state == CANCELLED:
                self._state = CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    waiter.add_cancelled(self)
                return False
            if state != PENDING:
                raise RuntimeError(f"Future in unexpected state: {state}")
            self._state = RUNNING
            return True

    def set_result(self, result: Any) -> None:
        with self._lock:
            if self._state in _OVER:
                raise InvalidStateError(f"{self._state}: {self!r}")
            self._result = result
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_result(self)
            if self._cond is not None:
                self._cond.notify_all()
        if self._done_callbacks:
            self._run_callbacks()

    def set_exception(self, exception: BaseException | None) -> None:
        with self._lock:
            if self._state in _OVER:
                raise InvalidStateError(f"{self._state}: {self!r}")
            self._exception = exception
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_exception(self)
            if self._cond is not None:
                self._cond.notify_all()
        if self._done_callbacks:
            self._run_callbacks()

    def _run_callbacks(self) -> None:
        """Run the callbacks added before the future was done, each once, in order."""
        callbacks = self._done_callbacks
        self._done_callbacks = []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                LOGGER.exception("exception calling callback for %r", self)
