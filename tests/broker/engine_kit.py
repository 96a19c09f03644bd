"""Test kit for the sans-IO engine: a fake clock, inboxes per client, frame helpers."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from typing import Any

from broker import tmqp
from broker.engine import tmqp_door
from broker.engine.delivery import PerMessageDeliveryHandler
from broker.engine.engine import Engine, Outgoing, Tracked
from broker.engine.options import BrokerConfig, ChannelQueueOptions
from broker.engine.per_message import PER_MESSAGE, PerMessageRules
from broker.message import Message
from broker.protocol import ConnectionInfo, Header, MessageType, Operation, QueueStatus, header

Frame = tmqp.Frame


def as_frame(o: Outgoing) -> Outgoing:
    """``o`` with its message (a queue delivery) as the frame a TMQP client receives."""
    if isinstance(o.frame, Message):
        frame = tmqp.decode([tmqp_door.encode(o.frame)])
        assert isinstance(frame, tmqp.Frame)
        return o._replace(frame=frame)
    return o


class Kit:
    """One engine, a clock under test control, and everything it sent, per client.

    The transport is perfect unless ``auto_transmit=False``: every tracked delivery is
    reported sent at once (``Engine.transmitted``).  Without it, tracked deliveries wait
    in ``unsent`` until :meth:`transmit` reports them, as a full socket would.
    """

    def __init__(self, *, auto_transmit: bool = True, **engine_kwargs: Any) -> None:
        ids = itertools.count(1)
        self.now = 100.0
        engine_kwargs.setdefault("new_id", lambda: f"id{next(ids)}")
        engine_kwargs.setdefault("config", BrokerConfig(wall_clock=lambda: 1_700_000_000.0))
        self.engine = Engine(**engine_kwargs)
        self.inbox: dict[str, list[Any]] = defaultdict(list)  # frames (messages: typed)
        self._mids = itertools.count(1)
        self.auto_transmit = auto_transmit
        #: Tracked deliveries handed out per client and not reported sent yet.
        self.unsent: dict[str, int] = defaultdict(int)
        #: Clients that use the typed operations: their inbox keeps messages as messages.
        self.typed: set[str] = set()

    # ---------------------------------------------------------------- plumbing

    def route(self, outs: list[Outgoing]) -> list[Outgoing]:
        """Deliver the engine's output as the TMQP door would (queue deliveries come out
        as messages: encoded as the server encodes them, then decoded as a client does);
        a client in :attr:`typed` (one that uses the typed operations) keeps them."""
        outs = [self._as_seen(o) for o in outs]
        routed = list(outs)
        while outs:
            counts: dict[str, int] = defaultdict(int)
            for o in outs:
                assert isinstance(o, Outgoing)
                if isinstance(o.frame, Message):
                    tmqp_door.encode(o.frame)  # every message must be encodable too
                else:
                    tmqp.encode(o.frame)  # every frame the engine makes must be encodable
                self.inbox[o.client_id].append(o.frame)
                if isinstance(o, Tracked):
                    counts[o.client_id] += 1
            if not self.auto_transmit:
                for client_id, n in counts.items():
                    self.unsent[client_id] += n
                break
            outs = self.engine.transmitted(dict(counts), self.now) if counts else []
            outs = [self._as_seen(o) for o in outs]
            routed += outs
        return routed

    def _as_seen(self, o: Outgoing) -> Outgoing:
        return o if o.client_id in self.typed else as_frame(o)

    def transmit(self, client_id: str, count: int | None = None) -> list[Outgoing]:
        """Report ``count`` (default: all) of the client's tracked deliveries sent."""
        n = self.unsent[client_id] if count is None else count
        assert 0 <= n <= self.unsent[client_id]
        self.unsent[client_id] -= n
        return self.route(self.engine.transmitted({client_id: n}, self.now))

    def connect(
        self,
        client_id: str | None = None,
        *,
        name: str | None = None,
        type: str | None = None,
        token: str | None = None,
    ) -> str:
        info = ConnectionInfo(client_id=client_id, name=name, type=type, token=token)
        cid, outs = self.engine.connect(info, self.now)
        self.route(outs)
        return cid

    def send(self, client_id: str, frame: Frame) -> list[Outgoing]:
        return self.route(self.engine.receive(client_id, frame, self.now))

    def take(self, client_id: str) -> list[Frame]:
        frames = self.inbox.pop(client_id, [])
        return frames

    def advance(self, seconds: float) -> list[Outgoing]:
        self.now += seconds
        return self.route(self.engine.tick(self.now))

    def disconnect(self, client_id: str) -> list[Outgoing]:
        self.unsent.pop(client_id, None)  # the engine returns them to their queues
        return self.route(self.engine.disconnect(client_id, self.now))

    def mid(self) -> str:
        return f"m{next(self._mids)}"

    # ---------------------------------------------------------------- operations

    def op(
        self,
        client_id: str,
        content_type: int,
        target: str = "",
        *,
        headers: tuple[tuple[str, str], ...] = (),
        payload: bytes | dict[str, Any] = b"",
        response: bool = False,
    ) -> Frame:
        """Run a server operation and return its reply (ACK or RESPONSE)."""
        if isinstance(payload, dict):
            payload = json.dumps(payload).encode()
        mid = self.mid()
        frame = Frame(
            message_type=MessageType.SERVER,
            content_type=content_type,
            target=target,
            message_id=mid,
            headers=headers,
            payload=payload,
            pending_ack=not response,
            pending_response=response,
        )
        self.send(client_id, frame)
        replies = [
            f
            for f in self.inbox[client_id]
            if f.message_id == mid and f.message_type in (MessageType.ACK, MessageType.RESPONSE)
        ]
        assert len(replies) == 1, replies
        self.inbox[client_id].remove(replies[0])
        return replies[0]

    def ok(self, client_id: str, content_type: int, target: str = "", **kw: Any) -> Frame:
        reply = self.op(client_id, content_type, target, **kw)
        assert reply.content_type == 0, (reply.content_type, reply.headers)
        return reply

    def json(self, client_id: str, content_type: int, target: str = "", **kw: Any) -> Any:
        reply = self.op(client_id, content_type, target, response=True, **kw)
        assert reply.message_type == MessageType.RESPONSE
        assert reply.content_type == 0, (reply.content_type, reply.headers)
        return json.loads(reply.payload)

    def join(self, client_id: str, channel: str) -> None:
        self.ok(client_id, Operation.JOIN, channel)

    def queue(self, client_id: str, channel: str, queue_id: int, **options: Any) -> None:
        """Create a queue with ChannelQueueOptions given as Python keyword names."""
        body = {
            key: value
            for key, value in ChannelQueueOptions(**options).to_json().items()
            if _py(key) in options
        }
        self.ok(
            client_id,
            Operation.QUEUE_CREATE,
            channel,
            headers=((Header.QUEUE_ID, str(queue_id)),),
            payload=body,
        )

    def update(self, client_id: str, channel: str, queue_id: int, **json_options: Any) -> Frame:
        return self.op(
            client_id,
            Operation.QUEUE_UPDATE,
            channel,
            headers=((Header.QUEUE_ID, str(queue_id)),),
            payload=json_options,
        )

    def info(self, client_id: str, channel: str, queue_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.json(
            client_id, Operation.QUEUE_INFO, channel, headers=((Header.QUEUE_ID, str(queue_id)),)
        )
        return result

    # ---------------------------------------------------------------- messages

    def push(
        self,
        client_id: str,
        channel: str,
        queue_id: int,
        payload: bytes = b"x",
        *,
        ack: bool = False,
        high: bool = False,
        mid: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        first: bool = False,
    ) -> str:
        mid = self.mid() if mid is None else mid
        self.send(
            client_id,
            Frame(
                message_type=MessageType.QUEUE,
                content_type=queue_id,
                target=channel,
                message_id=mid,
                source=client_id,
                payload=payload,
                pending_ack=ack,
                high_priority=high,
                headers=headers,
                first_acquirer=first,
            ),
        )
        return mid

    def ack(self, client_id: str, delivered: Frame, nack: str | None = None) -> None:
        headers = ((Header.NACK_REASON, nack),) if nack is not None else ()
        self.send(
            client_id,
            Frame(
                message_type=MessageType.ACK,
                content_type=delivered.content_type,
                target=delivered.target,
                message_id=delivered.message_id,
                headers=headers,
            ),
        )

    def pull(
        self,
        client_id: str,
        channel: str,
        queue_id: int,
        *,
        headers: tuple[tuple[str, str], ...] = (),
        mid: str | None = None,
    ) -> list[Frame]:
        """Send a pull request; return every frame answering it (markers included)."""
        mid = self.mid() if mid is None else mid
        self.send(
            client_id,
            Frame(
                message_type=MessageType.PULL,
                content_type=queue_id,
                target=channel,
                message_id=mid,
                headers=headers,
                pending_response=True,
            ),
        )
        inbox = self.inbox[client_id]
        mine = [f for f in inbox if f.message_id == mid or header(f, Header.REQUEST_ID) == mid]
        for f in mine:
            inbox.remove(f)
        return mine

    def payloads(self, client_id: str) -> list[bytes]:
        return [f.payload for f in self.take(client_id) if f.message_type == MessageType.QUEUE]


def _py(json_key: str) -> str:
    out: list[str] = []
    for ch in json_key:
        if ch.isupper() and out:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def acks(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.message_type == MessageType.ACK]


def queue_messages(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.message_type == MessageType.QUEUE]


def per_message_queue(
    consumers: int, on: tuple[Kit, PerMessageRules] | None = None
) -> tuple[Kit, PerMessageRules, str, list[str]]:
    """A round-robin queue ``ch`` (acknowledges, the ``per-message`` handler) with a
    producer and ``consumers`` joined: ``(kit, rules, producer, consumers)``; ``on`` gives
    a kit and its handler's rules made elsewhere (e.g. on a store)."""
    if on is None:
        handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
        on = Kit(handlers={PER_MESSAGE: handler}), handler.rules
    kit, rules = on
    producer = kit.connect("producer")
    kit.queue(
        producer,
        "ch",
        1,
        status=QueueStatus.ROUND_ROBIN,
        request_acknowledge=True,
        message_delivery_handler=PER_MESSAGE,
    )
    names = [kit.connect(f"c{i}") for i in range(consumers)]
    for name in names:
        kit.join(name, "ch")
    return kit, rules, producer, names
