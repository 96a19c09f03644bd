"""``ServerOptions.unacked_batch``: deliveries that need no acknowledge share delivery
batches (``broker.batch``) with a client that reads them, at most that many per message
(default 0: one per message, ``test_batch.py``'s
``test_batched_deliveries_only_to_a_client_that_asked``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import zmq

from broker import batch, tmqp
from broker.engine.engine import Engine
from broker.protocol import Header, MessageType
from broker.server.server import Server, ServerOptions

from .conftest import MakeClient
from .test_batch import Raw

Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def server(zctx: Ctx) -> Iterator[Server]:
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", unacked_batch=8)
    with Server(Engine(), options, context=zctx) as srv:
        yield srv


@pytest.fixture
def raw(zctx: Ctx, server: Server) -> Iterator[Callable[..., Raw]]:
    made: list[Raw] = []

    def make(properties: dict[str, str] | None = None) -> Raw:
        assert server.endpoint is not None
        made.append(Raw(zctx, server.endpoint, properties))
        return made[-1]

    yield make
    for peer in made:
        peer.close()


def _join(peer: Raw, channel: str) -> None:
    join = tmqp.Frame(message_type=MessageType.SERVER, pending_response=True, content_type=110,
                      message_id=f"j-{channel}", target=channel,
                      headers=((Header.PREFETCH, "100"),))  # fmt: skip
    peer.send(tmqp.encode(join)[0])
    assert peer.frame().message_id == f"j-{channel}"


def _read(peer: Raw, count: int) -> tuple[list[bytes], list[int]]:
    """``count`` deliveries' payloads, and the entries of each message they came in."""
    payloads: list[bytes] = []
    sizes: list[int] = []
    while len(payloads) < count:
        f = peer.frame()
        if f.message_type == MessageType.SERVER:
            assert f.content_type == batch.DELIVERIES
            inner = [tmqp.decode((d,)) for d in batch.unpack(f.payload, 1024)]
            assert all(isinstance(i, tmqp.Frame) and not i.pending_ack for i in inner)
            payloads += [i.payload for i in inner]  # type: ignore[union-attr]
            sizes.append(len(inner))
        else:
            assert f.message_type == MessageType.QUEUE and not f.pending_ack
            payloads.append(f.payload)
            sizes.append(1)
    return payloads, sizes


def test_deliveries_without_acknowledge_share_batches_of_at_most_the_option(
    raw: Callable[..., Raw], make_client: MakeClient
) -> None:
    reader = raw({"Batch-Deliveries": "64"})  # asks more than the server gives
    small = raw({"Batch-Deliveries": "3"})  # asks fewer
    old = raw()  # reads no batches
    producer = make_client()
    for peer, name in ((reader, "r"), (small, "s"), (old, "o")):
        producer.create_queue(name, 1, {"Status": 1})
        _join(peer, name)
    sent = {name: [f"{name}-{i}".encode() for i in range(200)] for name in ("r", "s", "o")}
    for name, payloads in sent.items():
        assert producer.push_many(name, 1, payloads, ack=False) == []
    payloads, sizes = _read(reader, 200)
    assert payloads == sent["r"]  # nothing lost or reordered
    assert max(sizes) == 8 and len(sizes) < 200  # batched, never more than the option
    payloads, sizes = _read(small, 200)
    assert payloads == sent["s"] and max(sizes) == 3
    payloads, sizes = _read(old, 200)
    assert payloads == sent["o"] and set(sizes) == {1}


@pytest.mark.parametrize("bad", [-1, 1025])
def test_the_option_is_bounded(bad: int) -> None:
    with pytest.raises(ValueError, match="unacked_batch"):
        ServerOptions(unacked_batch=bad)
