"""The federation driver: one thread feeds the core and carries out its actions.

It holds this broker's federation client (client id
:data:`~broker.federation.wire.FEDERATION_CLIENT`, on the broker's own endpoint) and one
client per ``--link`` (type :data:`~broker.federation.wire.LINK_TYPE`, on the remote
broker, with CURVE keys when given).  The clients' I/O threads only queue events; this
thread alone touches the core.  Interest is pushed: the federation client subscribes to
the broker's ``ClientJoined``/``ClientLeft``/``ClientDisconnected`` events, and on one it
reads which local channels have subscribers (at most every :data:`PUSH_GAP` seconds) and
offers each peer whose interest from here changed the new one at once: a link peer by a
request on the link, an accepting broker's peer by a request to the link's client on this
broker (answered with that peer's interest).  Interest heard from one peer that changes
what this broker offers another is pushed the same way.  Every ``exchange_interval``
the full exchange runs anyway (it is the peers' liveness check, and it repairs anything
an event missed).  Links connect with backoff and reconnect by themselves (the broker
client's session); a peer that stops answering is down until an exchange succeeds again.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from broker.bridge.core import Backoff
from broker.client.blocking import Client, ClientError, Kind, Message, RemoteError
from broker.federation.core import (
    AckLocal,
    Action,
    Confirm,
    FederationCore,
    Forward,
    Join,
    Leave,
    NackLocal,
    Policy,
    PushLocal,
    Refuse,
    Remember,
    TrashLocal,
)
from broker.federation.errors import BadPeerMessage, ConfigError
from broker.federation.seen import SeenJournal
from broker.federation.settings import FederationSettings, LinkMode, LinkSpec
from broker.federation.wire import (
    BATCH,
    BATCH_OK,
    BATCH_REFUSED,
    BATCH_RETRY,
    FEDERATION_CLIENT,
    INTEREST,
    LINK_TYPE,
    MAX_BATCH,
    MESSAGE,
    STATS,
    Envelope,
    Interest,
    decode_batch,
    decode_interest,
    encode_batch,
    encode_interest,
    local_headers,
    message_headers,
    parse_message,
)
from broker.protocol import EventName, Header, NackReason, ResultCode

log = logging.getLogger(__name__)

#: Seconds the driver waits for an event before it looks at its timers.
IDLE_SLICE = 0.05
#: Seconds a link's first connect attempt may take before it is tried again.
CONNECT_TIMEOUT = 2.0
#: Smallest gap (seconds) between two local refreshes that events asked for: a burst of
#: joins costs one channel list.
PUSH_GAP = 0.02
#: Events after which the local interest is read again (and pushed if it changed).
INTEREST_EVENTS = (EventName.CLIENT_JOINED, EventName.CLIENT_LEFT, EventName.CLIENT_DISCONNECTED)
#: Seconds a call to this broker's own endpoint may take (join, leave, channel list).
LOCAL_TIMEOUT = 10.0
#: Local queue statuses that hand each message to one consumer (Push only with
#: OnlyFirstAcquirer: without it every consumer gets a copy).
ONE_CONSUMER = frozenset({"RoundRobin"})
#: Answers of a peer that does not know BATCH: 400, or 401 "not a federation message"
#: (what a zerohub from before BATCH answers).  Its messages then go one by one (a link
#: refused for good is refused those too, each with its own answer).
BATCH_UNKNOWN = frozenset({ResultCode.BAD_REQUEST, ResultCode.UNAUTHORIZED})
#: Test hook (crash tests only): with this variable set to 1 the process kills itself
#: (SIGKILL) as soon as a local push of a federated message is answered, before its id
#: reaches the seen journal -- the crash the engine's own window (``broker.engine.federated``)
#: makes harmless.
#: The trash reason of a message a peer refused for good in a BATCH (its answer is one
#: result octet per message: the peer logs the why).
BATCH_REFUSED_REASON = "refused in a batch (the reason is in that broker's log)"
KILL_AFTER_PUSH_ENV = "ZEROHUB_TEST_KILL_AFTER_FEDERATED_PUSH"


@dataclass(slots=True)
class _Link:
    """One ``--link``: the client on the remote broker and the peer's id once known."""

    spec: LinkSpec
    client: Client | None = None  # set once connected (the client reconnects by itself)
    connected: bool = False
    peer_id: str | None = None
    asking: bool = False  # an interest exchange is under way
    connect_failures: int = 0


