"""The bridge core: sans-IO state shared by every connector (no sockets, time passed in).

It takes events (a local message arrived, the remote accepted message N, the remote went
away, ...) with ``now`` and returns actions (:class:`Publish`, :class:`AckLocal`,
:class:`PushLocal`, :class:`AckRemote`, :class:`DeadLetter`, :class:`Connect`) for the
driver (:mod:`broker.bridge.runner`) to carry out.  Rules it enforces:

* Ack after accept, both ways: a local message is acknowledged to the local broker only
  when the remote accepted it (MQTT PUBACK, AMQP confirm); a remote message is
  acknowledged to the remote only when the local broker acknowledged the push.
* Nothing in flight is dropped: outbound messages not yet accepted when the connection
  drops are published again after the reconnect; inbound pushes the local broker refused
  are retried with backoff.  So delivery is at-least-once: duplicates are possible (a
  resend whose first copy did arrive, a remote redelivery), losses are not.
* An acknowledgement for a remote delivery is only sent on the connection that delivered
  it (a connection ``generation``); older ones are dropped, the remote redelivers.
* Reconnects follow :class:`Backoff` (exponential, capped), reset by a good connection.
* Remote messages larger than ``max_message_size`` are dead-lettered: counted, logged,
  described on the dead-letter queue if one is configured, and acknowledged remotely so
  that they cannot block the bridge.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

from broker.bridge.config import Route, Settings

Headers = tuple[tuple[str, str], ...]

#: The header a connector sets (value ``true``) on a publish that may be a duplicate.
RESENT_HEADER = "zerohub-resent"


class Backoff:
    """Exponential retry schedule: ``first``, doubled after each failure, at most ``largest``."""

    def __init__(self, first: float, largest: float) -> None:
        self.first = first
        self.largest = largest
        self.delay = first
        self.due_at = 0.0

    def failed(self, now: float) -> float:
        """Record a failure at ``now``; the time of the next attempt."""
        self.due_at = now + self.delay
        self.delay = min(self.delay * 2, self.largest)
        return self.due_at

    def reset(self) -> None:
        self.delay = self.first
        self.due_at = 0.0

    def due(self, now: float) -> bool:
        return now >= self.due_at


# -- actions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connect:
    """Open (or reopen) the connection to the remote broker."""


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish to the remote; report ``remote_accepted(token)`` when it accepted.
    ``resent``: this message may have reached the remote before (a publish again after a
    reconnect or a refusal, or a local redelivery): the connector flags the copy
    (:data:`RESENT_HEADER`), so a duplicate on the remote side is always a flagged one."""

    token: int
    route: Route
    payload: bytes
    resent: bool = False


@dataclass(frozen=True, slots=True)
class AckLocal:
    """Acknowledge a local delivery (the remote accepted it)."""

    ref: Any


@dataclass(frozen=True, slots=True)
class PushLocal:
    """Push into the local queue with an acknowledge; report ``local_accepted(token)``."""

    token: int
    route: Route
    payload: bytes
    headers: Headers


