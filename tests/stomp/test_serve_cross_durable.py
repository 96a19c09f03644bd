"""Issue 11: STOMP <-> TMQP cross-delivery on one durable queue of a real ``broker serve
--data DIR --stomp ...``, through kill -9 and restarts: a persistent message from each
door (a STOMP SEND ``persistent:true`` with its RECEIPT, a TMQP push with ``persistent:
true`` and its acknowledge) survives a kill -9; a STOMP consumer gets both in order and
acknowledges the first (``client-individual``, then DISCONNECT with a receipt); after a
second kill -9 a TMQP consumer gets only the other one: nothing acknowledged by either
door is lost or comes back (a TMQP push to a queue that requests acknowledges is
answered once a consumer acknowledged it: the test pushes without waiting, sees it held,
and lets a STOMP RECEIPT, which waits for every save made so far, mark it durable)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import zmq

from broker.client.blocking import Client
from broker.stomp.frames import Command
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve, serve_factory

__all__ = ["serve_factory"]  # (the fixture, imported for pytest)

QUEUE = "cross"


def _stomp(server: Serve) -> Raw:
    raw = Raw(server.port)
    raw.connect()
    return raw


def _tmqp(server: Serve) -> str:
    """The TMQP endpoint of the process running now (a restart binds another port)."""
    args = [str(arg) for arg in server.proc.args]  # type: ignore[union-attr]
    return args[args.index("--bind") + 1]


def test_persistent_messages_of_both_doors_survive_kill_9_and_acks_of_stomp_hold(
    serve_factory: Callable[..., Serve],
    tmp_path: Path,
    zctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    server = serve_factory("--data", str(tmp_path / "data"))
    producer = _stomp(server)
    producer.send(
        f"SEND\ndestination:/queue/{QUEUE}\npersistent:true\nn:stomp\nreceipt:r\n\n"
        "from stomp\x00".encode()
    )
    assert producer.next().header("receipt-id") == "r"
    producer.close()
    with Client(_tmqp(server), context=zctx, timeout=30).connect() as tmqp:
        # (a queue with RequestAcknowledge answers a TMQP producer's ack=True once a
        # consumer acknowledged: a plain push, then a look that it is held)
        tmqp.push(QUEUE, 0, b"from tmqp", headers=(("persistent", "true"), ("n", "tmqp")))
        assert wait_until(lambda: len(tmqp.browse(QUEUE, 0, 0)) == 2)
    sync = _stomp(server)  # a RECEIPT leaves once every save made so far is durable
    sync.send(b"SEND\ndestination:/queue/sync\nreceipt:synced\n\n\x00")
    assert sync.next().header("receipt-id") == "synced"
    sync.close()
    server.kill9()
    server.restart()
    consumer = _stomp(server)
    consumer.send(
        f"SUBSCRIBE\nid:s\ndestination:/queue/{QUEUE}\nack:client-individual\n"
        "receipt:sub\n\n\x00".encode()
    )
    assert consumer.next().header("receipt-id") == "sub"
    first, second = consumer.next(), consumer.next()
    assert [first.command, second.command] == [Command.MESSAGE, Command.MESSAGE]
    assert [first.body, second.body] == [b"from stomp", b"from tmqp"]
    assert [first.header("n"), second.header("n")] == ["stomp", "tmqp"]
    consumer.send(f"ACK\nid:{first.header('ack')}\n\n\x00".encode())
    consumer.send(b"DISCONNECT\nreceipt:bye\n\n\x00")
    assert consumer.next().header("receipt-id") == "bye"  # the ACK is durable now
    consumer.close()
    server.kill9()
    server.restart()
    with Client(_tmqp(server), context=zctx, timeout=30).connect() as tmqp:
        held = tmqp.browse(QUEUE, 0, 0)  # the STOMP-acknowledged one stays gone
        assert [bytes(b.message.payload) for b in held] == [b"from tmqp"]
        tmqp.join(QUEUE)
        got = tmqp.receive(timeout=30)
        assert got is not None and bytes(got.payload) == b"from tmqp"
        tmqp.ack(got)