# -- events from the clients' threads ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Local:
    message: Message


@dataclass(frozen=True, slots=True)
class _FromLink:
    link: _Link
    message: Message


@dataclass(slots=True)
class _BatchIn:
    """A peer's BATCH being answered: one result per message (``left`` to come)."""

    client: Client
    message: Message
    results: list[int]
    left: int


@dataclass(frozen=True, slots=True)
class _BatchItem:
    """The ``ref`` of one message of a BATCH (what Confirm/Refuse settle)."""

    batch: _BatchIn
    index: int


@dataclass(frozen=True, slots=True)
class _LocalChanged:
    """A client joined or left a local channel (an event of this broker)."""


@dataclass(frozen=True, slots=True)
class _Connected:
    link: _Link
    client: Client


@dataclass(frozen=True, slots=True)
class _Answer:
    """A future settled: ``then(future)`` runs on the driver thread."""

    future: Future[Any]
    then: Callable[[Future[Any]], list[Action]]


_Event = _Local | _FromLink | _Connected | _Answer | _LocalChanged


def local_proof(link_secret: str | None) -> tuple[str, str | None]:
    """What this broker's own federation client proves itself with, for the server that
    checks it (``ServerOptions.federation_secret``/``federation_key``) and the client
    (``Federation(local_secret=...)``): a fresh random secret, kept in memory only, and
    on a CURVE broker the public key (Z85) of the links' ``.key_secret`` file, which the
    client authenticates with (``local_keys``)."""
    key = None
    if link_secret is not None:
        from zerohub import zmqkit

        key = zmqkit.load_secret(link_secret)[0].decode("ascii")
    return secrets.token_urlsafe(32), key


