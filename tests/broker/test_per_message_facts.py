"""The per-message rules a message's headers hold (``broker.engine.per_message.facts``),
read once per header block: hand-made vectors, and a hostile ``expires`` value through
a real engine."""

from __future__ import annotations

from broker.engine.delivery import PerMessageDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.options import ChannelQueueOptions
from broker.engine.per_message import FACTS_KEPT, PER_MESSAGE, facts
from broker.message import Message
from broker.protocol import ConnectionInfo, QueueStatus, Tracked


def test_facts_read_the_first_of_each_name_without_case() -> None:
    assert facts(()) == (False, None, None)
    assert facts((("Stomp-User", "u"), ("Stomp-Timestamp", "1"))) == (False, None, None)
    headers = (
        ("PERSISTENT", "True"),
        ("persistent", "false"),  # the first one counts
        ("Expires", "1700000000000"),
        ("expires", "5"),
        ("Message_Group", "g1"),
        ("message_group", "g2"),
    )
    assert facts(headers) == (True, 1_700_000_000_000, "g1")
    assert facts((("persistent", "yes"),)) == (False, None, None)


def test_an_expires_that_is_not_a_plain_number_is_ignored() -> None:
    for value in ("x", "-1", "1.5", "", "²", "٣", "1" * 21, " 5"):
        assert facts((("expires", value),))[1] is None, value
    assert facts((("expires", "0"),))[1] == 0
    assert facts((("expires", "9" * 20),))[1] == int("9" * 20)


def _engine() -> tuple[Engine, str, str]:
    handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
    engine = Engine(handlers={PER_MESSAGE: handler})
    options = ChannelQueueOptions(
        status=QueueStatus.ROUND_ROBIN,
        request_acknowledge=True,
        message_delivery_handler=PER_MESSAGE,
    )
    engine.create_channel("q")
    engine.create_queue("q", 0, options)
    producer, _ = engine.connect(ConnectionInfo(name="p"), 0.0)
    consumer, _ = engine.connect(ConnectionInfo(name="c"), 0.0)
    engine.subscribe(consumer, "q", 0.0)
    return engine, producer, consumer


def _delivered(out: list, consumer: str) -> list[bytes]:  # type: ignore[type-arg]
    return [bytes(o[1].payload) for o in out if o.__class__ is Tracked and o[0] == consumer]


def test_a_message_whose_expires_is_a_superscript_digit_is_delivered() -> None:
    """``"²".isdigit()`` is true but ``int("²")`` raises: the value is ignored, as any
    other that is not a number, and the message goes (it was lost before)."""
    engine, producer, consumer = _engine()
    out: list = []  # type: ignore[type-arg]
    for i, value in enumerate(("²", "x", "99999999999999")):
        m = Message(f"m{i}", producer, "q", 0, headers=(("expires", value),), payload=b"%d" % i)
        out += engine.publish(producer, m, 0.0, wants_response=True)
    assert _delivered(out, consumer) == [b"0", b"1", b"2"]
    assert engine.errors == 0


def test_the_facts_kept_are_bounded_and_a_message_past_them_is_read_again() -> None:
    engine, producer, consumer = _engine()
    handler = engine.handlers[PER_MESSAGE]
    assert isinstance(handler, PerMessageDeliveryHandler)
    out: list = []  # type: ignore[type-arg]
    messages = [
        Message(f"m{i}", producer, "q", 0, headers=(("n", str(i)),), payload=b"%d" % i)
        for i in range(FACTS_KEPT * 2 + 3)
    ]
    messages.append(
        Message("g", producer, "q", 0, headers=(("message_group", "a"),), payload=b"g")
    )
    out += engine.publish_many(producer, messages, 0.0)[0]
    assert len(handler.rules._facts) <= FACTS_KEPT
    assert _delivered(out, consumer)[-1] == b"g"
    assert handler.rules.group_owner("q", "a") == consumer


def test_the_last_block_remembered_never_answers_for_another_message() -> None:
    """``_facts_of`` answers a message whose header block is the one asked last without
    a look-up: messages alternating between blocks (shared objects, equal copies, none)
    through a real engine still get their own rules: the expired one is dropped, each
    group held by the consumer until its messages are acknowledged."""
    engine, producer, consumer = _engine()
    handler = engine.handlers[PER_MESSAGE]
    assert isinstance(handler, PerMessageDeliveryHandler)
    old = (("expires", "1"),)  # 1970: expired
    grouped = (("message_group", "a"),)
    blocks = [old, grouped, (), (("message_group", "a"),), old, grouped, (("x", "1"),)]
    messages = [
        Message(f"m{i}", producer, "q", 0, headers=h, payload=b"%d" % i)
        for i, h in enumerate(blocks)
    ]
    out = engine.publish_many(producer, messages, 0.0)[0]
    assert _delivered(out, consumer) == [b"1", b"2", b"3", b"5", b"6"]
    assert handler.rules.expired_count == 2
    assert handler.rules.group_owner("q", "a") == consumer
    for m in messages[1:4:2] + messages[5:6]:  # the group's three deliveries settled
        engine.acknowledge(consumer, "q", 0, m.message_id, 0.0)
    assert handler.rules.group_owner("q", "a") is None
