"""Fire-and-forget pushes (``Client.push``, ``push_many(ack=False)``: the client id's
``tmqp.encode_frame_sender``) against a broker that dies and comes back, and against a
broker that hands out an id no frame can carry.

A ``broker serve`` process is ``kill -9``ed while the producer's pushes sit unconfirmed;
it is restarted on the same endpoint: the producer's session comes back by itself, what it
pushes then reaches a consumer (acknowledged pushes too: nothing acknowledged is lost),
and ``close()`` reports what it sent into the dead broker (``UnconfirmedSends``, session
11's semantics), not more than that.  Every wait is a deadline polled for.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client, UnconfirmedSends
from tests.broker.test_client_session import PING, FakeBroker
from tests.broker.test_durable_serve import Broker
from tests.polling import wait_until
from zproto.errors import EncodeError

Ctx = zmq.Context[zmq.Socket[bytes]]
#: Pushes sent into the broker before it is killed (fewer than a poll-on-call client
#: sends between two looks at what arrived: none of them is confirmed before the kill).
BEFORE = 300
AFTER = 50


@pytest.mark.slow
def test_pushes_after_a_kill_9_and_restart_arrive_and_close_reports_the_ones_before(
    tmp_path: Path, zctx: Ctx
) -> None:
    broker = Broker(tmp_path / "data")
    broker.start()
    producer: Client | None = None
    try:
        with Client(broker.endpoint, context=zctx, timeout=20).connect() as admin:
            admin.create_queue("k9", 1, {"Status": 1})
        producer = Client(broker.endpoint, context=zctx, threaded=False, timeout=20,
                          peer_timeout=1.0, ping_interval=0.2, backoff=(0.05, 0.2),
                          linger=20)  # fmt: skip
        producer.connect()
        first_id = producer.client_id
        for i in range(BEFORE // 2):
            producer.push("k9", 1, b"before-%d" % i)
        producer.push_many("k9", 1, [b"before-b%d" % i for i in range(BEFORE // 2)], ack=False)
        # (a batch of push_many counts once: confirmations count frames sent)
        sent = producer.unconfirmed
        assert BEFORE // 2 < sent <= BEFORE
        broker.kill()  # (a memory queue: what it held is gone; its definition is kept)

        def lost() -> bool:
            producer.poll(0.05)  # its timers: silence past peer_timeout loses the session
            return not producer.connected

        assert wait_until(lost, 60), "the session outlived its killed broker"
        broker.start()
        with Client(broker.endpoint, context=zctx, timeout=20).connect() as consumer:
            consumer.join("k9")
            assert wait_until(lambda: (producer.poll(0.05), producer.connected)[1], 60)
            assert producer.client_id == first_id  # the broker takes the id it asks for
            for i in range(AFTER // 2):
                producer.push("k9", 1, b"after-%d" % i)
            producer.push_many("k9", 1, [b"after-b%d" % i for i in range(AFTER // 2)], ack=False)
            producer.push("k9", 1, b"acked", ack=True)  # answered: the ones before were read
            got: list[bytes] = []
            while len(got) < AFTER + 1:
                m = consumer.receive(timeout=30)
                assert m is not None, f"only {len(got)} of {AFTER + 1} after the restart"
                assert m.source == first_id
                got.append(bytes(m.payload))
            want = [b"after-%d" % i for i in range(AFTER // 2)]
            want += [b"after-b%d" % i for i in range(AFTER // 2)] + [b"acked"]
            assert got == want
            with pytest.raises(UnconfirmedSends) as caught:
                producer.close()
        assert caught.value.count == sent, caught.value
        assert "the session was lost" in str(caught.value)
    finally:
        if producer is not None:
            with contextlib.suppress(UnconfirmedSends):
                producer.close()
        if broker.proc is not None:
            broker.kill()


def test_a_client_id_no_frame_can_carry_refuses_each_push_and_sends_nothing(
    zctx: Ctx,
) -> None:
    """A broker that names the client with 256 characters (a frame's source holds 255
    octets): each fire-and-forget push is the codec's error naming the source, as a push
    with any other bad field, and nothing leaves."""
    broker = FakeBroker(zctx)
    client = Client(broker.endpoint, context=zctx, threaded=False, timeout=5)
    accepting = threading.Thread(target=lambda: broker.accept("i" * 256))
    accepting.start()
    try:
        client.connect()
        accepting.join(10)
        for _ in range(2):
            with pytest.raises(EncodeError, match="source"):
                client.push("ch", 1, b"p")
            with pytest.raises(EncodeError, match="source"):
                client.push_many("ch", 1, [b"p", b"q"], ack=False)
        assert client.unconfirmed == 0
        while broker.sock.poll(200):
            assert broker.sock.recv_multipart()[1] == PING
    finally:
        client.close()
        broker.sock.close(linger=0)
