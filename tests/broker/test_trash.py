"""A queue's trash: expired, past the put-back limit, nacked and not put back; listed,
resubmitted and purged from the client and ``broker trash`` (live Server + Engine)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from broker.cli import main
from broker.client.blocking import Client, RemoteError
from broker.engine.auth import ALL_ACTIONS, Action, TokenAuthorizer
from broker.engine.delivery import DENY, Decision, DefaultDeliveryHandler
from broker.engine.engine import Engine
from broker.protocol import Header, ResultCode
from broker.server.server import Server, ServerOptions
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]


class NoRetry(DefaultDeliveryHandler):
    """A nack ends the delivery: nothing is put back."""

    def acknowledge_received(self, queue: Any, ack: Any, delivery: Any, success: bool) -> Decision:
        return super().acknowledge_received(queue, ack, delivery, success) if success else DENY


@pytest.fixture
def server(zctx: Ctx) -> Iterator[Server]:
    engine = Engine(handlers={"no-retry": NoRetry()})
    with Server(engine, ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        yield srv


@pytest.fixture
def make_client(zctx: Ctx, server: Server) -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(**kw: Any) -> Client:
        assert server.endpoint is not None
        client = Client(server.endpoint, context=zctx, timeout=10, **kw).connect()
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def trashed(c: Client, channel: str, queue: int) -> list[tuple[int, str, bytes]]:
    return [
        (b.sequence, dict(b.message.headers)[Header.TRASH_REASON], bytes(b.message.payload))
        for b in c.trash_list(channel, queue)
    ]


def test_expired_messages_go_to_the_trash_and_can_be_resubmitted(
    make_client: Callable[..., Client],
) -> None:
    c = make_client()
    c.create_queue("q", 1, {"Status": "Pull", "MessageTimeout": 50})
    for payload in ("a", "b", "c"):
        c.push("q", 1, payload, ack=False)
    assert wait_until(lambda: len(trashed(c, "q", 1)) == 3)
    assert trashed(c, "q", 1) == [(1, "expired", b"a"), (2, "expired", b"b"), (3, "expired", b"c")]
    assert c.browse("q", 1, 0) == []  # gone from the queue itself
    c.update_queue("q", 1, {"MessageTimeout": 0})
    assert c.trash_resubmit("q", 1, [2]) == 1
    got = c.browse("q", 1, 0)
    assert [(b.sequence, bytes(b.message.payload)) for b in got] == [(4, b"b")]  # a new number
    assert [s for s, _, _ in trashed(c, "q", 1)] == [1, 3]
    assert c.trash_purge("q", 1, [1]) == 1
    assert c.trash_purge("q", 1) == 1
    assert trashed(c, "q", 1) == []
    assert c.queue_info("q", 1)["Messages"] == 1


def test_past_the_put_back_limit_and_nacked_without_put_back(
    make_client: Callable[..., Client],
) -> None:
    producer, consumer = make_client(), make_client()
    producer.create_queue("jobs", 1, {"Status": "Push", "RequestAcknowledge": True,
                                      "PutBackLimit": 1})  # fmt: skip
    producer.create_queue("jobs", 2, {"Status": "Push", "RequestAcknowledge": True,
                                      "MessageDeliveryHandler": "no-retry"})  # fmt: skip
    consumer.join("jobs")
    producer.push("jobs", 1, "flaky")
    for _ in range(2):  # nacked, put back once; nacked again: past the limit
        m = consumer.receive(timeout=10)
        assert m is not None and m.payload == b"flaky"
        consumer.nack(m, "bad-input")
    assert wait_until(lambda: trashed(producer, "jobs", 1) == [(1, "put-back-limit", b"flaky")])
    producer.push("jobs", 2, "refused")
    m = consumer.receive(timeout=10)
    assert m is not None and m.payload == b"refused"
    consumer.nack(m, "bad-input")
    assert wait_until(lambda: trashed(producer, "jobs", 2) == [(1, "bad-input", b"refused")])
    assert consumer.receive(timeout=0.3) is None  # nothing redelivered
    # resubmitted, it is delivered again
    assert producer.trash_resubmit("jobs", 2) == 1
    again = consumer.receive(timeout=10)
    assert again is not None and again.payload == b"refused"
    consumer.ack(again)


def test_a_nack_asking_not_to_be_put_back_goes_to_the_trash_whatever_the_handler(
    make_client: Callable[..., Client],
) -> None:
    """``Put-Back: no`` (``nack(put_back=False)``): the default handler would put it back;
    the message goes to the trash with the nack reason and its waiting producer is told."""
    producer, consumer = make_client(), make_client()
    producer.create_queue("jobs", 1, {"Status": "Push", "RequestAcknowledge": True})
    consumer.join("jobs")
    producer.push("jobs", 1, "retried")
    m = consumer.receive(timeout=10)
    assert m is not None
    consumer.nack(m, "busy-now")  # a plain nack: put back, delivered again
    again = consumer.receive(timeout=10)
    assert again is not None and again.payload == b"retried"
    consumer.ack(again)
    waiting = producer.push_async("jobs", 1, "poison")
    m = consumer.receive(timeout=10)
    assert m is not None and m.payload == b"poison"
    consumer.nack(m, "cannot-parse", put_back=False)
    with pytest.raises(RemoteError, match="cannot-parse"):
        waiting.result(timeout=10)
    assert trashed(producer, "jobs", 1) == [(2, "cannot-parse", b"poison")]
    info = producer.queue_info("jobs", 1)
    assert (info["Messages"], info["Acks"], info["NegativeAcks"]) == (0, 1, 2)
    assert producer.trash_resubmit("jobs", 1) == 1
    back = consumer.receive(timeout=10)
    assert back is not None and back.payload == b"poison"
    consumer.ack(back)


def test_trash_limit_keeps_the_latest(make_client: Callable[..., Client]) -> None:
    c = make_client()
    c.create_queue("q", 1, {"Status": "Pull", "MessageTimeout": 20, "TrashLimit": 2})
    for i in range(4):
        c.push("q", 1, f"m{i}")
    assert wait_until(lambda: c.queue_info("q", 1)["Messages"] == 0)
    assert [s for s, _, _ in trashed(c, "q", 1)] == [3, 4]
    c.create_queue("q", 2, {"Status": "Pull", "MessageTimeout": 20, "TrashLimit": 0})
    c.push("q", 2, "x")
    assert wait_until(lambda: c.queue_info("q", 2)["Messages"] == 0)
    assert trashed(c, "q", 2) == []  # no trash at all


def test_a_resubmit_the_queue_refuses_leaves_the_rest_in_the_trash(
    make_client: Callable[..., Client],
) -> None:
    c = make_client()
    c.create_queue("q", 1, {"Status": "Pull", "MessageTimeout": 20})
    for i in range(3):
        c.push("q", 1, f"m{i}")
    assert wait_until(lambda: len(trashed(c, "q", 1)) == 3)
    c.update_queue("q", 1, {"MessageTimeout": 0, "MessageLimit": 1})
    assert c.trash_resubmit("q", 1) == 1
    assert [s for s, _, _ in trashed(c, "q", 1)] == [2, 3]


def test_bad_requests_and_permissions(zctx: Ctx) -> None:
    reader = {Action.BROWSE, Action.PUSH, Action.QUEUE_CREATE, Action.CHANNEL_CREATE}
    auth = TokenAuthorizer({"admin": ALL_ACTIONS, "reader": reader})
    with Server(Engine(authorizer=auth), ServerOptions(endpoint="tcp://127.0.0.1:*"),
                context=zctx) as srv:  # fmt: skip
        assert srv.endpoint is not None
        with (
            Client(srv.endpoint, context=zctx, token="admin", timeout=10) as admin,
            Client(srv.endpoint, context=zctx, token="reader", timeout=10) as reader_c,
        ):
            admin.create_queue("q", 1, {"Status": "Pull", "MessageTimeout": 20})
            admin.push("q", 1, "x")
            assert wait_until(lambda: len(reader_c.trash_list("q", 1)) == 1)
            for call in (lambda: reader_c.trash_purge("q", 1),
                         lambda: reader_c.trash_resubmit("q", 1)):  # fmt: skip
                with pytest.raises(RemoteError) as err:
                    call()
                assert err.value.code == ResultCode.UNAUTHORIZED
            with pytest.raises(RemoteError) as err:
                admin.trash_list("q", 9)
            assert err.value.code == ResultCode.NOT_FOUND


def test_trash_cli_and_bad_sequences(
    make_client: Callable[..., Client], server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    c = make_client()
    c.create_queue("cli", 1, {"Status": "Pull", "MessageTimeout": 20})
    for payload in ("one", "two", "three"):
        c.push("cli", 1, payload)
    assert wait_until(lambda: len(c.trash_list("cli", 1)) == 3)
    c.update_queue("cli", 1, {"MessageTimeout": 0})
    assert server.endpoint is not None
    at = ("--connect", server.endpoint)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = run("trash", "list", *at, "cli", "1")
    assert code == 0 and out == "1\texpired\tone\n2\texpired\ttwo\n3\texpired\tthree\n"
    code, out, _ = run("trash", "list", *at, "cli", "1", "--json", "--limit", "1")
    record = json.loads(out)
    assert code == 0 and record["reason"] == "expired" and record["sequence"] == 1
    assert record["payload"] == "one" and record["headers"] == {"Trash-Reason": "expired"}
    code, out, _ = run("trash", "resubmit", *at, "cli", "1", "--seq", "1", "--seq", "3")
    assert code == 0 and out == "2\n"
    code, out, _ = run("trash", "purge", *at, "cli", "1")
    assert code == 0 and out == "1\n"
    assert [bytes(b.message.payload) for b in c.browse("cli", 1, 0)] == [b"one", b"three"]
    code, out, err = run("trash", "purge", *at, "cli", "1", "--seq", "0")
    assert code == 2 and len(err.strip().splitlines()) == 1
    code, out, err = run("trash", "list", *at, "nope", "1")
    assert code == 1 and "404" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(RemoteError) as bad:
        c._sequence_op(211, "cli", 1, ((Header.SEQUENCES, "1,x"),), int, None)
    assert bad.value.code == ResultCode.BAD_REQUEST
    assert len(c.browse("cli", 1, 0)) == 2  # still serving, nothing changed