@dataclass(frozen=True, slots=True)
class AckRemote:
    """Acknowledge a remote delivery (the local broker accepted it)."""

    ref: Any


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A remote message the bridge will not deliver: log it, describe it locally."""

    route: Route | None  # None: it matched no route
    reason: str
    size: int


Action = Connect | Publish | AckLocal | PushLocal | AckRemote | DeadLetter


@dataclass(slots=True)
class Counters:
    """What the bridge did so far (``BridgeCore.counters``; ``snapshot()`` for a copy)."""

    out_received: int = 0  # local deliveries taken
    out_published: int = 0  # publishes to the remote, resends included
    out_accepted: int = 0  # accepted by the remote, acknowledged locally
    out_resent: int = 0  # published again after a reconnect or a refusal
    out_refused: int = 0  # refused by the remote (published again later)
    in_received: int = 0  # remote deliveries taken
    in_pushed: int = 0  # pushes to the local broker, retries included
    in_accepted: int = 0  # accepted locally, acknowledged remotely
    in_refused: int = 0  # pushes the local broker refused or lost (retried)
    in_stale: int = 0  # accepted locally after their remote connection dropped
    dead_lettered: int = 0
    connects: int = 0  # connections established
    connect_failures: int = 0
    disconnects: int = 0

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class _Outbound:
    route: Route
    payload: bytes
    ref: Any
    sent_in: int = 0  # the generation it was last published on (0: not yet)
    resent: bool = False  # may have reached the remote before (see Publish)


@dataclass(slots=True)
class _Inbound:
    route: Route
    payload: bytes
    headers: Headers
    ref: Any
    generation: int
    retry: Backoff
    pushing: bool = True


@dataclass(slots=True)
class BridgeCore:
    """The bridge's state (see the module docstring)."""

    settings: Settings
    counters: Counters = field(default_factory=Counters)
    generation: int = 0  # number of the current remote connection (0: never connected)
    up: bool = False
    connecting: bool = False
    _tokens: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _out: dict[int, _Outbound] = field(default_factory=dict)
    _in: dict[int, _Inbound] = field(default_factory=dict)
    _backoff: Backoff | None = None

    @property
    def backoff(self) -> Backoff:
        if self._backoff is None:
            self._backoff = Backoff(*self.settings.backoff)
        return self._backoff

    @property
    def out_in_flight(self) -> int:
        """Local messages taken and not yet accepted by the remote."""
        return len(self._out)

    @property
    def in_in_flight(self) -> int:
        """Remote messages taken and not yet accepted by the local broker."""
        return len(self._in)

    # -- the remote connection ---------------------------------------------------------

    def poll(self, now: float) -> list[Action]:
        """Timers: a reconnect that is due, local pushes whose retry is due."""
        actions: list[Action] = []
        if not self.up and not self.connecting and self.backoff.due(now):
            self.connecting = True
            actions.append(Connect())
        for token, item in self._in.items():
            if not item.pushing and item.retry.due(now):
                item.pushing = True
                self.counters.in_pushed += 1
                actions.append(PushLocal(token, item.route, item.payload, item.headers))
        return actions

    def connected(self, now: float) -> list[Action]:
        """The remote accepted the connection: publish what is waiting (resends included)."""
        self.connecting = False
        self.up = True
        self.generation += 1
        self.backoff.reset()
        self.counters.connects += 1
        actions: list[Action] = []
        for token, item in self._out.items():
            if item.sent_in:
                self.counters.out_resent += 1
            actions.append(self._publish(token, item))
        return actions

    def connect_failed(self, now: float) -> list[Action]:
        self.connecting = False
        self.counters.connect_failures += 1
        self.backoff.failed(now)
        return []

    def lost(self, now: float) -> list[Action]:
        """The connection dropped: reconnect later; unaccepted publishes go again then."""
        if self.up:
            self.counters.disconnects += 1
        self.up = False
        self.connecting = False
        self.backoff.failed(now)
        return []

    # -- local -> remote ---------------------------------------------------------------

    def local_message(
        self, route: Route, payload: bytes, ref: Any, redelivered: bool = False
    ) -> list[Action]:
        """A local delivery to forward (``ref``: what ``AckLocal`` gives back;
        ``redelivered``: the local broker handed it out before, maybe to this bridge)."""
        token = next(self._tokens)
        item = _Outbound(route, payload, ref, resent=redelivered)
        self._out[token] = item
        self.counters.out_received += 1
        return [self._publish(token, item)] if self.up else []

    def _publish(self, token: int, item: _Outbound) -> Publish:
        if item.sent_in:
            item.resent = True
        item.sent_in = self.generation
        self.counters.out_published += 1
        return Publish(token, item.route, item.payload, item.resent)

    def remote_accepted(self, token: int, generation: int) -> list[Action]:
        item = self._out.get(token)
        if item is None or item.sent_in != generation:
            return []  # an older copy's answer: the newer copy is the one we wait for
        del self._out[token]
        self.counters.out_accepted += 1
        return [AckLocal(item.ref)]

    def remote_refused(self, token: int, generation: int) -> list[Action]:
        """The remote refused a publish (AMQP nack, MQTT v5 error code): publish again."""
        item = self._out.get(token)
        if item is None or item.sent_in != generation:
            return []
        self.counters.out_refused += 1
        self.counters.out_resent += 1
        if not self.up:
            return []
        return [self._publish(token, item)]

    # -- remote -> local ---------------------------------------------------------------

    def remote_message(
        self,
        route: Route | None,
        payload: bytes,
        ref: Any,
        headers: Headers = (),
        generation: int | None = None,
    ) -> list[Action]:
        """A remote delivery on the current connection (``ref``: for ``AckRemote``);
        ``route`` None when it matches none of ours (a subscription left from an old
        configuration in a persistent session); ``generation``: the connection it came on
        (default: the current one)."""
        generation = self.generation if generation is None else generation
        self.counters.in_received += 1
        size = len(payload)
        if route is None:
            self.counters.dead_lettered += 1
            dead = DeadLetter(None, "it matches no route", size)
            return [dead, *self._ack_remote(ref, generation)]
        if size > self.settings.max_message_size:
            self.counters.dead_lettered += 1
            limit = self.settings.max_message_size
            reason = f"payload of {size} octets is over the limit of {limit}"
            return [DeadLetter(route, reason, size), *self._ack_remote(ref, generation)]
        token = next(self._tokens)
        retry = Backoff(*self.settings.backoff)
        self._in[token] = _Inbound(route, payload, headers, ref, generation, retry)
        self.counters.in_pushed += 1
        return [PushLocal(token, route, payload, headers)]

    def _ack_remote(self, ref: Any, generation: int) -> list[Action]:
        if not self.up or generation != self.generation:
            self.counters.in_stale += 1  # the remote redelivers it: a duplicate, not a loss
            return []
        return [AckRemote(ref)]

    def local_accepted(self, token: int) -> list[Action]:
        item = self._in.pop(token, None)
        if item is None:
            return []
        actions = self._ack_remote(item.ref, item.generation)
        if actions:
            self.counters.in_accepted += 1
        return actions

    def local_refused(self, token: int, now: float) -> list[Action]:
        """The local broker refused the push or the answer was lost: retry with backoff."""
        item = self._in.get(token)
        if item is None:
            return []
        self.counters.in_refused += 1
        item.pushing = False
        item.retry.failed(now)
        return []
