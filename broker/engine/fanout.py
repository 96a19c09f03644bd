"""Broadcast fan-out by libzmq: one publish per message for the consumers that asked for it.

A broker started with a fan-out endpoint (``broker serve --fanout tcp://...``) binds an
XPUB socket there (CURVE with the same authenticator as its ROUTER when CURVE is on).  A
client joining a channel may ask for fan-out (JOIN header ``Fanout: 3``, answered by a
RESPONSE); the broker then answers with

- ``Fanout-Endpoint``: where to connect a SUB socket,
- ``Fanout-Token``: the channel's stream topic (32 hex digits: 16 random octets),
- ``Fanout-Ticket``: this member's claim on the token (32 hex digits), and
- ``Fanout-Seq``: the stream's last sequence number published at the join.

The member's SUB subscribes the token (its own filter) and the ticket: the XPUB runs in
manual mode, and the server applies the *token* to the pipe that sent a subscription
only when that subscription is a live ticket (:meth:`FanoutStreams.claim`); a token, a
prefix, everything or a guess is refused.  So the stream reaches only SUBs of members,
and the engine knows which members read it.  (A JOIN asking ``Fanout: 1`` or ``2``, the
older wire forms, is served one by one.)

Every message of a broadcast queue of that channel that needs no per-consumer work (the
queue requests no acknowledges, has no delivery handler hooks, no receipt is pending for
the message) is then published once: this engine outputs a ``Publish`` per delivery (the
head: token and stream sequence number; the delivery exactly as a consumer gets it over
its DEALER), and the server's door sends consecutive ones of a stream as ONE frame, a
*run* (layout in ``broker.fanout``).  libzmq copies it to the subscribed pipes; the
fan-out members are left out of the per-consumer sends.  Other messages of the channel
keep the DEALER path to every member, as do clients that did not ask.

Leaving: when a member leaves (LEAVE, a join without fan-out, its session's end or
expiry) and others stay, the stream's token is replaced by a new random one: what a
leaver's SUB still holds matches nothing published later.  Each remaining member gets
the new token and a new ticket in a DIRECT frame (content type ``broker.fanout.ROTATED``
from ``@fanout``, headers as the join answer's plus ``Channel-Name``); until every one
of them claimed it, the stream *holds* what it publishes (numbered, not sent), so no
member misses a message because of the change: the members read the old token's
messages up to the announced number, then the new token's from the next one, in order
on the one SUB.  A member that does not claim within :data:`HOLD_BEATS` beats of the
server (about a second each), or more than :data:`HOLD_MAX` held messages, ends the
hold: the held messages go out and that member sees them as a reported gap.

Gaps: the sequence numbers of a stream are consecutive (one per published message, across
token changes), so a subscriber sees any message it missed (messages dropped at a full
pipe: the XPUB's send high-water mark ``ServerOptions.fanout_hwm``, default 1,000 runs,
and the SUB's own) as a jump in the numbers at the next message or marker.  A *marker* is
the head alone with the last sequence number sent: each applied claim publishes one, so
a new subscriber learns where it starts and the client can tell its join is live (the
client's join returns then and takes effect there: ``broker.client.fanout``), and the
server publishes every stream's marker about once a second (its session scan), so a
subscriber whose *last* messages were dropped learns of that gap within a second of
reading again (a marker can be dropped at a full pipe too: the next one tells).  The
broker never resends: fan-out is for broadcast queues, which keep nothing.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any

from broker.engine.frames import control
from broker.fanout import (
    FANOUT_ENDPOINT,
    FANOUT_SEQ,
    FANOUT_TICKET,
    FANOUT_TOKEN,
    ROTATED,
    SOURCE,
    TOKEN_SIZE,
    head,
)
from broker.protocol import Header, MessageType, Outgoing

#: Messages a stream holds while remaining members claim a new token (then it lets go).
HOLD_MAX = 10_000
#: Server beats (``Engine.fanout_beat``, about one a second) a hold lasts at most.
HOLD_BEATS = 5


class Publish(Outgoing):
    """Engine output for the fan-out socket: ``client_id`` is the head (octets, see
    :func:`head`), ``frame`` the delivery (None: a marker)."""

    __slots__ = ()


class Stream:
    """One channel's fan-out: its token, sequence numbers, members and their tickets."""

    __slots__ = ("beats", "direct", "held", "members", "sent", "seq", "token", "waiting")

    def __init__(self) -> None:
        self.token = secrets.token_bytes(TOKEN_SIZE)
        #: The last number given to a message; ``sent``: the last one published.
        self.seq = 0
        self.sent = 0
        #: Client id -> its ticket for the current token.
        self.members: dict[str, bytes] = {}
        #: The channel's other consumers (sent to one by one), cached; None: to compute.
        self.direct: list[Any] | None = None
        #: Members that have not claimed the current token since it changed (a hold).
        self.waiting: set[str] = set()
        #: Deliveries numbered during a hold, not published yet (``sent + 1`` onwards).
        self.held: list[Any] = []
        self.beats = 0

    def others(self, consumers: list[Any]) -> list[Any]:
        """The consumers in ``consumers`` that are not members (cached until a change)."""
        direct = self.direct
        if direct is None:
            members = self.members
            direct = self.direct = [c for c in consumers if c.id not in members]
        return direct

    def publish(self, frame: Any, out: list[Any]) -> None:
        self.seq += 1
        if self.waiting:
            self.held.append(frame)
            if len(self.held) >= HOLD_MAX:
                self.release(out)
            return
        self.sent = self.seq
        out.append(Publish(head(self.token, self.seq), frame))  # type: ignore[arg-type]

    def release(self, out: list[Any]) -> None:
        """End a hold: publish what it held, under the current token."""
        self.waiting.clear()
        held, self.held = self.held, []
        token = self.token
        for frame in held:
            self.sent += 1
            out.append(Publish(head(token, self.sent), frame))  # type: ignore[arg-type]

    def marker(self) -> Outgoing:
        return Publish(head(self.token, self.sent), None)  # type: ignore[arg-type]


