"""Resource limits of the broker engine: every table a client can grow has a bound.

One frozen :class:`Limits` object, part of ``BrokerConfig`` (``config.limits``), set from
the ``[limits]`` table of ``broker serve --config FILE`` (keys are the field names).
Every value is a positive integer; the defaults are what a broker on a small machine can
hold (each channel or queue costs a few KiB, a client a few KiB plus its socket).  The
transport's own limits (frame size, send backlog, pending handshakes) are in
``broker.server.options.ServerOptions``.

What happens at a limit: creating one more channel/queue/router/binding, joining one more
channel, one more pattern join or subscribing one more event answers ``LimitExceeded``
(482; a pattern join past ``max_joined_channels`` joins what fits, see
``broker.engine.patterns``); a client beyond
``max_clients`` is refused at connect (TERMINATE 482); a push naming more distinct ``CC``
queues than ``max_cc`` is refused (482) before any copy is made; a queue holding
``max_queue_messages`` refuses pushes (482) like its own ``MessageLimit``; creating one
more durable subscription than ``max_durable_subscriptions`` answers 482, and a push to
a channel one of whose durable subscriptions holds ``max_durable_subscription_messages``
is refused (482) before any copy is made (``broker.engine.dsubs``); a user (the identity
its authorizer gives, ``Authorizer.user``) that holds ``max_channels_per_user``
channels, ``max_queues_per_user`` queues or ``max_durable_subscriptions_per_user``
durable subscriptions it created gets 482 on the creation of one more, whichever
connection or door asks (``broker.engine.quotas``).  Lists longer
than ``max_reply_size`` octets of JSON come in pages (``Page-After`` / ``Page-Next``
headers, see ``broker.paging``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class LimitsError(ValueError):
    """A limits table has an unknown key or a value that is not a positive integer."""


#: Smallest page budget accepted (octets): room for any one item of any list.
MIN_REPLY_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-broker and per-client bounds (see the module docstring)."""

    #: Sessions connected at once (per broker).
    max_clients: int = 10_000
    #: Channels (per broker), whether created by an operation or on the fly by a push/join.
    max_channels: int = 10_000
    #: Queues in all channels together (per broker).
    max_queues: int = 20_000
    #: Queues in one channel; a channel's own ``QueueLimit`` may only be lower.
    max_queues_per_channel: int = 1_000
    #: Messages waiting in one queue; a queue's own ``MessageLimit`` may only be lower.
    max_queue_messages: int = 1_000_000
    #: Distinct queues one push may copy to with ``CC`` headers (duplicates count once).
    max_cc: int = 64
    #: Channels one client may have joined (per client).
    max_joined_channels: int = 1_000
    #: Pattern joins (``JOIN`` with ``Pattern: yes``) of one client at once.
    max_pattern_joins: int = 16
    #: Distinct pattern texts held at once (per broker, every door together: TMQP pattern
    #: joins and STOMP wildcard subscriptions, a text each door holds counting once per
    #: door; ``patterns`` in the statistics): each is tried once per channel created; a
    #: pattern another client of the same door holds already costs nothing more.
    max_patterns: int = 1_000
    #: Temporary destinations (``/temp-queue/``, ``/temp-topic/``) one STOMP connection
    #: holds at once: each is a channel kept until that connection ends.
    max_temp_destinations: int = 1_000
    #: Event subscriptions (event, channel, queue filters) of one client.
    max_event_subscriptions: int = 1_000
    #: Outstanding direct requests (waiting for a response) of one client.
    max_pending_requests: int = 100_000
    #: Messages one pull request may ask for (its ``Count`` header).
    max_pull_count: int = 10_000
    #: Routers (per broker), and bindings of one router.
    max_routers: int = 1_000
    max_bindings_per_router: int = 1_000
    #: Durable subscriptions (per broker), and messages one of them may hold: a push to a
    #: topic one of whose durable subscriptions is full is refused (482), all or nothing.
    max_durable_subscriptions: int = 1_000
    max_durable_subscription_messages: int = 100_000
    #: Channels, queues and durable subscriptions one user holds: the ones it created
    #: (by an operation or on the fly by a push, join or STOMP SEND/SUBSCRIBE), every
    #: connection and door of that user together (``broker.engine.quotas``): a quarter of
    #: the broker's bound each, so no one user can take the room every other user needs.
    max_channels_per_user: int = 2_500
    max_queues_per_user: int = 5_000
    max_durable_subscriptions_per_user: int = 250
    #: Receipts (``Receipt: ONE|ALL``) waiting for their message's fate (per broker);
    #: a push asking for one more is refused (482).
    max_pending_receipts: int = 100_000
    #: Octets of JSON in one list/statistics reply; longer lists come in pages.
    max_reply_size: int = 1024 * 1024
    #: Waiting messages of a queue held in memory whole, per priority, when its store
    #: keeps them on disk (``persistent``); saved ones behind them wait as the store's
    #: index entries and are read back when their turn comes (``engine.queue.messages``).
    paged_window: int = 10_000
    #: Connected clients the in-process statistics list (``Engine.stats()["client_list"]``,
    #: oldest connection first; the hub's console and status): a broker with 10,000
    #: clients still answers a status read in bounded time and size.
    max_listed_clients: int = 500

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LimitsError(f"limits: {f.name} must be a positive integer, not {value!r}")
        if self.max_reply_size < MIN_REPLY_SIZE:
            raise LimitsError(f"limits: max_reply_size must be at least {MIN_REPLY_SIZE}")

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any], base: Limits | None = None) -> Limits:
        """Limits from a config table (``[limits]``); missing keys keep ``base``'s values."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(table) - names)
        if unknown:
            raise LimitsError(f"limits: unknown keys {unknown}")
        return dataclasses.replace(base or cls(), **dict(table))

    def fitting(self, max_frame_size: int, overhead: int) -> Limits:
        """These limits with the reply budget lowered, if needed, so replies fit a frame."""
        room = max(MIN_REPLY_SIZE, max_frame_size - overhead)
        if self.max_reply_size <= room:
            return self
        return dataclasses.replace(self, max_reply_size=room)

    def table(self) -> dict[str, int]:
        """Every limit by name (for statistics and documentation)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
