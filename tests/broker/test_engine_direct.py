"""Direct messages (id, @name:, @type:), responses and request tracking."""

from __future__ import annotations

from broker import tmqp
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.protocol import Header, MessageType, NackReason, ResultCode, header
from tests.broker.engine_kit import Kit


def direct(
    kit: Kit,
    sender: str,
    target: str,
    payload: bytes = b"hi",
    *,
    mid: str = "",
    response: bool = False,
    ack: bool = False,
    first: bool = False,
) -> None:
    kit.send(
        sender,
        tmqp.Frame(
            message_type=MessageType.DIRECT,
            target=target,
            message_id=mid,
            payload=payload,
            content_type=77,
            pending_response=response,
            pending_ack=ack,
            first_acquirer=first,
        ),
    )


def respond(kit: Kit, sender: str, request: tmqp.Frame, payload: bytes, code: int = 0) -> None:
    kit.send(
        sender,
        tmqp.Frame(
            message_type=MessageType.RESPONSE,
            target=request.source,
            message_id=request.message_id,
            content_type=code,
            payload=payload,
        ),
    )


def test_direct_by_id_is_forwarded_with_the_sender_as_source() -> None:
    kit = Kit()
    a, b = kit.connect("a"), kit.connect("b")
    direct(kit, a, b, b"hello", mid="d1")
    (got,) = kit.take(b)
    assert (got.message_type, got.source, got.target, got.content_type) == (
        MessageType.DIRECT,
        a,
        b,
        77,
    )
    assert got.payload == b"hello"


def test_direct_by_name_and_type_reaches_every_match_oldest_first() -> None:
    kit = Kit()
    sender = kit.connect("sender", type="worker")
    w1 = kit.connect("w1", name="mailer", type="worker")
    w2 = kit.connect("w2", name="mailer", type="worker")
    other = kit.connect("o", name="other", type="web")
    direct(kit, sender, "@name:mailer")
    assert [len(kit.take(c)) for c in (w1, w2, other, sender)] == [1, 1, 0, 0]
    direct(kit, sender, "@type:worker")  # the sender is a worker too but is skipped
    assert [len(kit.take(c)) for c in (w1, w2, other, sender)] == [1, 1, 0, 0]
    direct(kit, sender, "@type:worker", first=True)
    assert [len(kit.take(c)) for c in (w1, w2)] == [1, 0]
    kit.disconnect(w1)
    direct(kit, sender, "@name:mailer", first=True)
    assert len(kit.take(w2)) == 1


def test_unknown_receiver_answers_404_response_or_nack() -> None:
    kit = Kit()
    a = kit.connect("a")
    direct(kit, a, "ghost", mid="r1", response=True)
    (reply,) = kit.take(a)
    assert (reply.message_type, reply.content_type, reply.message_id) == (
        MessageType.RESPONSE,
        ResultCode.NOT_FOUND,
        "r1",
    )
    direct(kit, a, "@type:none", mid="r2", ack=True)
    (nack,) = kit.take(a)
    assert nack.message_type == MessageType.ACK and nack.high_priority
    assert header(nack, Header.NACK_REASON) == NackReason.NO_CONSUMERS
    direct(kit, a, "ghost")  # waits for nothing: silence
    assert kit.take(a) == []


def test_many_outstanding_requests_are_answered_independently() -> None:
    kit = Kit()
    client, server = kit.connect("client"), kit.connect("server")
    for n in range(5):
        direct(kit, client, server, b"q%d" % n, mid=f"req{n}", response=True)
    requests = kit.take(server)
    assert kit.engine.stats()["pending_requests"] == 5
    for request in reversed(requests):
        respond(kit, server, request, b"answer-" + request.payload)
    replies = kit.take(client)
    assert [r.message_id for r in replies] == [f"req{n}" for n in reversed(range(5))]
    assert all(r.source == server and r.message_type == MessageType.RESPONSE for r in replies)
    assert replies[0].payload == b"answer-q4"
    assert kit.engine.stats()["pending_requests"] == 0


def test_receiver_leaving_before_answering_fails_the_request_with_581() -> None:
    kit = Kit()
    client, server = kit.connect("client"), kit.connect("server")
    direct(kit, client, server, mid="slow", response=True)
    kit.take(server)
    kit.disconnect(server)
    (reply,) = kit.take(client)
    assert (reply.message_type, reply.content_type, reply.message_id) == (
        MessageType.RESPONSE,
        ResultCode.SEND_ERROR,
        "slow",
    )


def test_one_of_several_receivers_leaving_does_not_fail_the_request() -> None:
    kit = Kit()
    client = kit.connect("client")
    s1, s2 = kit.connect("s1", type="svc"), kit.connect("s2", type="svc")
    direct(kit, client, "@type:svc", mid="q", response=True)
    kit.take(s1)
    (request,) = kit.take(s2)
    kit.disconnect(s1)
    assert kit.take(client) == []
    respond(kit, s2, request, b"ok")
    (reply,) = kit.take(client)
    assert reply.payload == b"ok" and reply.content_type == 0


def test_requester_leaving_forgets_its_requests() -> None:
    kit = Kit()
    client, server = kit.connect("client"), kit.connect("server")
    direct(kit, client, server, mid="q", response=True)
    (request,) = kit.take(server)
    kit.disconnect(client)
    assert kit.engine.stats()["pending_requests"] == 0
    respond(kit, server, request, b"too late")  # dropped quietly
    assert kit.take(server) == []


def test_direct_acknowledge_is_passed_to_the_sender() -> None:
    kit = Kit()
    a, b = kit.connect("a"), kit.connect("b")
    direct(kit, a, b, mid="d", ack=True)
    (got,) = kit.take(b)
    kit.send(
        b,
        tmqp.Frame(
            message_type=MessageType.ACK,
            high_priority=True,
            target=got.source,
            message_id=got.message_id,
        ),
    )
    (ack,) = kit.take(a)
    assert (ack.message_type, ack.message_id, ack.source) == (MessageType.ACK, "d", b)


def test_too_many_outstanding_requests_is_busy() -> None:
    kit = Kit(config=BrokerConfig(limits=Limits(max_pending_requests=2)))
    client, server = kit.connect("client"), kit.connect("server")
    for n in range(3):
        direct(kit, client, server, mid=f"q{n}", response=True)
    assert len(kit.take(server)) == 2
    (busy,) = kit.take(client)
    assert busy.content_type == ResultCode.BUSY and busy.message_id == "q2"
