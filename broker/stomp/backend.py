"""The typed interface between a STOMP session and the broker behind it.

A :class:`~broker.stomp.session.Session` never routes messages itself: it parses frames,
enforces the STOMP rules, and calls a :class:`Backend`.  The backend pushes deliveries
back through the :data:`DeliverySink` it was given at :meth:`Backend.attach`.

Contract (what an implementation on the broker engine must do):

* Every call is made from one thread (the listener's event loop); calls are never
  re-entrant *from the session*, but a backend may call any sink (this connection's or
  another's) from inside ``publish``/``subscribe``/``ack``/``nack``/``resume``/``detach``.
* ``publish`` returns once the message is accepted -- for ``persistent`` messages, once
  it is durable: the session sends the RECEIPT right after it returns.  Refusal:
  raise :class:`~broker.stomp.errors.BackendError` (the client gets an ERROR frame).
* ``subscribe`` starts deliveries for ``spec`` (a SubscriptionSpec: destinations,
  ack mode, credit, browser, from-seq, include-seq, persistent, exclusive, selector;
  options the backend does not honour yet are ignored, never an error).  Retained
  topic messages, queue backlogs and browse ends are delivered through the sink,
  possibly before ``subscribe`` returns.
* Each :class:`Delivery` carries a ``tag``, unique per connection for its lifetime.
  With ``AckMode.AUTO`` the backend settles the message as soon as the sink accepts
  it (no ``ack`` follows).  Otherwise it stays unacknowledged (and counts against the
  subscription's credit) until ``ack``/``nack`` names its tag, or until ``detach``.
* ``ack(tags)`` settles (consumes) and returns credit; ``nack(tags)`` returns the
  messages for redelivery (``redeliveries + 1``) and returns credit.  ``credit(tags)``
  (a transactional ACK) returns their credit now without settling them; a later
  ``ack``/``nack`` of the same tags returns none again.  Unknown tags are ignored (the
  session has checked what it could).
* A sink returning ``False`` means "this connection cannot take more now" (its
  outbound buffer is full): the backend keeps the message -- queue messages stay
  queued for another consumer or for later; a topic copy for that subscriber is
  dropped -- and stops offering to that connection until ``resume``.
* ``unsubscribe(id, destroy=True)`` also deletes a durable subscription (``/dsub/``).
  Unacknowledged deliveries of an unsubscribed subscription are redelivered.
* A backend that applies operations after the call returns (ACKs handed to another
  thread) is an :class:`AfterApplied`: the session's RECEIPTs wait for its answer, so a
  RECEIPT still means every frame before it was applied.
* ``ConnectionInfo.virtual_host`` names the virtual host the session admitted the
  connection to; the destinations a session parses are named in the default namespace,
  and a backend that keeps virtual hosts apart names them in the connection's
  (``broker.stomp.vhosts``: the engine backend does; the in-memory one does not).
* ``detach`` (connection gone, cleanly or not): every unacknowledged delivery is
  redelivered to other subscribers, subscriptions end (durable ones keep their
  queue), and the connection's temporary destinations are deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

from broker.stomp.subscription import PublishSpec, PublishStreak, SubscriptionSpec
from broker.store.base import NOT_SAVED


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who is connected: set by the session once CONNECT is accepted."""

    id: int  # unique per listener, used in temporary destination names
    user: str  # what the authenticator returned
    virtual_host: str
    version: str  # "1.0", "1.1" or "1.2"
    peer: str = ""  # "host:port" for logs


class Delivery(NamedTuple):
    """One message for one subscription of one connection.

    (A named tuple, not a frozen dataclass: one is made per message delivered, and a
    frozen dataclass's ``__init__`` costs about five times as much.)"""

    subscription: str  # the SUBSCRIBE id
    tag: int  # unique per connection; names this delivery in ack/nack
    message_id: str  # stable across redeliveries of the same message
    destination: str  # STOMP form, e.g. "/queue/a" (the concrete one for wildcards)
    headers: tuple[tuple[str, str], ...]  # the publisher's user headers
    body: bytes
    redeliveries: int = 0
    sequence: int | None = None  # queue sequence (include-seq), when known
    timestamp_ms: int | None = None  # when the broker received it (ms since the epoch)
    sender: str | None = None  # user id of the publisher (add_user_header)
    browse_end: bool = False  # the "end of browse" marker (no message, never acked)


