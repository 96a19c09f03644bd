"""What the modules below the queue see of a queue.

Messages, flow control, delivery handlers and the JSON models are imported by
``broker.engine.queue``; they name a queue through :class:`QueueView` (a structural
type that :class:`broker.engine.queue.queue.Queue` satisfies) so that no import points
back up at the queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker import tmqp
    from broker.engine.channel import Channel
    from broker.engine.message import QueueMessage
    from broker.engine.options import ChannelQueueOptions
    from broker.protocol import Outgoing, QueueStatus


class QueueView(Protocol):
    """A channel queue: identity, options, counters and the flow-control settlements."""

    @property
    def id(self) -> int: ...
    @property
    def channel(self) -> Channel[QueueView]: ...
    @property
    def options(self) -> ChannelQueueOptions: ...
    @property
    def status(self) -> QueueStatus: ...
    @property
    def n_priority(self) -> int: ...
    @property
    def n_regular(self) -> int: ...
    @property
    def message_count(self) -> int: ...
    @property
    def pending(self) -> Sized: ...
    @property
    def sequence(self) -> int: ...
    @property
    def window(self) -> int: ...
    @property
    def used(self) -> Mapping[str, int]: ...
    @property
    def received(self) -> int: ...
    @property
    def sent(self) -> int: ...
    @property
    def deliveries(self) -> int: ...
    @property
    def nacks(self) -> int: ...
    @property
    def acks(self) -> int: ...
    @property
    def timeouts(self) -> int: ...
    @property
    def saves(self) -> int: ...
    @property
    def removed(self) -> int: ...
    @property
    def errors(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def last_received(self) -> float | None: ...
    @property
    def last_sent(self) -> float | None: ...

    def settle_plain(self, client_id: str, count: int, now: float) -> None: ...

    def settle_sent(
        self, kind: int, client_id: str, m: QueueMessage | None, now: float
    ) -> None: ...

    def settle_unsent(
        self,
        kind: int,
        client_id: str,
        m: QueueMessage | None,
        frame: tmqp.Frame | None,
        seq: int,
        now: float,
        out: list[Outgoing],
    ) -> None: ...
