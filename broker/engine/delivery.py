"""The delivery decision model: what happens to a queue message at each step.

Every hook of a :class:`DeliveryHandler` returns a :class:`Decision` (document section
"Decisions"): *allow* (go on to the next step), *save* (write the message to the store),
*put back* (re-enqueue at the start or end of the queue, bounded by the queue's
``PutBackLimit``) and *send ack* (acknowledge to the producer now: never, always, negative,
or only if the message is saved).  A producer gets at most one acknowledge per message.

Queues pick their handler by ``MessageDeliveryHandler`` key among the handlers registered
with the engine; ``None`` means the engine's default handler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from broker.engine.per_message import PER_MESSAGE, PerMessageRules

if TYPE_CHECKING:
    from broker.engine.channel import Client
    from broker.engine.message import Delivery, Message, QueueMessage
    from broker.engine.queue_view import QueueView as Queue
    from broker.message import Headers


class PutBack(Enum):
    """Whether (and where) a message returns to its queue."""

    NO = 0
    START = 1  # consumed first: an immediate retry
    END = 2  # consumed after every waiting message


class AckWhen(Enum):
    """Whether the step acknowledges the message to its producer."""

    NONE = 0
    ALWAYS = 1
    NEGATIVE = 2
    IF_SAVED = 3


@dataclass(frozen=True, slots=True)
class Decision:
    allow: bool = True
    save: bool = False
    put_back: PutBack = PutBack.NO
    send_ack: AckWhen = AckWhen.NONE


#: Go on; nothing else.
ALLOW = Decision()
#: Stop the flow here (the message is removed unless put back).
DENY = Decision(allow=False)
#: Go on and acknowledge the producer.
ALLOW_ACK = Decision(send_ack=AckWhen.ALWAYS)
#: Stop and negatively acknowledge the producer.
DENY_NACK = Decision(allow=False, send_ack=AckWhen.NEGATIVE)
#: Go on, save, and acknowledge the producer once saved.
SAVE_ACK = Decision(save=True, send_ack=AckWhen.IF_SAVED)
#: Put the message back at the front of the queue.
RETRY_FIRST = Decision(allow=False, put_back=PutBack.START)
#: Put the message back at the end of the queue.
RETRY_LAST = Decision(allow=False, put_back=PutBack.END)


class DeliveryHandler:
    """Hooks of the delivery workflow (the document's IMessageDeliveryHandler).

    Subclass and override what you need; every hook has a neutral implementation here
    (allow everything, never save, never put back, never acknowledge).  Hooks run inside
    the engine, synchronously: keep them fast and never block.  An exception raised by a
    hook is counted as a queue error and :meth:`exception_thrown` decides what follows.
    """

    #: Do the hooks only read what a message read back from the store has too (its
    #: sequence number, id, headers, payload), keeping no message object between calls?
    #: Then a queue on a store that pages (``broker.engine.queue.messages``: "Paging")
    #: pages its saved waiting messages out although this handler overrides the hooks
    #: that see them while they wait or are sent.  False: such a queue keeps them all.
    pages_safely = False
    #: Does :meth:`received_from_producer` answer from the queue's options and the
    #: message's header block alone (the same block object, the same answer), changing
    #: nothing?  Then a run of pushes sharing one block (``Queue.accept_many``: a STOMP
    #: run's SENDs share the door's stamp block) asks it once per block.  Read only from
    #: the class that defines the handler's ``received_from_producer`` (a subclass
    #: overriding that hook must say so again).
    received_by_headers = False

    def received_from_producer(
        self, queue: Queue, message: QueueMessage, sender: Client | None
    ) -> Decision:
        """A producer pushed ``message``; deny to reject it (the producer gets a nack)."""
        return ALLOW

    def begin_send(self, queue: Queue, message: QueueMessage) -> Decision:
        """The message is about to be sent to its consumers; deny to drop it."""
        return ALLOW

    def can_consumer_receive(self, queue: Queue, message: QueueMessage, receiver: Client) -> bool:
        """Filter consumers per message."""
        return True

    def looks_past(self, queue: Queue) -> bool:
        """May a message that no consumer with room may receive be passed over, so the
        messages behind it still reach the consumers that may receive them?  (False: it
        waits at the head of the queue, and the messages behind it wait too.)  Called
        only when :meth:`can_consumer_receive` refused every consumer with room."""
        return False

    def selects(self, queue: Queue, message: QueueMessage, receiver: Client) -> bool:
        """Does ``receiver`` want ``message`` at all, whatever its room, credit or turn
        (its selector, its first sequence)?  A message looked past that no consumer of
        the queue selects may be set aside: the next drains do not look at it again until
        the consumers or :meth:`selection` change.  Called only after :meth:`looks_past`."""
        return True

    def selection(self, queue: Queue) -> int:
        """A number that changes whenever :meth:`selects` may answer otherwise for a
        consumer of ``queue`` (a selector or first sequence set or removed)."""
        return 0

    def consumer_received(self, queue: Queue, delivery: Delivery, receiver: Client) -> Decision:
        """The message was handed to the wire for ``receiver``."""
        return ALLOW

    def consumer_receive_failed(
        self, queue: Queue, delivery: Delivery, receiver: Client
    ) -> Decision:
        """The receiver went away before acknowledging (disconnect)."""
        return ALLOW

    def end_send(self, queue: Queue, message: QueueMessage) -> Decision:
        """The message was sent to every chosen consumer."""
        return ALLOW

    def acknowledge_received(
        self, queue: Queue, ack: Message, delivery: Delivery, success: bool
    ) -> Decision:
        """A consumer acknowledged (``success``) or negatively acknowledged a delivery;
        ``ack`` is the acknowledge as a message (its id, and headers such as Nack-Reason)."""
        return ALLOW

    def acknowledge_timed_out(self, queue: Queue, delivery: Delivery) -> Decision:
        """No acknowledge arrived within the queue's AcknowledgeTimeout."""
        return ALLOW

    def message_timed_out(self, queue: Queue, message: QueueMessage) -> Decision:
        """The message waited longer than the queue's MessageTimeout."""
        return ALLOW

    def quiet_test(self, queue: Queue) -> Callable[[Headers], bool] | None:
        """A test of a message's header block that ``queue`` asks before each send and
        each acknowledge by taking: True means that for a message with that block, now,
        :meth:`begin_send` would answer ALLOW, :meth:`can_consumer_receive` True for
        every consumer, :meth:`consumer_received` ALLOW and a positive
        :meth:`acknowledge_received` ALLOW_ACK, none of them changing anything; the queue
        then calls none of the four for that send or acknowledge.  None (this one):
        always call them.  Asked once, when the queue takes the handler; honoured only
        from the class that itself defines the four hooks (a subclass overriding one of
        them must define this again).  The test must not raise (one that does counts as a
        queue error and means "call the hooks")."""
        return None

    def message_dequeued(self, queue: Queue, message: QueueMessage) -> None:
        """The message left the queue (sent, pulled, cleared or timed out)."""

    def exception_thrown(
        self, queue: Queue, message: QueueMessage | None, error: Exception
    ) -> Decision:
        """A hook raised ``error`` while processing ``message``."""
        return RETRY_LAST


class DefaultDeliveryHandler(DeliveryHandler):
    """At-least-once defaults that never lose a message silently.

    - Push: the producer (if it asked) is acknowledged on receipt when the queue does not
      request consumer acks; otherwise the first consumer ack/nack is relayed to it.
    - Nack from a consumer: the message goes back to the end of the queue.
    - Ack timeout or consumer gone before acking: back to the front (order kept).
    - Message timeout: removed, the waiting producer gets a ``timeout`` nack.
    - Past the queue's PutBackLimit a message is removed and its producer nacked.
    """

    def received_from_producer(
        self, queue: Queue, message: QueueMessage, sender: Client | None
    ) -> Decision:
        return ALLOW if queue.options.request_acknowledge else ALLOW_ACK

    def consumer_receive_failed(
        self, queue: Queue, delivery: Delivery, receiver: Client
    ) -> Decision:
        return RETRY_FIRST

    def acknowledge_received(
        self, queue: Queue, ack: Message, delivery: Delivery, success: bool
    ) -> Decision:
        return ALLOW_ACK if success else RETRY_LAST

    def acknowledge_timed_out(self, queue: Queue, delivery: Delivery) -> Decision:
        return RETRY_FIRST

    def message_timed_out(self, queue: Queue, message: QueueMessage) -> Decision:
        return DENY_NACK


class PersistentDeliveryHandler(DefaultDeliveryHandler):
    """Saves every message on receipt and confirms the producer once it is saved.

    The engine deletes a saved message from the store only when the message is finished:
    on the consumer's positive acknowledge when the queue requests acknowledges, or once
    sent when it does not (so a queue without acks is at-most-once after sending).
    Register it under a key (``Engine(handlers={"persistent": ...})``) and select it with
    the queue option ``MessageDeliveryHandler``.
    """

    def received_from_producer(
        self, queue: Queue, message: QueueMessage, sender: Client | None
    ) -> Decision:
        return SAVE_ACK


class PerMessageDeliveryHandler(DefaultDeliveryHandler):
    """The default rules plus :class:`~broker.engine.per_message.PerMessageRules`:
    ``persistent: true`` saves a message (a queue without acknowledges then confirms its
    producer once saved), an ``expires`` time come drops it when its queue reaches it, and
    groups, exclusive consumers and owned channels choose who may receive it."""

    #: The rules read headers, numbers and ids, and key what they keep by id.
    pages_safely = True
    #: ``persistent`` is read from the header block (and the answer from
    #: ``request_acknowledge``): nothing else.
    received_by_headers = True

    def __init__(self, wall_clock: Callable[[], float]) -> None:
        self.rules = PerMessageRules(wall_clock)

    def received_from_producer(
        self, queue: Queue, message: QueueMessage, sender: Client | None
    ) -> Decision:
        persistent = self.rules.persistent(message)
        if queue.options.request_acknowledge:
            return _SAVE if persistent else ALLOW
        return SAVE_ACK if persistent else ALLOW_ACK

    def begin_send(self, queue: Queue, message: QueueMessage) -> Decision:
        return DENY if self.rules.expired(message) else ALLOW

    def can_consumer_receive(self, queue: Queue, message: QueueMessage, receiver: Client) -> bool:
        return self.rules.eligible(queue, message, receiver)

    def looks_past(self, queue: Queue) -> bool:
        return self.rules.looks_past(queue.channel.name)

    def selects(self, queue: Queue, message: QueueMessage, receiver: Client) -> bool:
        return self.rules.selects(queue.channel.name, message, receiver.id)

    def selection(self, queue: Queue) -> int:
        return self.rules.selection

    def quiet_test(self, queue: Queue) -> Callable[[Headers], bool] | None:
        # no rule in force and no expires/message_group in the block: the four hooks
        # below would read the rules and change nothing (``PerMessageRules.quiet``)
        return self.rules.quiet

    def consumer_received(self, queue: Queue, delivery: Delivery, receiver: Client) -> Decision:
        self.rules.sent(queue, delivery, receiver)
        return ALLOW

    def acknowledge_received(
        self, queue: Queue, ack: Message, delivery: Delivery, success: bool
    ) -> Decision:
        self.rules.settled(queue, delivery)
        return ALLOW_ACK if success else RETRY_LAST  # (the default's rule, without super())

    def consumer_receive_failed(
        self, queue: Queue, delivery: Delivery, receiver: Client
    ) -> Decision:
        self.rules.settled(queue, delivery)
        return super().consumer_receive_failed(queue, delivery, receiver)

    def acknowledge_timed_out(self, queue: Queue, delivery: Delivery) -> Decision:
        self.rules.settled(queue, delivery)
        return super().acknowledge_timed_out(queue, delivery)


#: Save, acknowledge nobody yet (a queue with consumer acknowledges relays them).
_SAVE = Decision(save=True)


def per_message_rules(handlers: Mapping[str, DeliveryHandler]) -> PerMessageRules | None:
    """The rules of the ``per-message`` handler among ``handlers`` (None: not registered,
    or registered as another kind of handler)."""
    handler = handlers.get(PER_MESSAGE)
    return handler.rules if isinstance(handler, PerMessageDeliveryHandler) else None
