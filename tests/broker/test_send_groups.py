"""The send path's delivery batches (``broker.server.send``) over a real ROUTER: whatever
the engine output, each consumer reads its frames in the order sent, every tracked
delivery counted once, and no delivery batch beyond its bounds (the consumer's
``Batch-Deliveries``, ``unacked_batch`` entries and ``unacked_batch_octets`` octets for
deliveries without acknowledge, ``batch.DELIVERY_OCTETS`` for acknowledged ones, each
delivery checked against its own kind's bounds as it joins).  Seeded random outputs:
deliveries with and without acknowledge, of sizes around the bounds, the same frame
twice, other frames between them, a client that is gone; fed in pieces, flushed now and
then (session 15 gave runs of deliveries to one consumer a loop of their own:
``SendPath._extend_group``)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import zmq

from broker import batch, tmqp
from broker.engine.tmqp_door import WIRE
from broker.message import Message
from broker.protocol import MessageType, Outgoing, Tracked
from broker.server.options import ServerOptions
from broker.server.send import Peer, PeerState, SendPath
from tests.broker.test_batch import push_frame
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
#: Consumers and the deliveries one message to each may carry (0: one each).
BATCHES = {"c0": 5, "c1": 0, "c2": 1024}


@pytest.fixture
def ctx() -> Iterator[Ctx]:
    context: Ctx = zmq.Context()
    yield context
    context.term()


def _delivery(rnd: random.Random, n: int, ack: bool, size: int) -> Message:
    octets = push_frame(f"m{n}", 1, b"x" * size, channel="q", ack=ack)
    messages, bad = tmqp.decode_message_records([octets], Message, WIRE)
    assert not bad
    return messages[0]


def _outputs(rnd: random.Random) -> list[list[Outgoing]]:
    pieces: list[list[Outgoing]] = []
    n = 0
    for _ in range(rnd.randrange(2, 6)):
        piece: list[Outgoing] = []
        for _ in range(rnd.randrange(0, 400)):
            client = rnd.choice(["c0", "c0", "c2", "c2", "c1", "gone"])
            if rnd.random() < 0.9:
                size = rnd.choice([0, 90, 100, 100, 700, 1900, 2100, 5000])
                m = _delivery(rnd, n, rnd.random() < 0.3, size)
                n += 1
                piece.append(Tracked(client, m))
                if rnd.random() < 0.05:
                    piece.append(Tracked(client, m))  # the same frame again
            else:
                reply = tmqp.Frame(message_type=MessageType.RESPONSE, message_id=f"r{n}")
                n += 1
                piece.append(Outgoing(client, reply))
        pieces.append(piece)
    return pieces


def _wire(out: Outgoing) -> bytes:
    frame = out.frame
    if isinstance(frame, Message):
        assert frame.wire is not None
        return bytes(frame.wire[1])
    return tmqp.encode(frame)[0]


@pytest.mark.parametrize("seed", range(6))
def test_delivery_batches_keep_order_counts_and_bounds(ctx: Ctx, seed: int) -> None:
    rnd = random.Random(seed)
    options = ServerOptions(
        unacked_batch=rnd.choice([1, 4, 64]),
        unacked_batch_octets=rnd.choice([256, 2048, 8192]),
        send_batch=rnd.choice([1, 7, 256]),
    )
    router = ctx.socket(zmq.ROUTER)
    router.router_mandatory = True
    router.bind("tcp://127.0.0.1:*")
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
    dealers: dict[str, zmq.Socket[bytes]] = {}
    sender = SendPath(options)
    sender.router = router
    sender.fast_send = router.send
    try:
        for cid, most in BATCHES.items():
            dealer = ctx.socket(zmq.DEALER)
            dealer.routing_id = cid.encode()
            dealer.connect(endpoint)
            dealers[cid] = dealer
            peer = Peer(cid.encode(), 0.0)
            peer.client_id = cid
            peer.state = PeerState.READY
            peer.batch = most
            sender.by_client[cid] = peer
            sender.batching += bool(most)
        # connected once the ROUTER can route to each (router_mandatory: else it raises)
        for cid, dealer in dealers.items():
            dealer.send(b"hello")
            assert wait_until(lambda: router.poll(0) != 0)
            assert router.recv_multipart()[0] == cid.encode()

        sent: dict[str, list[bytes]] = {cid: [] for cid in BATCHES}
        tracked: dict[str, int] = {cid: 0 for cid in BATCHES}
        for piece in _outputs(rnd):
            for out in piece:
                if out.client_id in sent:
                    sent[out.client_id].append(_wire(out))
                    tracked[out.client_id] += out.__class__ is Tracked and bool(_wire(out))
            sender.send_now(piece)
            if rnd.random() < 0.5:
                sender.flush_out()
        sender.flush_out()
        assert not sender.blocked  # (nothing here fills a pipe)

        counted = sender.take_transmitted()
        for cid, dealer in dealers.items():
            want = [w for w in sent[cid] if w]  # (an empty frame is dropped and counted)
            got: list[bytes] = []
            reader = _Reader(dealer, BATCHES[cid], options, got, len(want))
            assert wait_until(reader.done), f"{cid}: {len(got)} of {len(want)} frames"
            assert got == want, cid
            assert counted.get(cid, 0) == tracked[cid], cid
    finally:
        for dealer in dealers.values():
            dealer.close(linger=0)
        router.close(linger=0)


class _Reader:
    """What a consumer's DEALER has to read, a delivery batch split into its entries
    (each batch checked against its bounds), added to ``got``; done once it holds
    ``wanted`` frames."""

    def __init__(
        self, dealer: zmq.Socket[bytes], most: int, options: ServerOptions, got: list[bytes],
        wanted: int,
    ) -> None:  # fmt: skip
        self.dealer, self.most, self.options = dealer, most, options
        self.got, self.wanted = got, wanted

    def done(self) -> bool:
        while self.dealer.poll(0):
            octets = self.dealer.recv()
            frame = tmqp.decode((octets,))
            if type(frame) is tmqp.Frame and frame.content_type == batch.DELIVERIES:
                entries = batch.unpack(frame.payload, 4096)
                _check_bounds(entries, self.most, self.options)
                self.got.extend(entries)
            else:
                self.got.append(octets)
        return len(self.got) >= self.wanted


def _check_bounds(entries: list[bytes], most: int, options: ServerOptions) -> None:
    """Each entry joined a batch within its own kind's bounds, counting what came before
    it: an acknowledged one up to the consumer's ``most`` and ``DELIVERY_OCTETS``, one
    without acknowledge also up to ``unacked_batch`` entries and ``unacked_batch_octets``
    (so a consumer that stops reading holds at most that many of them per message)."""
    assert 1 < len(entries) <= most
    octets = 0
    for count, entry in enumerate(entries, 1):
        octets += len(entry) + 4
        if entry[1] & 64:
            assert octets <= batch.DELIVERY_OCTETS
        else:
            assert count <= options.unacked_batch
            assert octets <= options.unacked_batch_octets
