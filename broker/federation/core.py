"""The federation core: sans-IO decisions for every link of one broker (no sockets).

The driver (:mod:`broker.federation.runner`) feeds it what happened, with ``now``: an
interest exchange with a link peer, a delivery to this broker's federation client, a
forwarded message from a peer, the answer to a forward or to a local push.  It returns
actions (:class:`Join`, :class:`Leave`, :class:`Forward`, :class:`AckLocal`,
:class:`TrashLocal`, :class:`PushLocal`, :class:`Confirm`, :class:`Refuse`).  Rules it enforces:

* Interest, not flooding: a peer is sent a message of channel C only if it said it wants
  C (it has subscribers, or is linked toward a broker that has).  Interest travels as a
  path of broker ids; a broker never offers a peer interest whose path contains that
  peer (split horizon on paths: no interest loops, withdrawals converge).
* Loops: each message carries Hops (the brokers it passed) and Depth (hops it may still
  take; -1 unlimited, 0 local only; a message without one gets ``default_depth``).  A
  message is never forwarded to a broker in its Hops, nor when its Depth is 0; a message
  arriving with this broker's id in Hops is confirmed and dropped.
* Duplicates: a message id (``Fed-Id``) accepted once is remembered (the newest
  ``seen_window`` ids); a second copy is confirmed and dropped.  A copy arriving while
  the first is still being pushed waits for that push.  An accepted id is handed to the
  driver (:class:`Remember`) before its confirms: the driver keeps the window in a file
  (:mod:`broker.federation.seen`) and seeds a new core with it (:meth:`remember`), so a
  copy resent after a restart is still dropped.
* Acked forwarding: a local delivery is acknowledged to the local broker only once every
  peer it went to confirmed it (the peer's broker acknowledged the push, durably for a
  persistent queue).  A forward that fails is sent again after a backoff; a peer that is
  down keeps its interest, and what waits for it is sent when it is back.  A peer that
  refuses for good (a channel its admin does not allow, a message it cannot read) is
  counted and not sent it again; once every other peer answered, a delivery that needs
  an acknowledge is then dead-lettered (:class:`TrashLocal`: its queue's trash, with the
  peers' reasons, to be listed and resubmitted), never acknowledged away -- for a
  one-consumer queue that would be a message nobody got.  One that needs none left its
  queue already: counted only.
* Bounds: ``window`` forwards in flight per peer; ``max_pending`` messages held for
  peers in all; beyond it a delivery that needs no acknowledge is dropped (counted).
  A peer's messages not yet answered here are at most ``peer_in_flight`` (a peer that
  floods past its window): beyond, each is refused as busy (not for good: an honest
  sender sends it again after a backoff), counted ``flooded``; nothing already taken
  is touched, and other peers are not slowed.
* Queues that hand each message to one consumer (RoundRobin, Push with first acquirer:
  ``one_consumer``): the federation client is one consumer among the local ones, so a
  message it takes goes to ONE peer (never copied to two brokers), and only to a peer
  that is up with room in its window.  A delivery that needs an acknowledge and has no
  such peer is given back to its queue (:class:`NackLocal`, a negative acknowledge: the
  queue puts it back and hands it to the next consumer), so a local consumer gets it.
  Only when the channel has no local consumer is it held for an interested peer that is
  down or busy (nothing local could take it).  When a peer goes down, what waits for it
  (not yet sent) on a channel with local consumers is given back too.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from broker.bridge.core import Backoff
from broker.federation.errors import BadPeerMessage
from broker.federation.settings import FederationSettings, LinkMode, channel_allowed
from broker.federation.wire import (
    DEPTH,
    FED_ID,
    HOPS,
    Envelope,
    Headers,
    Interest,
    own_headers,
    parse_depth,
    parse_hops,
)

#: Seconds a give-back waits when the message may come straight back to the federation
#: client (no local consumer, or given back before): bounds a put-back loop.
GIVE_BACK_DELAY = 0.2
#: How a dead-lettered delivery's trash reason starts (the peers' reasons follow).
REFUSED_REASON = "federation: refused for good by "
#: Characters of a trash reason kept at most (a header value, shown by ``trash list``).
MAX_REASON = 200

# -- actions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Join:
    """Join the local channel (a peer wants its messages)."""

    channel: str


@dataclass(frozen=True, slots=True)
class Leave:
    """Leave the local channel (no peer wants it any more)."""

    channel: str


@dataclass(frozen=True, slots=True)
class Forward:
    """Send ``envelope`` to ``peer``; report ``forward_done(token, peer, ...)``."""

    peer: str
    token: int
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class AckLocal:
    """Acknowledge a local delivery (if it wants one): every peer has it, or none wants it."""

    ref: Any


@dataclass(frozen=True, slots=True)
class TrashLocal:
    """Dead-letter a local delivery: nack it not to be put back, to its queue's trash
    with ``reason`` (a peer refused it for good)."""

    ref: Any
    reason: str


@dataclass(frozen=True, slots=True)
class NackLocal:
    """Give a local delivery back to its queue (negative acknowledge: put back), after
    ``delay`` seconds (0: now)."""

    ref: Any
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class PushLocal:
    """Push a peer's message into the local queue; report ``local_done(token, ok)``."""

    token: int
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class Remember:
    """Keep ``fed_id`` as accepted (durably, before the confirms that follow it)."""

    fed_id: str


