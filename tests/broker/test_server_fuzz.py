"""Bad-frame fuzzing of a live broker (real engine): it keeps serving everyone."""

from __future__ import annotations

import random

import zmq

from broker import tmqp
from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.protocol import GREETING, ConnectionInfo, Header, MessageType, Operation
from broker.server.server import Server, ServerOptions

Ctx = zmq.Context[zmq.Socket[bytes]]

TEMPLATES = [
    tmqp.Frame(message_type=MessageType.QUEUE, content_type=1, message_id="q1", target="fz",
               pending_ack=True, payload=b"payload"),
    tmqp.Frame(message_type=MessageType.SERVER, content_type=Operation.QUEUE_CREATE,
               message_id="s1", target="fz", headers=((Header.QUEUE_ID, "2"),),
               payload=b'{"Status": 3}'),
    tmqp.Frame(message_type=MessageType.PULL, content_type=2, message_id="p1", target="fz",
               headers=((Header.COUNT, "3"), (Header.ORDER, "LIFO"))),
    tmqp.Frame(message_type=MessageType.DIRECT, message_id="d1", target="@name:x",
               pending_response=True, payload=b"?"),
    tmqp.Frame(message_type=MessageType.EVENT, content_type=1, message_id="e1",
               target="ClientJoined", headers=((Header.CHANNEL_NAME, "fz"),)),
    tmqp.Frame(message_type=MessageType.ACK, content_type=1, message_id="a1", target="fz",
               headers=((Header.NACK_REASON, "none"),)),
    tmqp.Frame(message_type=MessageType.SERVER, content_type=Operation.JOIN, message_id="j1",
               target="fz", pending_ack=True),
]  # fmt: skip


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.6:
            out[rng.randrange(len(out))] = rng.randrange(256)
        elif roll < 0.8:
            del out[rng.randrange(len(out)) :]
            if not out:
                out.append(0x11)
        else:
            out[rng.randrange(len(out)) : rng.randrange(len(out))] = rng.randbytes(5)
    return bytes(out)


def test_fuzzed_frames_against_the_real_engine(zctx: Ctx) -> None:
    engine = Engine()
    server = Server(engine, ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx)
    endpoint = server.start()
    fuzzer = zctx.socket(zmq.DEALER)
    fuzzer.linger = 0
    try:
        with Client(endpoint, context=zctx, timeout=5) as bystander:
            bystander.create_queue("calm", 1, {"Status": 1})
            bystander.join("calm")
            fuzzer.connect(endpoint)
            fuzzer.send(GREETING)
            fuzzer.send(tmqp.encode(ConnectionInfo(name="fuzzer").to_frame("hi"))[0])
            assert fuzzer.poll(5000)
            rng = random.Random(1234)
            sent = 0
            for _ in range(600):
                template = rng.choice(TEMPLATES)
                data = tmqp.encode(template)[0]
                payload = mutate(rng, data) if rng.random() < 0.9 else data
                if payload[0] & 0x3F == MessageType.TERMINATE:
                    continue  # would (legitimately) end the fuzzer's session
                fuzzer.send(payload)
                sent += 1
            fuzzer.send(tmqp.encode(tmqp.Ping())[0])
            pong = tmqp.encode(tmqp.Pong())[0]
            replies = 0
            while fuzzer.poll(5000):
                replies += 1
                if fuzzer.recv() == pong:
                    break
            else:
                raise AssertionError("the fuzzer's session got no PONG")
            bystander.push("calm", 1, b"still fine", ack=True)
            message = bystander.receive(timeout=5)
            assert message is not None and message.payload == b"still fine"
            stats = bystander.stats()
        counters = stats["server"]
        assert counters["bad_frames"] > 100, counters
        assert counters["engine_errors"] == 0, counters
    finally:
        fuzzer.close(linger=0)
        server.stop()