#: Pushes one delivery to a connection; False = not accepted now (see the contract).
DeliverySink = Callable[[Delivery], bool]
#: Pushes a run of deliveries to a connection; returns how many it took, the first ones
#: in order (fewer than given: it cannot take more now, as a sink returning False).
RunSink = Callable[[Sequence[Delivery]], int]
#: Pushes a run of plain ``ack:auto`` MESSAGEs of one subscription (its id, the
#: destination, the message ids, the bodies: no header to carry, no redelivery, no
#: sequence, nothing to settle per delivery); returns how many it took, the first ones
#: in order, as the run sink would for their deliveries; -1: the subscription takes no
#: plain run (unknown, not ``ack:auto``, headers to add): nothing was taken.
PlainRunSink = Callable[[str, str, Sequence[str], Sequence[bytes | memoryview]], int]


class Backend(Protocol):
    """What a STOMP session needs from a broker (see the module docstring)."""

    def attach(self, connection: ConnectionInfo, sink: DeliverySink) -> None: ...

    def detach(self, connection_id: int) -> None: ...

    def publish(self, connection_id: int, spec: PublishSpec) -> None: ...

    def subscribe(self, connection_id: int, spec: SubscriptionSpec) -> None: ...

    def unsubscribe(self, connection_id: int, subscription_id: str, *, destroy: bool) -> None: ...

    def ack(self, connection_id: int, tags: Sequence[int]) -> None: ...

    def nack(self, connection_id: int, tags: Sequence[int]) -> None: ...

    def credit(self, connection_id: int, tags: Sequence[int]) -> None: ...

    def resume(self, connection_id: int) -> None: ...


@runtime_checkable
class RunReceiver(Protocol):
    """A backend that can also hand a connection a run of deliveries in one call (the
    deliveries of one hand-over from the broker: the connection's room read once, one
    write for them all).  ``attach_runs`` is called right after ``attach``; the run
    sink takes exactly what the single sink would take called on each in turn."""

    def attach_runs(
        self, connection_id: int, sink: RunSink, plain: PlainRunSink | None = None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the broker did not take a SEND: ``reason`` for the client's ERROR frame;
    ``store_failed``: the store failed before the SEND's writes were durable (which of
    them the disk holds is unknown: the ERROR names the first receipt the client waits
    for, even one a later SEND of the run asked for)."""

    reason: str
    store_failed: bool = False


#: The answer to SENDs whose writes the store failed to make durable.
STORE_FAILED = Refusal(NOT_SAVED, store_failed=True)

#: Called once with the outcome of an asynchronous publish: None (accepted -- durable,
#: for a persistent message) or why it was refused.
PublishAnswer = Callable[["Refusal | None"], None]


@runtime_checkable
class AsyncPublisher(Protocol):
    """A backend that can also publish without making the session wait.

    ``publish_async`` either raises BackendError at once (nothing was sent) or calls
    ``answer`` exactly once later, on the session's thread, after which the backend
    writes the session's output (as it does after deliveries).  Answers come in the
    order of the calls for one connection.
    """

    def publish_async(
        self, connection_id: int, spec: PublishSpec, answer: PublishAnswer
    ) -> None: ...


#: Called once with the outcome of a batch of asynchronous publishes: how many of them
#: were taken, in order, and None (all of them) or why the next one was refused (the
#: ones after it take no effect).
BatchAnswer = Callable[[int, "Refusal | None"], None]


@runtime_checkable
class BatchPublisher(Protocol):
    """An :class:`AsyncPublisher` that also takes a run of SENDs of one connection in
    one call (one hand-over to the broker and one answer for them all).

    ``publish_batch`` takes the run as streaks (:class:`PublishStreak`: SENDs in a row
    that differ in their body only), publishes their SENDs in order, and either raises
    BackendError at once (nothing was sent: the session then publishes them one by one,
    which says which one is refused) or calls ``answer(taken, error)`` exactly once
    later, as ``publish_async`` does (``taken`` counts SENDs, not streaks).  Answers of
    batches and single publishes of one connection come in the order of the calls.
    """

    def publish_batch(
        self, connection_id: int, streaks: Sequence[PublishStreak], answer: BatchAnswer
    ) -> None: ...


@runtime_checkable
class AfterApplied(Protocol):
    """A backend whose calls may take effect after they return (the engine's: ACKs,
    NACKs and UNSUBSCRIBEs are handed to the engine thread without waiting).

    ``after_applied(connection_id, answer)`` calls ``answer(None)`` exactly once, on the
    session's thread, once every call made before it for that connection took effect
    (durably, where the call writes to a store), in order with the publish answers:
    the session holds each RECEIPT until then (STOMP: a RECEIPT says the server
    processed every frame before it).  ``answer(refusal)``: it cannot say so (the
    session ends with an ERROR)."""

    def after_applied(self, connection_id: int, answer: PublishAnswer) -> None: ...