class Federation:
    """A running federation: ``start()``, ``stop()``, ``stats()``."""

    def __init__(
        self,
        settings: FederationSettings,
        local_endpoint: str,
        *,
        context: zmq.Context[zmq.Socket[bytes]],
        local_keys: tuple[str, str] | None = None,
        local_secret: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.core = FederationCore(settings, secrets.token_hex(4))
        self.me = settings.broker_id
        self._context = context
        self._clock = clock
        self._events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        keys: dict[str, Any] = {}
        if local_keys is not None:
            keys = {"server_key": local_keys[0], "curve_secret": local_keys[1]}
        # a one-consumer queue hands it a message only when no local consumer has
        # room (broker.engine.channel.LOW_PRIORITY_PROPERTY); the secret: the broker
        # gives the reserved FEDERATION_CLIENT id only to a client showing it
        properties = {"Consumer-Priority": "low"}
        if local_secret is not None:
            properties[Header.FEDERATION_SECRET] = local_secret
        self.local = Client(
            local_endpoint,
            context=context,
            client_id=FEDERATION_CLIENT,
            client_type="zerohub-federation",
            name=f"federation-{self.me}",
            timeout=LOCAL_TIMEOUT,
            properties=properties,
            **keys,
        )
        self.links = [_Link(spec) for spec in settings.links]
        self._accepted: dict[str, str] = {}  # peer id -> its link's client id here
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._next_exchange = 0.0
        self._refresh_due = False  # an event said the local interest may have changed
        self._next_refresh = 0.0
        self._offers_due = False  # interest changed: offer peers what changed
        #: peer id -> the interest last offered to it (sent or answered)
        self._offered: dict[str, Interest] = {}
        self._offering: set[str] = set()  # accepted peers with a push under way
        self.pushes = 0  # interest offers pushed on a change (not the periodic exchange)
        #: (channel, queue id) -> does the local queue hand each message to one consumer
        #: (asked once per exchange period: a queue's status can change)
        self._one_consumer: dict[tuple[str, int], bool] = {}
        self._give_back: list[tuple[float, Message]] = []  # delayed nacks, by due time
        self.failure: BaseException | None = None
        self.errors = 0  # events the driver failed on (logged)
        #: confirms to peers held until the seen ids before them are durable
        self._confirms: list[Any] = []
        #: peer id -> forwards asked for during this turn (sent at its end, batched)
        self._outbox: dict[str, list[tuple[int, Envelope]]] = {}
        self._no_batch: set[str] = set()  # peers that refused a BATCH
        self.batches = 0  # BATCH requests sent
        self.journal: SeenJournal | None = None
        if settings.seen_file is not None:
            self.journal = SeenJournal(Path(settings.seen_file), settings.seen_window)
            try:
                self.core.remember(self.journal.load())
            except OSError as exc:
                raise ConfigError(f"federation seen window {settings.seen_file}: {exc}") from None

    def _link_client(self, spec: LinkSpec) -> Client:
        keys: dict[str, Any] = {}
        server_key = spec.server_key or self.settings.server_key
        if server_key is not None:
            keys = {"server_key": server_key, "curve_secret": self.settings.curve_secret}
        return Client(
            spec.endpoint,
            context=self._context,
            client_type=LINK_TYPE,
            name=f"link-{self.me}",
            timeout=self.settings.answer_timeout,
            **keys,
        )

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start in the background: the broker's own endpoint may not serve yet."""
        self._spawn(self._main, name="federation")

    def _connect_local(self) -> bool:
        """Connect the federation client to this broker (retried until it serves)."""
        self.local.on_message(lambda m: self._events.put(_Local(m)))
        backoff = Backoff(*self.settings.retry)
        while not self._stopping.is_set():
            try:
                self.local.connect(timeout=CONNECT_TIMEOUT)
            except ClientError as exc:
                log.warning("federation: cannot connect to this broker: %s", exc)
                self._stopping.wait(backoff.failed(0.0))
                continue
            for name in INTEREST_EVENTS:  # (the session subscribes again on a reconnect)
                try:
                    self.local.subscribe(name, lambda _m: self._events.put(_LocalChanged()))
                except ClientError as exc:  # the periodic exchange still works
                    log.warning("federation: no %s events (interest polled only): %s", name, exc)
            for link in self.links:
                self._spawn(self._connect_link, link, name="federation-connect")
            return True
        return False

    def _link_sink(self, link: _Link) -> Callable[[Message], None]:
        return lambda m: self._events.put(_FromLink(link, m))

    def _spawn(self, target: Callable[..., None], *args: Any, name: str) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        while self._threads:
            self._threads.pop().join(timeout)
        for link in self.links:
            if link.client is not None:
                link.client.close(timeout=1.0)
        self.local.close(timeout=1.0)
        if self.journal is not None:
            self.journal.close()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            counts = self.core.stats()
        counts["broker"] = self.me
        counts["interest_pushes"] = self.pushes
        counts["batches"] = self.batches
        counts["links"] = {
            link.spec.endpoint: {
                "connected": link.connected,
                "peer": link.peer_id,
                "connect_failures": link.connect_failures,
            }
            for link in self.links
        }
        return counts

    def _connect_link(self, link: _Link) -> None:
        """Connect with backoff, a new client per attempt (a client whose first connect
        failed is closed); once connected, the client reconnects by itself."""
        backoff = Backoff(*self.settings.retry)
        while not self._stopping.is_set():
            client = self._link_client(link.spec)
            client.on_message(self._link_sink(link))
            try:
                client.connect(timeout=CONNECT_TIMEOUT)
            except ClientError as exc:
                link.connect_failures += 1
                delay = backoff.failed(0.0)
                log.info("link to %s: cannot connect (%s)", link.spec.endpoint, exc)
                self._stopping.wait(delay)
                continue
            if self._stopping.is_set():
                client.close(timeout=1.0)
                return
            self._events.put(_Connected(link, client))
            return

    # -- the driver thread -------------------------------------------------------------

    def _main(self) -> None:
        try:
            if not self._connect_local():
                return
            while not self._stopping.is_set():
                self._turn()
        except BaseException as exc:  # say why federation stopped
            log.exception("federation driver failed")
            self.failure = exc

    def _turn(self) -> None:
        now = self._clock()
        if now >= self._next_exchange:
            self._next_exchange = now + self.settings.exchange_interval
            self._refresh_due = False
            self._refresh_local()
            for link in self.links:
                self._exchange(link)
        elif self._refresh_due and now >= self._next_refresh:
            self._refresh_due = False
            self._next_refresh = now + PUSH_GAP
            self._refresh_local()
        if self._offers_due:
            self._offers_due = False
            self._offer_changes()
        self._run(self._locked(lambda: self.core.poll(self._clock())))
        if self._give_back and self._give_back[0][0] <= now:
            due = [m for at, m in self._give_back if at <= now]
            self._give_back = [(at, m) for at, m in self._give_back if at > now]
            for m in due:
                self._quiet(self.local.nack, m, NackReason.NO_CONSUMERS)
        try:
            event = self._events.get(timeout=IDLE_SLICE)
        except queue.Empty:
            self._send_forwards()
            return
        try:
            while True:
                self._guarded(event)
                try:
                    event = self._events.get_nowait()
                except queue.Empty:
                    return
        finally:
            self._send_forwards()
            self._send_confirms()

    def _send_confirms(self) -> None:
        """Confirm what waited: the ids remembered before are made durable first (one
        fsync for the batch)."""
        if not self._confirms:
            return
        if self.journal is not None:
            with self._lock:
                newest = self.core.seen_ids() if self.journal.due_for_rewrite else None
            self.journal.sync(newest)
        confirms, self._confirms = self._confirms, []
        for ref in confirms:
            if isinstance(ref, _BatchItem):
                self._settle(ref, BATCH_OK)
            else:
                self._respond(ref[0], ref[1], b"")

    def _settle(self, item: _BatchItem, code: int) -> None:
        """One message of a peer's BATCH is answered; the batch once all are."""
        batch = item.batch
        batch.results[item.index] = code
        batch.left -= 1
        if batch.left == 0:
            self._respond(batch.client, batch.message, bytes(batch.results))

    def _guarded(self, event: _Event) -> None:
        """Feed one event; a failure is logged and counted, the driver goes on."""
        try:
            self._run(self._locked(lambda: self._feed(event)))
        except Exception:
            log.exception("federation: failed on %s", type(event).__name__)
            self.errors += 1

    def _locked(self, step: Callable[[], list[Action]]) -> list[Action]:
        with self._lock:
            return step()

    def _refresh_local(self) -> None:
        """Which local channels have subscribers besides the federation client."""
        try:
            channels = self.local.channels()
        except ClientError as exc:
            log.warning("federation: cannot list the local channels: %s", exc)
            return
        self._one_consumer.clear()
        with self._lock:
            joined = self.core.joined
            wanted = {
                c["Name"]
                for c in channels
                if int(c.get("ActiveClients", 0)) > (1 if c["Name"] in joined else 0)
            }
            if wanted != self.core.local:
                self._offers_due = True
            self.core.local_interest(wanted)

    def _offer_changes(self) -> None:
        """Offer each up peer whose interest from here changed since it last heard it."""
        with self._lock:
            core = self.core
            changed = {
                peer_id
                for peer_id, peer in core.peers.items()
                if peer.up and core.advert_for(peer_id) != self._offered.get(peer_id)
            }
        for link in self.links:
            if link.peer_id in changed:
                changed.discard(link.peer_id)
                if link.asking:  # its answer comes with a fresh look
                    self._offers_due = True
                else:
                    self.pushes += 1
                    self._exchange(link)
        for peer_id in changed:
            source = self._accepted.get(peer_id)
            if source is None:
                continue
            if peer_id in self._offering:
                self._offers_due = True
                continue
            self.pushes += 1
            self._push_offer(peer_id, source)

    def _push_offer(self, peer_id: str, source: str) -> None:
        """Offer an accepted peer our interest (a request to its link's client here)."""
        with self._lock:
            offer = self._offered[peer_id] = self.core.advert_for(peer_id)
        self._offering.add(peer_id)
        future = self.local.request_async(
            source,
            encode_interest(self.me, offer),
            content_type=INTEREST,
            timeout=self.settings.answer_timeout,
        )
        self._when(future, lambda done: self._offer_answered(peer_id, done))

    def _offer_answered(self, peer_id: str, done: Future[Any]) -> list[Action]:
        self._offering.discard(peer_id)
        error = done.exception()
        if error is not None:
            self._offered.pop(peer_id, None)  # offered again at the next change
            log.debug("interest push to %s failed: %s", peer_id, error)
            return []
        try:
            sender, interest = decode_interest(done.result().payload)
        except BadPeerMessage as exc:
            log.warning("interest push to %s: bad answer: %s", peer_id, exc)
            return []
        if sender != peer_id:
            return []
        return self._heard(peer_id, Policy(LinkMode.BOTH, self.settings.accept), interest)

    def _heard(self, peer_id: str, policy: Policy, interest: Interest) -> list[Action]:
        """A peer's interest, from any of the exchanges (what others are offered may
        change with it)."""
        self._offers_due = True
        return self.core.interest_heard(peer_id, policy, interest, self._clock())

    def _exchange(self, link: _Link) -> None:
        if link.client is None or link.asking:
            return
        with self._lock:
            offer = self.core.advert_for(link.peer_id)
        if link.peer_id is not None:
            self._offered[link.peer_id] = offer
        link.asking = True
        future = link.client.request_async(
            FEDERATION_CLIENT,
            encode_interest(self.me, offer),
            content_type=INTEREST,
            timeout=self.settings.answer_timeout,
        )
        self._when(future, lambda done: self._answered(link, done))

    def _when(self, future: Future[Any], then: Callable[[Future[Any]], list[Action]]) -> None:
        future.add_done_callback(lambda done: self._events.put(_Answer(done, then)))

    def _answered(self, link: _Link, done: Future[Any]) -> list[Action]:
        link.asking = False
        error = done.exception()
        if error is None:
            try:
                peer_id, interest = decode_interest(done.result().payload)
            except BadPeerMessage as exc:
                error = exc
        if error is not None:
            actions = self.core.peer_down(link.peer_id) if link.peer_id is not None else []
            log.debug("link to %s: interest exchange failed: %s", link.spec.endpoint, error)
            return actions
        if peer_id == self.me:
            log.warning("link to %s leads back to this broker: not used", link.spec.endpoint)
            return []
        if not self.core.accepts_peer(peer_id):
            log.warning("link to %s: more than %d linked brokers", link.spec.endpoint,
                        self.settings.max_peers)  # fmt: skip
            return []
        if link.peer_id != peer_id:
            self._offered.pop(peer_id, None)  # it was offered before its id was known
        link.peer_id = peer_id
        policy = Policy(link.spec.mode, link.spec.channels)
        return self._heard(peer_id, policy, interest)

    def _feed(self, event: _Event) -> list[Action]:
        match event:
            case _Local(message):
                return self._from_local(message)
            case _FromLink(link, message):
                return self._from_link(link, message)
            case _Connected(link, client):
                link.client = client
                link.connected = True
                log.info("link to %s connected", link.spec.endpoint)
                self._exchange(link)
            case _Answer(future, then):
                return then(future)
            case _LocalChanged():
                self._refresh_due = True
        return []

    def _from_local(self, m: Message) -> list[Action]:
        now = self._clock()
        if m.kind is Kind.QUEUE:
            frame = m.frame
            one = self._hands_to_one(m.channel, m.queue_id)
            again = (m.header(Header.REDELIVERED) or "").lower() == "true"
            return self.core.local_delivery(m.channel, m.queue_id, m.id, m.source, m.headers,
                                            m.payload, bool(frame.high_priority), m.needs_ack,
                                            m, now, one_consumer=one,
                                            redelivered=again)  # fmt: skip
        if m.kind is not Kind.DIRECT:
            return []
        ref = (self.local, m)
        if m.content_type == INTEREST:
            return self._interest_request(m)
        if m.content_type == MESSAGE:
            try:
                sender, envelope = parse_message(m.headers, m.payload)
            except BadPeerMessage as exc:
                return self.core.bad_message(ref, str(exc))
            if self._accepted.get(sender) != m.source:
                return self.core.unlinked(ref, f"no link of broker {sender!r} from here")
            return self.core.remote_message(sender, envelope, ref)
        if m.content_type == BATCH:
            return self._batch_in(self.local, m, lambda s: self._accepted.get(s) == m.source)
        if m.content_type == STATS:
            self._respond(self.local, m, json.dumps(self.stats(), sort_keys=True).encode())
            return []
        return self.core.bad_message(ref, f"unknown federation message {m.content_type}")

    def _hands_to_one(self, channel: str, queue_id: int) -> bool:
        """Does the local queue hand each message to one consumer?  Asked of the broker
        once per exchange period; if it cannot say, the queue is taken for a copying one
        (a delivery is then acknowledged once its peers have it, as before)."""
        key = (channel, queue_id)
        known = self._one_consumer.get(key)
        if known is None:
            try:
                info = self.local.queue_info(channel, queue_id)
            except ClientError as exc:
                log.warning("federation: cannot read queue %s/%d: %s", channel, queue_id, exc)
                return False
            status = info.get("Status")
            known = status in ONE_CONSUMER or (
                status == "Push" and bool(info.get("OnlyFirstAcquirer"))
            )
            self._one_consumer[key] = known
        return known

    def _interest_request(self, m: Message) -> list[Action]:
        """A linked broker (its link's client on this broker) offers its interest."""
        try:
            peer_id, interest = decode_interest(m.payload)
        except BadPeerMessage as exc:
            return self.core.bad_message((self.local, m), str(exc))
        if peer_id == self.me:
            return self.core.bad_message((self.local, m), "a link from this broker to itself")
        if not self.core.accepts_peer(peer_id):
            limit = self.settings.max_peers
            return self.core.bad_message((self.local, m), f"more than {limit} linked brokers")
        known = self._accepted.get(peer_id)
        peer = self.core.peers.get(peer_id)
        if known not in (None, m.source) and peer is not None and peer.up:
            # an impostor reusing a live broker's id (or a second link from it)
            return self.core.bad_message((self.local, m), f"broker {peer_id!r} is linked already")
        self._accepted[peer_id] = m.source
        policy = Policy(LinkMode.BOTH, self.settings.accept)
        actions = self._heard(peer_id, policy, interest)
        offer = self._offered[peer_id] = self.core.advert_for(peer_id)
        self._respond(self.local, m, encode_interest(self.me, offer))
        return actions

    def _from_link(self, link: _Link, m: Message) -> list[Action]:
        ref = (link.client, m)
        if m.kind is not Kind.DIRECT or link.client is None:
            return []
        if m.content_type == INTEREST and m.source == FEDERATION_CLIENT:
            return self._interest_pushed(link, m)
        if m.content_type == BATCH and m.source == FEDERATION_CLIENT:
            return self._batch_in(link.client, m, lambda s: s == link.peer_id)
        if m.content_type != MESSAGE or m.source != FEDERATION_CLIENT:
            return self.core.bad_message(ref, "not a federation message")
        try:
            sender, envelope = parse_message(m.headers, m.payload)
        except BadPeerMessage as exc:
            return self.core.bad_message(ref, str(exc))
        if sender != link.peer_id:
            return self.core.bad_message(
                ref, f"message from {sender!r} on the link to {link.peer_id!r}"
            )
        return self.core.remote_message(sender, envelope, ref)

    def _interest_pushed(self, link: _Link, m: Message) -> list[Action]:
        """The linked broker pushed its interest (it changed): answer with ours."""
        ref = (link.client, m)
        try:
            peer_id, interest = decode_interest(m.payload)
        except BadPeerMessage as exc:
            return self.core.bad_message(ref, str(exc))
        if link.peer_id is None or peer_id != link.peer_id:
            return self.core.bad_message(ref, f"interest of {peer_id!r} on this link")
        actions = self._heard(peer_id, Policy(link.spec.mode, link.spec.channels), interest)
        offer = self._offered[peer_id] = self.core.advert_for(peer_id)
        assert link.client is not None
        self._respond(link.client, m, encode_interest(self.me, offer))
        return actions

    # -- actions -----------------------------------------------------------------------

    def _run(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Forward(peer, token, envelope):
                    self._outbox.setdefault(peer, []).append((token, envelope))
                case AckLocal(ref):
                    if ref.needs_ack:
                        self._quiet(self.local.ack, ref)
                case TrashLocal(ref, reason):
                    log.warning("federation: a delivery of %s to its queue's trash: %s",
                                ref.channel, reason)  # fmt: skip
                    self._quiet(self.local.nack, ref, reason, put_back=False)
                case NackLocal(ref, delay):
                    if not ref.needs_ack:
                        pass
                    elif delay > 0:
                        self._give_back.append((self._clock() + delay, ref))
                        self._give_back.sort(key=lambda due: due[0])
                    else:
                        self._quiet(self.local.nack, ref, NackReason.NO_CONSUMERS)
                case PushLocal(token, envelope):
                    future = self.local.push_async(
                        envelope.channel,
                        envelope.queue_id,
                        envelope.payload,
                        headers=local_headers(envelope),
                        high_priority=envelope.high_priority,
                        timeout=self.settings.answer_timeout,
                    )
                    self._when(future, self._push_answer(token))
                case Remember(fed_id):
                    if self.journal is not None:
                        self.journal.add(fed_id)
                case Confirm(ref):
                    self._confirms.append(ref)
                case Refuse(ref, reason, permanent) if isinstance(ref, _BatchItem):
                    log.info("refused a message of a batch: %s", reason)
                    self._settle(ref, BATCH_REFUSED if permanent else BATCH_RETRY)
                case Refuse(ref, reason, permanent):
                    code = ResultCode.UNAUTHORIZED if permanent else ResultCode.BUSY
                    self._respond(ref[0], ref[1], b"", code, reason)
                case Join(channel):
                    self._quiet(self.local.join, channel, timeout=LOCAL_TIMEOUT,
                                prefetch=self.settings.max_pending)  # fmt: skip
                case Leave(channel):
                    self._quiet(self.local.leave, channel, timeout=LOCAL_TIMEOUT)

    def _send_forwards(self) -> None:
        """Send what the core asked to forward during this turn: to each peer, one
        BATCH of what is ready at once (single MESSAGEs to a peer without BATCH)."""
        outbox, self._outbox = self._outbox, {}
        for peer, items in outbox.items():
            if len(items) == 1 or peer in self._no_batch:
                for token, envelope in items:
                    self._forward(peer, token, envelope)
                continue
            for at in range(0, len(items), MAX_BATCH):
                self._forward_batch(peer, items[at : at + MAX_BATCH])

    def _route(self, peer: str) -> tuple[Client, str] | None:
        """The client and target that reach ``peer``'s federation client."""
        for link in self.links:
            if link.peer_id == peer and link.client is not None:
                return link.client, FEDERATION_CLIENT
        if peer in self._accepted:
            return self.local, self._accepted[peer]
        return None

    def _forward_batch(self, peer: str, items: list[tuple[int, Envelope]]) -> None:
        tokens = [token for token, _ in items]
        route = self._route(peer)
        if route is None:
            failed: Future[Any] = Future()
            failed.set_exception(ClientError(f"no connection to {peer}"))
            self._events.put(_Answer(failed, lambda done: self._batch_done(peer, tokens, done)))
            return
        client, target = route
        payload = encode_batch([(message_headers(e, self.me), e.payload) for _, e in items])
        self.batches += 1
        future = client.request_async(
            target, payload, content_type=BATCH, timeout=self.settings.answer_timeout
        )
        self._when(future, lambda done: self._batch_done(peer, tokens, done))

    def _batch_done(self, peer: str, tokens: list[int], done: Future[Any]) -> list[Action]:
        """A peer's answer to a BATCH: one result per message (all failed, to be sent
        again, if the batch itself failed; a peer that does not know BATCH gets single
        messages from then on)."""
        now = self._clock()
        error = done.exception()
        results = b""
        if error is None:
            results = bytes(done.result().payload)
        elif isinstance(error, RemoteError) and error.code in BATCH_UNKNOWN:
            log.warning("broker %s does not take batches: single messages to it", peer)
            self._no_batch.add(peer)
        if error is None and len(results) != len(tokens):
            log.warning("broker %s answered a batch of %d with %d results", peer,
                        len(tokens), len(results))  # fmt: skip
            results = b""
        actions: list[Action] = []
        with self._lock:
            for n, token in enumerate(tokens):
                code = results[n] if results else BATCH_RETRY
                ok, permanent = code == BATCH_OK, code == BATCH_REFUSED
                actions += self.core.forward_done(token, peer, ok, now, permanent,
                                                  BATCH_REFUSED_REASON)  # fmt: skip
        return actions

    def _batch_in(
        self, client: Client, m: Message, senders: Callable[[str], bool]
    ) -> list[Action]:
        """A peer's BATCH (``senders``: which Fed-Broker may send on this connection)."""
        try:
            items = decode_batch(m.payload)
        except BadPeerMessage as exc:
            return self.core.bad_message((client, m), str(exc))
        batch = _BatchIn(client, m, [BATCH_RETRY] * len(items), len(items))
        actions: list[Action] = []
        for index, (headers, payload) in enumerate(items):
            item = _BatchItem(batch, index)
            try:
                sender, envelope = parse_message(headers, payload)
            except BadPeerMessage as exc:
                actions += self.core.bad_message(item, str(exc))
                continue
            if not senders(sender):
                actions += self.core.unlinked(item, f"no link of broker {sender!r} here")
                continue
            actions += self.core.remote_message(sender, envelope, item)
        return actions

    def _forward(self, peer: str, token: int, envelope: Any) -> None:
        headers = message_headers(envelope, self.me)
        route = self._route(peer)
        client, target = route if route is not None else (None, FEDERATION_CLIENT)
        if client is None:
            failed: Future[Any] = Future()
            failed.set_exception(ClientError(f"no connection to {peer}"))
            self._events.put(_Answer(failed, lambda done: self._forwarded(peer, token, done)))
            return
        future = client.request_async(
            target,
            envelope.payload,
            content_type=MESSAGE,
            headers=headers,
            timeout=self.settings.answer_timeout,
        )
        self._when(future, lambda done: self._forwarded(peer, token, done))

    def _forwarded(self, peer: str, token: int, done: Future[Any]) -> list[Action]:
        error = done.exception()
        now = self._clock()
        if error is None:
            return self.core.forward_done(token, peer, True, now)
        permanent = isinstance(error, RemoteError) and error.code in (
            ResultCode.UNAUTHORIZED,
            ResultCode.BAD_REQUEST,
        )
        reason = ""
        if permanent:
            log.warning("broker %s refused a forwarded message: %s", peer, error)
            reason = str(error)
        return self.core.forward_done(token, peer, False, now, permanent, reason)

    def _push_answer(self, token: int) -> Callable[[Future[Any]], list[Action]]:
        return lambda done: self._pushed(token, done)

    def _pushed(self, token: int, done: Future[Any]) -> list[Action]:
        error = done.exception()
        if error is None and os.environ.get(KILL_AFTER_PUSH_ENV) == "1":
            os.kill(os.getpid(), signal.SIGKILL)  # the crash test's moment (see above)
        return self.core.local_done(token, error is None, str(error or ""))

    def _respond(
        self, client: Client, m: Message, payload: bytes, code: int = 0, reason: str = ""
    ) -> None:
        if not m.needs_response:
            return
        headers = (("Reason", reason[:200]),) if reason else None
        self._quiet(client.respond, m, payload, code=code, headers=headers)

    @staticmethod
    def _quiet(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """A call whose failure is logged: the client reconnects, the peer asks again."""
        try:
            call(*args, **kwargs)
        except ClientError as exc:
            log.warning("federation: %s failed: %s", getattr(call, "__name__", call), exc)