class FanoutStreams:
    """The broker's fan-out streams by token; each channel holds its own (``fanout``)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.by_token: dict[bytes, Stream] = {}
        #: Live tickets: ticket -> (stream, client id).
        self.tickets: dict[bytes, tuple[Stream, str]] = {}
        self._ids = itertools.count(1)

    def _ticket(self, stream: Stream, client_id: str) -> bytes:
        old = stream.members.get(client_id)
        if old is not None:
            self.tickets.pop(old, None)
        ticket = secrets.token_bytes(TOKEN_SIZE)
        stream.members[client_id] = ticket
        self.tickets[ticket] = (stream, client_id)
        return ticket

    def _headers(self, stream: Stream, ticket: bytes) -> tuple[tuple[str, str], ...]:
        return (
            (FANOUT_ENDPOINT, self.endpoint),
            (FANOUT_TOKEN, stream.token.hex()),
            (FANOUT_TICKET, ticket.hex()),
            (FANOUT_SEQ, str(stream.sent)),
        )

    def grant(self, channel: Any, client_id: str) -> tuple[tuple[str, str], ...]:
        """Make ``client_id`` a member of ``channel``'s stream; the join answer's headers
        (a member joining again keeps its ticket)."""
        stream = channel.fanout
        if stream is None:
            stream = channel.fanout = Stream()
            self.by_token[stream.token] = stream
        ticket = stream.members.get(client_id)
        if ticket is None:
            ticket = self._ticket(stream, client_id)
        stream.direct = None
        return self._headers(stream, ticket)

    def leave(self, channel: Any, client_id: str, out: list[Outgoing]) -> None:
        """``client_id`` is no member any more: the last one out retires the stream, else
        the token is replaced and the others are told (see the module docstring)."""
        stream = channel.fanout
        if stream is None:
            return
        stream.direct = None
        ticket = stream.members.pop(client_id, None)
        if ticket is None:
            return
        self.tickets.pop(ticket, None)
        stream.waiting.discard(client_id)
        if not stream.members:
            self.drop(channel)
            return
        self.by_token.pop(stream.token, None)
        stream.token = secrets.token_bytes(TOKEN_SIZE)
        self.by_token[stream.token] = stream
        stream.waiting = set(stream.members)
        stream.beats = 0
        for member in list(stream.members):
            headers = (*self._headers(stream, self._ticket(stream, member)),
                       (Header.CHANNEL_NAME, channel.name))  # fmt: skip
            frame = control(
                MessageType.DIRECT, ROTATED, f"fanout-{next(self._ids)}", SOURCE, member, headers
            )
            out.append(Outgoing(member, frame))

    def drop(self, channel: Any) -> None:
        """The channel is removed (or its last member left): its stream goes with it."""
        stream = channel.fanout
        if stream is not None:
            channel.fanout = None
            self.by_token.pop(stream.token, None)
            for ticket in stream.members.values():
                self.tickets.pop(ticket, None)
            stream.members.clear()
            stream.held = []
            stream.waiting.clear()

    def markers(self) -> list[Outgoing]:
        """The server's beat: holds past :data:`HOLD_BEATS` let go, then a marker for each
        stream that published something (its last number)."""
        out: list[Outgoing] = []
        for stream in list(self.by_token.values()):
            if stream.waiting:
                stream.beats += 1
                if stream.beats >= HOLD_BEATS:
                    stream.release(out)
            if stream.sent:
                out.append(stream.marker())
        return out

    def claim(self, topic: bytes) -> tuple[bytes, list[Outgoing]] | None:
        """A subscription asked on the XPUB: when ``topic`` is a live ticket, the token to
        apply to its pipe and what to publish then (the marker, and what a hold kept if
        this was the last claim it waited for); else None (refuse it)."""
        found = self.tickets.get(topic) if len(topic) == TOKEN_SIZE else None
        if found is None:
            return None
        stream, client_id = found
        out: list[Outgoing] = [stream.marker()]
        waiting = stream.waiting
        if waiting:
            waiting.discard(client_id)
            if not waiting:
                stream.release(out)
        return stream.token, out
