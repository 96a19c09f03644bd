"""A queue's delivery handler, and which of its hooks it really overrides.

Calling a hook that cannot decide anything costs a call per message; the queue asks
:class:`HandlerHooks` which hooks a handler overrides and skips the others (the default
handler overrides none on the hot path, so plain pushes take the queue's fast path).  A
hook that raises is counted as a queue error and the handler's ``exception_thrown``
decides what follows (``broker.engine.delivery``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from broker.engine.delivery import ALLOW, Decision, DefaultDeliveryHandler, DeliveryHandler
from broker.engine.message import QueueMessage
from broker.message import Headers

_PLAIN_RECEIVED = (
    DeliveryHandler.received_from_producer,
    DefaultDeliveryHandler.received_from_producer,
)


def _overrides(handler: DeliveryHandler, name: str) -> bool:
    return getattr(type(handler), name) is not getattr(DeliveryHandler, name)


def _declared_with(handler: DeliveryHandler, flag: str, hook: str) -> bool:
    """Is ``flag`` true as set by the very class that defines the handler's ``hook``?  (A
    subclass that overrides the hook without setting the flag again does not inherit it:
    its own hook may answer otherwise.)"""
    for klass in type(handler).__mro__:
        if hook in vars(klass):
            return bool(vars(klass).get(flag, False))
    return False


#: The hooks a handler's ``quiet_test`` speaks for (``DeliveryHandler.quiet_test``).
_QUIET_HOOKS = ("begin_send", "can_consumer_receive", "consumer_received", "acknowledge_received")


def _defined_by(handler: DeliveryHandler, name: str) -> type | None:
    """The class of ``handler`` whose own body defines ``name`` (first in its MRO)."""
    for klass in type(handler).__mro__:
        if name in vars(klass):
            return klass
    return None


def _quiet_test(
    handler: DeliveryHandler, queue: Any, error: Callable[[str, Exception], None]
) -> Callable[[Headers], bool] | None:
    """The handler's ``quiet_test`` for ``queue`` when the class that defines it also
    defines every hook it speaks for (else None: the hooks are called)."""
    owner = _defined_by(handler, "quiet_test")
    if owner is None or owner is DeliveryHandler:
        return None
    if any(_defined_by(handler, hook) is not owner for hook in _QUIET_HOOKS):
        return None
    try:
        return handler.quiet_test(queue)
    except Exception as exc:
        error("quiet_test", exc)
        return None


class _Bound(dict[str, Callable[..., Decision]]):
    """A handler's hooks by name, each bound once at its first call (a hook is called
    per message: a subscript instead of a ``getattr`` each time).  A method set on the
    handler instance after that first call is not seen (none is: handlers are objects
    with fixed methods)."""

    __slots__ = ("handler",)

    def __init__(self, handler: DeliveryHandler) -> None:
        super().__init__()
        self.handler = handler

    def __missing__(self, name: str) -> Callable[..., Decision]:
        method: Callable[..., Decision] = getattr(self.handler, name)
        self[name] = method
        return method


class HandlerHooks:
    """The delivery handler of one queue (see the module docstring)."""

    __slots__ = (
        "_error",
        "_queue",
        "begin_send",
        "can_receive",
        "dequeued",
        "end_send",
        "from_producer",
        "handler",
        "methods",
        "quiet",
        "received",
        "received_by_headers",
        "selects",
    )

    def __init__(
        self, handler: DeliveryHandler, queue: Any, error: Callable[[str, Exception], None]
    ) -> None:
        self.handler = handler
        #: The handler's hooks by name, bound: a call site on a per-message path calls
        #: ``methods[name](...)`` in its own ``try`` and gives an exception to
        #: :meth:`failed` (what :meth:`call` does, without its call).
        self.methods: dict[str, Callable[..., Decision]] = _Bound(handler)
        #: What the hooks receive as their queue.
        self._queue = queue
        self._error = error
        self.begin_send = _overrides(handler, "begin_send")
        self.can_receive = _overrides(handler, "can_consumer_receive")
        self.received = _overrides(handler, "consumer_received")
        self.end_send = _overrides(handler, "end_send")
        self.dequeued = _overrides(handler, "message_dequeued")
        self.selects = _overrides(handler, "selects")
        # The default handler's received_from_producer only acknowledges a producer that
        # waits for it, and such pushes never take the fast path.
        self.from_producer = type(handler).received_from_producer not in _PLAIN_RECEIVED
        #: ``DeliveryHandler.received_by_headers``, as declared with the handler's own
        #: ``received_from_producer`` (``Queue.accept_many`` asks once per header block).
        self.received_by_headers = _declared_with(
            handler, "received_by_headers", "received_from_producer"
        )
        #: The handler's test of a header block (``DeliveryHandler.quiet_test``): where it
        #: says True, the send and the acknowledge by taking skip ``begin_send``,
        #: ``can_consumer_receive``, ``consumer_received`` and ``acknowledge_received``
        #: (four hooks per message, each a call or two).  None: no such test.
        self.quiet = _quiet_test(handler, queue, error)

    @property
    def any(self) -> bool:
        """Some hook may decide something about a plain push."""
        return (
            self.from_producer
            or self.begin_send
            or self.can_receive
            or self.received
            or self.end_send
            or self.dequeued
        )

    def call(self, m: QueueMessage | None, name: str, *args: Any) -> Decision:
        """Call hook ``name``; an exception goes to ``exception_thrown``."""
        try:
            result: Decision = self.methods[name](*args)
            return result
        except Exception as exc:
            return self.failed(m, name, exc)

    def failed(self, m: QueueMessage | None, name: str, exc: Exception) -> Decision:
        """Hook ``name`` raised ``exc``: counted as an error, the handler's
        ``exception_thrown`` decides (ALLOW if that raises too)."""
        self._error(name, exc)
        try:
            return self.handler.exception_thrown(self._queue, m, exc)
        except Exception as exc2:
            self._error("exception_thrown", exc2)
            return ALLOW

    def can_consumer_receive(self, m: QueueMessage, c: Any) -> bool:
        """The handler's filter (an exception counts as an error and refuses)."""
        try:
            return bool(self.handler.can_consumer_receive(self._queue, m, c))
        except Exception as exc:
            return self.filter_failed(exc)

    def filter_failed(self, exc: Exception) -> bool:
        """The handler's filter raised ``exc`` (a call site that calls
        ``methods["can_consumer_receive"]`` in its own ``try``): counted as an error;
        False, the consumer refused."""
        self._error("can_consumer_receive", exc)
        return False

    def quiet_failed(self, exc: Exception) -> bool:
        """The handler's quiet test raised ``exc``: counted as an error; False, the hooks
        are called."""
        self._error("quiet_test", exc)
        return False

    def looks_past(self) -> bool:
        """The handler's ``looks_past`` (False when it filters no consumer, or raises)."""
        if not self.can_receive:
            return False
        try:
            return bool(self.handler.looks_past(self._queue))
        except Exception as exc:
            self._error("looks_past", exc)
            return False

    def nobody_selects(self, m: QueueMessage, consumers: Sequence[Any]) -> bool:
        """Does no consumer select ``m`` at all (the handler's ``selects``; False when it
        has none, or raises: the message is then only looked past)?"""
        if not self.selects:
            return False
        try:
            return not any(self.handler.selects(self._queue, m, c) for c in consumers)
        except Exception as exc:
            self._error("selects", exc)
            return False

    def selected_by(self, m: QueueMessage, c: Any) -> bool:
        """Does consumer ``c`` select ``m`` (True when the handler has no ``selects``, or
        it raises: the message is then not passed by that consumer's cursor)?"""
        if not self.selects:
            return True
        try:
            return bool(self.handler.selects(self._queue, m, c))
        except Exception as exc:
            self._error("selects", exc)
            return True

    def selection(self, consumers: Sequence[Any]) -> tuple[object, ...]:
        """What the answers of ``selects`` depend on: the handler, its ``selection``
        number and the consumers (a change: what was set aside is looked at again)."""
        try:
            number: object = self.handler.selection(self._queue)
        except Exception as exc:
            self._error("selection", exc)
            number = object()  # never the same: nothing stays set aside
        return (id(self.handler), number, *(c.id for c in consumers))

    def message_dequeued(self, m: QueueMessage) -> None:
        """Tell the handler ``m`` left the queue (callers check :attr:`dequeued` first)."""
        if self.dequeued:
            try:
                self.handler.message_dequeued(self._queue, m)
            except Exception as exc:
                self._error("message_dequeued", exc)
