"""Broadcast fan-out by libzmq: one publish per message for the consumers that asked for it.

A broker started with a fan-out endpoint (``broker serve --fanout tcp://...``) binds an
XPUB socket there (CURVE with the same authenticator as its ROUTER when CURVE is on).  A
client joining a channel may ask for fan-out (JOIN header ``Fanout: 1``, answered by a
RESPONSE); the broker then answers with

- ``Fanout-Endpoint``: where to connect a SUB socket,
- ``Fanout-Token``: the channel's stream topic (32 hex digits: 16 random octets), and
- ``Fanout-Seq``: the stream's last sequence number at the join.

Every message of a broadcast queue of that channel that needs no per-consumer work (the
queue requests no acknowledges, has no delivery handler hooks, no receipt is pending for
the message) is then published once, as two frames: the token followed by the stream
sequence number (8 octets little-endian), then the delivery exactly as a consumer gets
it over its DEALER.  libzmq copies it to the subscribed pipes; the fan-out members are
left out of the per-consumer sends.  Other messages of the channel (push queues, queues
with acknowledges or handlers, a receipt asked for) keep the DEALER path to every
member, as do clients that did not ask (older clients, the asyncio client).

Who may read: the XPUB runs in manual mode; the server applies a subscription only when
its topic is exactly a live token (:meth:`FanoutStreams.check`), so a SUB subscribing to
everything (an empty prefix), to a short prefix or to a guessed token gets nothing.  A
token is handed only to a client the authorizer let join the channel.  With CURVE on, a
SUB whose key is not allowed cannot connect at all.  Limit: a member that leaves keeps a
SUB that already holds the token; the token is replaced (a new random one) when the last
member leaves, so it reads until then, no longer.

Gaps: the sequence numbers of a stream are consecutive (one per published message), so a
subscriber sees any message it missed (a SUB subscribed late, messages dropped at a full
pipe: the XPUB's send high-water mark ``ServerOptions.fanout_hwm``, default 10,000, and
the SUB's own) as a jump in the numbers at the next message or marker.  A *marker* is
the stream head with an empty second frame and the last sequence number sent: each
applied subscription publishes one, so a new subscriber learns where it starts and the
client can tell its join is live (the client's join returns then and takes effect there:
``broker.client.fanout``), and the server publishes every stream's marker about once a second
(its session scan), so a subscriber whose *last* messages were dropped learns of that
gap within a second of reading again (a marker can be dropped at a full pipe too: the
next one tells).  The broker never resends: fan-out is for broadcast queues, which keep nothing.
"""

from __future__ import annotations

import secrets
from typing import Any

from broker.fanout import FANOUT_ENDPOINT, FANOUT_SEQ, FANOUT_TOKEN, TOKEN_SIZE, head
from broker.protocol import Outgoing


class Publish(Outgoing):
    """Engine output for the fan-out socket: ``client_id`` is the head frame (octets,
    see :func:`head`), ``frame`` the delivery (None: a marker)."""

    __slots__ = ()


class Stream:
    """One channel's fan-out: its token, last sequence number and members."""

    __slots__ = ("direct", "members", "seq", "token")

    def __init__(self) -> None:
        self.token = secrets.token_bytes(TOKEN_SIZE)
        self.seq = 0
        #: Client ids of the members (consumers of the channel that asked for fan-out).
        self.members: set[str] = set()
        #: The channel's other consumers (sent to one by one), cached; None: to compute.
        self.direct: list[Any] | None = None

    def others(self, consumers: list[Any]) -> list[Any]:
        """The consumers in ``consumers`` that are not members (cached until a change)."""
        direct = self.direct
        if direct is None:
            members = self.members
            direct = self.direct = [c for c in consumers if c.id not in members]
        return direct

    def publish(self, frame: Any, out: list[Any]) -> None:
        self.seq += 1
        out.append(Publish(head(self.token, self.seq), frame))  # type: ignore[arg-type]


class FanoutStreams:
    """The broker's fan-out streams by token; each channel holds its own (``fanout``)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.by_token: dict[bytes, Stream] = {}

    def grant(self, channel: Any, client_id: str) -> tuple[tuple[str, str], ...]:
        """Make ``client_id`` a member of ``channel``'s stream; the join answer's headers."""
        stream = channel.fanout
        if stream is None:
            stream = channel.fanout = Stream()
            self.by_token[stream.token] = stream
        stream.members.add(client_id)
        stream.direct = None
        return (
            (FANOUT_ENDPOINT, self.endpoint),
            (FANOUT_TOKEN, stream.token.hex()),
            (FANOUT_SEQ, str(stream.seq)),
        )

    def leave(self, channel: Any, client_id: str) -> None:
        """``client_id`` is no member any more; the last one out retires the token."""
        stream = channel.fanout
        if stream is None:
            return
        stream.direct = None
        if client_id not in stream.members:
            return
        stream.members.discard(client_id)
        if not stream.members:
            channel.fanout = None
            self.by_token.pop(stream.token, None)

    def drop(self, channel: Any) -> None:
        """The channel is removed: its stream goes with it."""
        stream = channel.fanout
        if stream is not None:
            channel.fanout = None
            self.by_token.pop(stream.token, None)

    def markers(self) -> list[Outgoing]:
        """A marker for each stream that published something (its last number)."""
        return [
            Publish(head(s.token, s.seq), None)  # type: ignore[arg-type]
            for s in self.by_token.values()
            if s.seq
        ]

    def check(self, topic: bytes) -> bytes | None:
        """A subscription asked on the XPUB: the marker's head when ``topic`` is exactly a
        live token (apply it), else None (refuse it)."""
        stream = self.by_token.get(topic) if len(topic) == TOKEN_SIZE else None
        if stream is None:
            return None
        return head(stream.token, stream.seq)