@dataclass(frozen=True, slots=True)
class Confirm:
    """Answer a peer's forward: this broker has it (or had it already)."""

    ref: Any


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer a peer's forward with a failure (``permanent``: do not send it again)."""

    ref: Any
    reason: str
    permanent: bool


Action = (
    Join
    | Leave
    | Forward
    | AckLocal
    | TrashLocal
    | NackLocal
    | PushLocal
    | Remember
    | Confirm
    | Refuse
)


@dataclass(frozen=True, slots=True)
class Policy:
    """What flows over the link with one peer (from the ``--link`` spec, or ``accept``)."""

    mode: LinkMode = LinkMode.BOTH
    channels: tuple[str, ...] = ("*",)

    def sends(self, channel: str) -> bool:
        return self.mode.sends and channel_allowed(self.channels, channel)

    def receives(self, channel: str) -> bool:
        return self.mode.receives and channel_allowed(self.channels, channel)


@dataclass(slots=True)
class Counters:
    """What the federation did so far (``snapshot()`` for a copy)."""

    local_received: int = 0  # deliveries to the federation client
    local_kept: int = 0  # acknowledged without a forward (no peer wants it, depth 0)
    forwarded: int = 0  # forwards sent, resends included
    confirmed: int = 0  # forwards a peer confirmed
    forward_failures: int = 0  # forwards that failed (sent again later)
    refused_by_peer: int = 0  # forwards a peer refused for good
    dead_lettered: int = 0  # deliveries a peer refused for good, nacked to their queue's trash
    dropped: int = 0  # deliveries without acknowledge dropped: max_pending reached
    given_back: int = 0  # one-consumer deliveries no peer could take, put back (nack)
    invalid: int = 0  # local deliveries with a bad Hops/Depth header (not forwarded)
    received: int = 0  # peers' messages pushed locally
    duplicates: int = 0  # peers' messages already seen (dropped)
    loops: int = 0  # peers' messages that had passed here already (dropped)
    refused: int = 0  # peers' messages refused (not allowed, unknown peer, push failed)
    bad_messages: int = 0  # malformed federation messages from peers
    flooded: int = 0  # peers' messages refused busy: over peer_in_flight unanswered
    unlinked: int = 0  # peers' messages refused busy: their sender not linked on that connection
    peers_up: int = 0  # times a peer came up

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class Peer:
    """One link peer: its interest, whether it answers, its queue of forwards."""

    id: str
    policy: Policy
    interest: Interest = field(default_factory=dict)
    up: bool = False
    last_heard: float = 0.0
    in_flight: int = 0
    waiting: deque[int] = field(default_factory=deque)
    backoff: Backoff | None = None
    paused_until: float = 0.0


