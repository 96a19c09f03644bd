"""Flow and rules of STOMP subscriptions on the engine.

A queue subscription's selector, credit windows, ``include-seq`` and ``from-seq`` are
applied by the engine (the ``per-message`` handler's rules, ``broker.engine.per_message``):
:class:`SubExtras`, built on the listener thread, used on the engine's.  A topic
subscription's credit windows (with ``ack:client``/``client-individual``) are kept by the
listener thread (:class:`TopicCredit`): a topic keeps nothing, so a copy that reaches a
subscription whose windows are both closed is dropped for it, as the engine's broadcast
drops a copy for a consumer without room.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from broker.engine.per_message import Credit
from broker.stomp.subscription import AckMode, SubscriptionSpec
from broker.stomp.subscription import Credit as CreditSpec


@dataclass(frozen=True, slots=True)
class SubExtras:
    """What a queue subscription asks of the engine beyond joining (engine thread):
    ``selects`` -- its selector, applied by the queue (``PerMessageRules.set_selector``:
    a message nobody selects stays queued without holding up the others); ``credit`` --
    its credit windows, one object shared by its channels (``PerMessageRules.set_credit``;
    None: no ``credit`` header, the engine window alone); ``include_seq`` -- deliveries
    carry their queue sequence; ``from_seq`` -- only messages numbered that or more
    (``PerMessageRules.set_from_seq``; -1: those that come after it joined)."""

    selects: Callable[[Sequence[tuple[str, str]]], bool] | None = None
    credit: Credit | None = None
    include_seq: bool = False
    from_seq: int | None = None  # ``from-seq`` (-1: the tail, 0: the head)


def extras_of(spec: SubscriptionSpec) -> SubExtras | None:
    """What the engine applies for a queue subscription (None: nothing to apply)."""
    selects = spec.selector.selects if spec.selector is not None else None
    credit = None
    if spec.credit != CreditSpec():
        credit = Credit(spec.credit.count, spec.credit.size)
    if selects is None and credit is None and not spec.include_seq and spec.from_seq is None:
        return None
    return SubExtras(selects, credit, bool(spec.include_seq), spec.from_seq)


@dataclass(slots=True)
class TopicCredit:
    """The two credit windows of a topic subscription acknowledged by the client
    (listener thread): a copy goes while either is above zero; each delivery takes one
    message and its body's octets, its ACK/NACK (or transactional ACK) gives them back."""

    count: int
    size: int

    def open(self) -> bool:
        return self.count > 0 or self.size > 0

    def take(self, size: int) -> None:
        self.count -= 1
        self.size -= size

    def give(self, size: int) -> None:
        self.count += 1
        self.size += size


def topic_credit_of(spec: SubscriptionSpec) -> TopicCredit | None:
    """The windows of a subscription's topic deliveries (None: no ``credit`` header, or
    ``ack:auto`` -- credit would come back as each copy goes: the engine window alone)."""
    if spec.ack is AckMode.AUTO or spec.credit == CreditSpec():
        return None
    return TopicCredit(spec.credit.count, spec.credit.size)
