"""What a STOMP queue subscription asks of the engine beyond joining: its selector,
credit windows, ``include-seq`` and ``from-seq`` (applied by the ``per-message`` handler's
rules, ``broker.engine.per_message``).  Built on the listener thread, used on the engine's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from broker.engine.per_message import Credit
from broker.stomp.subscription import Credit as CreditSpec
from broker.stomp.subscription import SubscriptionSpec


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
    selector = spec.selector
    selects = None
    if selector is not None:

        def selects(headers: Sequence[tuple[str, str]]) -> bool:
            return selector.matches(first_wins(headers))

    credit = None
    if spec.credit != CreditSpec():
        credit = Credit(spec.credit.count, spec.credit.size)
    if selects is None and credit is None and not spec.include_seq and spec.from_seq is None:
        return None
    return SubExtras(selects, credit, bool(spec.include_seq), spec.from_seq)


def first_wins(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Headers as a selector reads them (a repeated name: its first value)."""
    env: dict[str, str] = {}
    for name, value in headers:
        env.setdefault(name, value)
    return env