@dataclass(slots=True)
class _Out:
    envelope: Envelope
    ref: Any
    needs_ack: bool
    targets: dict[str, bool]  # peer -> sent (True: in flight)
    one_consumer: bool = False  # from a queue that hands each message to one consumer
    refusals: list[str] = field(default_factory=list)  # "peer: reason" of refusals for good


@dataclass(slots=True)
class _In:
    token: int
    refs: list[tuple[str, Any]]  # (peer id, what Confirm/Refuse answer)


class FederationCore:
    """The federation state of one broker (see the module docstring)."""

    def __init__(self, settings: FederationSettings, boot: str = "0") -> None:
        self.settings = settings
        self.me = settings.broker_id
        self.boot = boot  # distinguishes this process's generated message ids
        self.counters = Counters()
        self.peers: dict[str, Peer] = {}
        self.local: set[str] = set()  # channels with local subscribers
        self.joined: set[str] = set()  # channels the federation client joined
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._out: dict[int, _Out] = {}
        self._in: dict[str, _In] = {}
        self._in_tokens: dict[int, str] = {}
        #: peer id -> its messages waiting for an answer here (pushes and their copies)
        self._in_by_peer: dict[str, int] = {}
        self._tokens = itertools.count(1)

    def remember(self, fed_ids: list[str]) -> None:
        """Seed the seen window (ids accepted before a restart, oldest first)."""
        seen = self._seen
        for fed_id in fed_ids:
            seen[fed_id] = None
            seen.move_to_end(fed_id)
        while len(seen) > self.settings.seen_window:
            seen.popitem(last=False)

    def seen_ids(self) -> list[str]:
        """The seen window, oldest first."""
        return list(self._seen)

    @property
    def pending(self) -> int:
        """Local deliveries not yet confirmed by every peer they go to."""
        return len(self._out)

    # -- interest ----------------------------------------------------------------------

    def accepts_peer(self, peer_id: str) -> bool:
        """Is there room for ``peer_id`` (known already, or fewer than ``max_peers``)?"""
        return peer_id in self.peers or len(self.peers) < self.settings.max_peers

    def interest_heard(
        self, peer_id: str, policy: Policy, interest: Interest, now: float
    ) -> list[Action]:
        """A peer's interest (an exchange succeeded): it is up; join what it wants.
        (The caller checks :meth:`accepts_peer` first.)"""
        peer = self.peers.get(peer_id)
        if peer is None:
            peer = self.peers[peer_id] = Peer(peer_id, policy)
        peer.policy = policy
        peer.interest = {c: p for c, p in interest.items() if self.me not in p}
        peer.last_heard = now
        actions: list[Action] = self._sync_joins()
        if not peer.up:
            peer.up = True
            peer.paused_until = 0.0
            self.counters.peers_up += 1
            # everything for it goes (again) in order: what waited, and what was in
            # flight when it went away (those answers, if they still come, are ignored)
            for out in self._out.values():
                if peer_id in out.targets:
                    out.targets[peer_id] = False
            peer.in_flight = 0
            peer.waiting = deque(t for t in self._out if peer_id in self._out[t].targets)
        actions.extend(self._pump(peer, now))
        return actions

    def peer_down(self, peer_id: str) -> list[Action]:
        """The peer stopped answering; its interest is kept, forwards to it wait (but
        see :meth:`_went_down`)."""
        peer = self.peers.get(peer_id)
        if peer is None or not peer.up:
            return []
        return self._went_down(peer)

    def _went_down(self, peer: Peer) -> list[Action]:
        """``peer`` is down: one-consumer deliveries waiting for it (not sent yet) on a
        channel with local consumers go back to their queue; in-flight ones wait (the
        peer may have them: they are sent again, deduplicated, when it is back)."""
        peer.up = False
        actions: list[Action] = []
        keep: deque[int] = deque()
        for token in peer.waiting:
            out = self._out.get(token)
            if (
                out is not None
                and out.one_consumer
                and out.needs_ack
                and out.targets.get(peer.id) is False
                and out.envelope.channel in self.local
            ):
                del self._out[token]
                self.counters.given_back += 1
                actions.append(NackLocal(out.ref))
            else:
                keep.append(token)
        peer.waiting = keep
        return actions

    def local_interest(self, channels: set[str]) -> None:
        """The channels with local subscribers (besides the federation client)."""
        self.local = set(channels)

    def advert_for(self, peer_id: str | None) -> Interest:
        """The interest to offer ``peer_id``: what this broker wants from it."""
        policy = self.peers[peer_id].policy if peer_id in self.peers else None
        offer: Interest = {}

        def wanted(channel: str) -> bool:
            return policy is None or policy.receives(channel)

        for channel in self.local:
            if wanted(channel):
                offer[channel] = (self.me,)
        for other in self.peers.values():
            if other.id == peer_id or not other.up:
                continue
            for channel, path in other.interest.items():
                if peer_id in path or not wanted(channel) or not other.policy.sends(channel):
                    continue
                mine = offer.get(channel)
                if mine is None or len(mine) > len(path) + 1:
                    offer[channel] = (self.me, *path)
        return offer

    def _sync_joins(self) -> list[Action]:
        wanted = {
            channel
            for peer in self.peers.values()
            for channel in peer.interest
            if peer.policy.sends(channel)
        }
        actions: list[Action] = [Join(c) for c in sorted(wanted - self.joined)]
        actions.extend(Leave(c) for c in sorted(self.joined - wanted))
        self.joined = wanted
        return actions

    # -- timers ------------------------------------------------------------------------

    def poll(self, now: float) -> list[Action]:
        """Peers silent for ``peer_timeout`` go down; paused peers resume sending."""
        actions: list[Action] = []
        for peer in self.peers.values():
            if peer.up and now - peer.last_heard > self.settings.peer_timeout:
                actions.extend(self._went_down(peer))
            if peer.up and peer.waiting and now >= peer.paused_until:
                actions.extend(self._pump(peer, now))
        return actions

    # -- local deliveries -> peers -----------------------------------------------------

    def local_delivery(
        self,
        channel: str,
        queue_id: int,
        message_id: str,
        source: str,
        headers: Headers,
        payload: bytes,
        high_priority: bool,
        needs_ack: bool,
        ref: Any,
        now: float,
        *,
        one_consumer: bool = False,
        redelivered: bool = False,
    ) -> list[Action]:
        """A message of a joined channel reached the federation client (``one_consumer``:
        from a queue that hands each message to one consumer; ``redelivered``: it was
        delivered before)."""
        counters = self.counters
        counters.local_received += 1
        lookup = {k.lower(): v for k, v in headers}
        try:
            hops = parse_hops(lookup.get(HOPS.lower()))
            depth = parse_depth(lookup.get(DEPTH.lower()), self.settings.default_depth)
        except BadPeerMessage:
            counters.invalid += 1
            return [AckLocal(ref)]
        fed_id = lookup.get(FED_ID.lower()) or self._new_id(message_id, source)
        targets = []
        if depth != 0 and self.me not in hops:
            targets = [
                p.id
                for p in self.peers.values()
                if p.id not in hops and channel in p.interest and p.policy.sends(channel)
            ]
        if one_consumer:
            placed = self._place_one(channel, targets, needs_ack)
            if placed is None:
                counters.given_back += 1
                delay = GIVE_BACK_DELAY if redelivered or channel not in self.local else 0.0
                return [NackLocal(ref, delay)]
            targets = placed
        if not targets:
            counters.local_kept += 1
            return [AckLocal(ref)]
        if not needs_ack and len(self._out) >= self.settings.max_pending:
            counters.dropped += 1
            return [AckLocal(ref)]
        envelope = Envelope(
            channel,
            queue_id,
            fed_id,
            (*hops, self.me),
            depth - 1 if depth > 0 else -1,
            own_headers(headers),
            bytes(payload),
            high_priority,
        )
        token = next(self._tokens)
        self._out[token] = _Out(
            envelope, ref, needs_ack, dict.fromkeys(targets, False), one_consumer
        )
        actions: list[Action] = []
        for peer_id in targets:
            peer = self.peers[peer_id]
            peer.waiting.append(token)
            if peer.up:
                actions.extend(self._pump(peer, now))
        return actions

    def _load(self, peer_id: str) -> tuple[int, str]:
        peer = self.peers[peer_id]
        return (peer.in_flight + len(peer.waiting), peer_id)

    def _place_one(self, channel: str, candidates: list[str], needs_ack: bool) -> list[str] | None:
        """The one peer for a one-consumer delivery: the least loaded that is up with room
        in its window.  With none, an acknowledged delivery is given back (None), unless
        no local consumer could take it either: then it waits for an interested peer."""
        window = self.settings.window
        ready = [p for p in candidates if self.peers[p].up and self._load(p)[0] < window]
        if ready:
            return [min(ready, key=self._load)]
        if not needs_ack:  # it left its queue already: the peer it waits for has it
            return [min(candidates, key=self._load)] if candidates else []
        if candidates and channel not in self.local:
            return [min(candidates, key=self._load)]
        return None

    def _new_id(self, message_id: str, source: str) -> str:
        if message_id:
            return f"{self.me}/{source}/{message_id}"[:256]
        return f"{self.me}/{self.boot}/{next(self._tokens)}"

    def _pump(self, peer: Peer, now: float) -> list[Action]:
        """Send what waits for ``peer``, within its window."""
        actions: list[Action] = []
        if now < peer.paused_until:
            return actions
        window = self.settings.window
        while peer.waiting and peer.in_flight < window:
            token = peer.waiting.popleft()
            out = self._out.get(token)
            if out is None or out.targets.get(peer.id) is not False:
                continue  # done, given up, or already in flight
            out.targets[peer.id] = True
            peer.in_flight += 1
            self.counters.forwarded += 1
            actions.append(Forward(peer.id, token, out.envelope))
        return actions

    def forward_done(
        self,
        token: int,
        peer_id: str,
        ok: bool,
        now: float,
        permanent: bool = False,
        reason: str = "",
    ) -> list[Action]:
        """A peer's answer to a forward (``ok``), or its failure (timeout, lost link;
        ``permanent``: refused for good, for ``reason``)."""
        peer = self.peers.get(peer_id)
        out = self._out.get(token)
        if peer is None or out is None or out.targets.get(peer_id) is not True:
            return []  # an answer from before the peer came back: already re-queued
        peer.in_flight -= 1
        actions: list[Action] = []
        if ok or permanent:
            if ok:
                self.counters.confirmed += 1
                if peer.backoff is not None:
                    peer.backoff.reset()
            else:
                self.counters.refused_by_peer += 1
                out.refusals.append(f"{peer_id}: {reason or 'refused'}")
            del out.targets[peer_id]
            if not out.targets:
                del self._out[token]
                actions.append(self._settled(out))
        else:
            self.counters.forward_failures += 1
            out.targets[peer_id] = False
            peer.waiting.appendleft(token)
            if peer.backoff is None:
                peer.backoff = Backoff(*self.settings.retry)
            peer.paused_until = peer.backoff.failed(now)
            if not peer.up:  # failed after it went down: give back what may go back
                actions.extend(self._went_down(peer))
        actions.extend(self._pump(peer, now))
        return actions

    def _settled(self, out: _Out) -> Action:
        """Every peer ``out`` went to answered: acknowledged, or dead-lettered when one
        refused it for good and its queue still holds it (it waits for an acknowledge)."""
        if not out.refusals or not out.needs_ack:
            return AckLocal(out.ref)
        self.counters.dead_lettered += 1
        reason = f"{REFUSED_REASON}{'; '.join(out.refusals)}"
        return TrashLocal(out.ref, reason[:MAX_REASON])

    # -- peers' messages -> local ------------------------------------------------------

    def remote_message(self, peer_id: str, envelope: Envelope, ref: Any) -> list[Action]:
        """A peer forwarded ``envelope`` (``ref``: what Confirm/Refuse answer)."""
        peer = self.peers.get(peer_id)
        counters = self.counters
        if peer is None:
            counters.refused += 1
            return [Refuse(ref, f"unknown link peer {peer_id!r}", False)]
        if not peer.policy.receives(envelope.channel):
            counters.refused += 1
            return [Refuse(ref, f"channel {envelope.channel!r} not allowed on this link", True)]
        if self.me in envelope.hops:
            counters.loops += 1
            return [Confirm(ref)]
        fed_id = envelope.fed_id
        if fed_id in self._seen:
            counters.duplicates += 1
            return [Confirm(ref)]
        waiting = self._in_by_peer.get(peer_id, 0)
        if waiting >= self.settings.peer_in_flight:
            counters.flooded += 1
            limit = self.settings.peer_in_flight
            return [Refuse(ref, f"over {limit} messages in flight from {peer_id!r}", False)]
        self._in_by_peer[peer_id] = waiting + 1
        pending = self._in.get(fed_id)
        if pending is not None:
            counters.duplicates += 1
            pending.refs.append((peer_id, ref))
            return []
        token = next(self._tokens)
        self._in[fed_id] = _In(token, [(peer_id, ref)])
        self._in_tokens[token] = fed_id
        return [PushLocal(token, envelope)]

    def bad_message(self, ref: Any, reason: str) -> list[Action]:
        self.counters.bad_messages += 1
        return [Refuse(ref, reason, True)]

    def unlinked(self, ref: Any, reason: str) -> list[Action]:
        """A well-formed message from a broker not linked on the connection it came by.
        Refused busy, never for good: after this broker's restart (or a new connection of
        the peer's link) a peer's forwards -- those its link client queued while this
        broker was down go first -- can come before the interest exchange that links it
        again, and a refusal for good makes the sender give the message up (it would be
        lost, acknowledged to its producer).  An impostor is refused all the same: it
        gets "busy" as long as it tries."""
        self.counters.unlinked += 1
        return [Refuse(ref, reason, False)]

    def local_done(self, token: int, ok: bool, reason: str = "") -> list[Action]:
        """The local broker accepted (``ok``) or refused a peer's message."""
        fed_id = self._in_tokens.pop(token, None)
        if fed_id is None:
            return []
        pending = self._in.pop(fed_id)
        for peer_id, _ in pending.refs:
            left = self._in_by_peer[peer_id] - 1
            if left:
                self._in_by_peer[peer_id] = left
            else:
                del self._in_by_peer[peer_id]
        if not ok:
            self.counters.refused += 1
            reason = reason or "the broker did not take it"
            return [Refuse(ref, reason, False) for _, ref in pending.refs]
        self.counters.received += 1
        seen = self._seen
        seen[fed_id] = None
        while len(seen) > self.settings.seen_window:
            seen.popitem(last=False)
        return [Remember(fed_id), *(Confirm(ref) for _, ref in pending.refs)]

    def stats(self) -> dict[str, Any]:
        counts: dict[str, Any] = self.counters.snapshot()
        counts["pending"] = len(self._out)
        counts["peers"] = {
            p.id: {"up": p.up, "in_flight": p.in_flight, "waiting": len(p.waiting),
                   "interest": sorted(p.interest)}
            for p in self.peers.values()
        }  # fmt: skip
        counts["joined"] = sorted(self.joined)
        return counts
