"""A TMQP JOIN's per-consumer rules: its ``Selector`` and ``Credit`` headers.

What STOMP's ``selector`` and ``credit`` give a queue subscription, a TMQP client asks
for on JOIN (``broker.protocol.Header``):

* ``Selector: EXPR`` -- an SQL-92 selector over message headers (``broker.selector``):
  the client is offered only the messages whose headers it selects.  On a queue that
  hands each message to one consumer (push, round-robin, pull) the client is passed
  over for a message it does not select and the message goes to another consumer or
  waits, without holding up the messages behind it (``PerMessageRules``: "looks past");
  on a Broadcast queue the client's copy of such a message is not sent.
* ``Credit: COUNT,SIZE`` -- credit windows: a delivery goes to the client while either
  window is above zero, takes one message and its payload octets from them, and its
  acknowledge (or negative acknowledge, time-out, the client leaving) gives them back.
  On a queue without acknowledges (``RequestAcknowledge`` off) a delivery gives its
  credit back once sent: the windows never close there.

The rules are the ``per-message`` delivery handler's (``broker.engine.per_message``):
a JOIN asking for them is refused (406) unless every queue of the channel uses that
handler (``MessageDeliveryHandler: per-message``) -- or, on a channel without queues
yet, its options for queues made on the fly do.  A queue added later with another
handler does not apply them.  A bad header is refused (400) with the reason; either
way nothing is joined.  The rules end when the client leaves the channel or goes away
(``ChannelRegistry.remove_consumer``); a JOIN of a member sets them again (a JOIN
without them removes them).  A client with rules gets no broadcast fan-out grant
(``broker.engine.fanout``): its copies are chosen one by one.  Sans-IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker import tmqp
from broker.engine.errors import OperationError
from broker.engine.options import ChannelQueueOptions
from broker.engine.per_message import PER_MESSAGE, Credit, PerMessageRules
from broker.protocol import Header, ResultCode, header
from broker.selector import Selector, SelectorError, parse_selector

#: The largest window either ``Credit`` number may give (the engine's own bound on
#: what one consumer holds in flight is ``max_prefetch``, whatever the credit).
MAX_CREDIT = 2**63 - 1


@dataclass(frozen=True, slots=True)
class JoinRules:
    """A JOIN's selector (parsed) and credit windows ``(count, size)``; None: not asked."""

    selector: Selector | None = None
    credit: tuple[int, int] | None = None

    def __bool__(self) -> bool:
        return self.selector is not None or self.credit is not None


NONE = JoinRules()


def _bad(reason: str) -> OperationError:
    return OperationError(ResultCode.BAD_REQUEST, reason)


def parse_credit(raw: str) -> tuple[int, int]:
    """``COUNT,SIZE``: two whole numbers 0..MAX_CREDIT, not both 0 (OperationError 400)."""
    count_text, comma, size_text = raw.partition(",")
    numbers = []
    for text in (count_text.strip(), size_text.strip()):
        if not (comma and text.isascii() and text.isdigit() and len(text) <= 19):
            raise _bad(f"Credit must be COUNT,SIZE (two whole numbers): {raw[:40]!r}")
        numbers.append(int(text))
    count, size = numbers
    if count > MAX_CREDIT or size > MAX_CREDIT:
        raise _bad(f"Credit windows above {MAX_CREDIT}: {raw[:40]!r}")
    if count == 0 and size == 0:
        raise _bad("Credit 0,0 would never let a message through")
    return count, size


def read(frame: tmqp.Frame) -> JoinRules:
    """The JOIN's rules (NONE without the headers); OperationError (400) if bad."""
    if not frame.headers:
        return NONE
    text = header(frame, Header.SELECTOR)
    raw_credit = header(frame, Header.CREDIT)
    selector = None
    if text is not None and text.strip():
        try:
            selector = parse_selector(text)
        except SelectorError as exc:
            raise _bad(str(exc)) from None
    credit = parse_credit(raw_credit) if raw_credit is not None else None
    if selector is None and credit is None:
        return NONE
    return JoinRules(selector, credit)


def _applies(options: ChannelQueueOptions) -> bool:
    return options.message_delivery_handler == PER_MESSAGE


def check_channel(
    rules: PerMessageRules | None,
    queues: list[Any],
    queue_defaults: ChannelQueueOptions,
) -> PerMessageRules:
    """The per-message rules that will apply a JOIN's rules on a channel with ``queues``
    (its queues' defaults: ``queue_defaults``); OperationError (406) if none would."""
    if rules is None:
        raise OperationError(
            ResultCode.UNACCEPTABLE,
            "Selector and Credit need the per-message delivery handler, not registered here",
        )
    if queues:
        others = [q for q in queues if not _applies(q.options)]
        if others:
            raise OperationError(
                ResultCode.UNACCEPTABLE,
                f"Selector and Credit need MessageDeliveryHandler {PER_MESSAGE!r} on every "
                f"queue of the channel (queue {others[0].id} has another)",
            )
    elif not _applies(queue_defaults):
        raise OperationError(
            ResultCode.UNACCEPTABLE,
            f"Selector and Credit need MessageDeliveryHandler {PER_MESSAGE!r}: the channel "
            "has no queue and its queue options name another handler",
        )
    return rules


def window(rules: JoinRules, prefetch: int | None, default: int, most: int) -> int | None:
    """The engine window to join with: the JOIN's ``Prefetch`` if given; with credit and
    no ``Prefetch``, its count, at least ``default`` (so the credit windows decide) and
    at most ``most`` (the broker's ``max_prefetch``: memory stays bounded)."""
    if prefetch is not None or rules.credit is None:
        return prefetch
    return min(max(1, rules.credit[0], default), most)


def register(per: PerMessageRules, channel: str, client_id: str, rules: JoinRules) -> None:
    """Apply ``rules`` to ``client_id`` on ``channel`` (replacing any it had)."""
    per.set_selector(channel, client_id, rules.selector.selects if rules.selector else None)
    credit = rules.credit
    per.set_credit(channel, client_id, Credit(*credit) if credit is not None else None)
