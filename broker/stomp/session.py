"""Sans-IO STOMP connection: bytes and ``now`` in, bytes and deadlines out.

``Session.receive(data, now)`` parses what the peer sent and acts on it through the
:class:`~broker.stomp.backend.Backend`; ``deliver(delivery)`` (the sink the backend
calls) turns a delivery into a MESSAGE frame; ``tick(now)`` sends heart-beats and
enforces timeouts; ``take_output(now)`` hands the bytes to write; ``next_deadline()``
says when ``tick`` must run next; ``closed`` says when the transport must be closed.
Times are seconds (``time.monotonic()`` in the listener, fake clocks in tests).

Rules enforced here:

* the first frame must be CONNECT or STOMP (within ``connect_timeout``); anything else
  gets an ERROR.  ``accept-version`` picks the highest common version (absent = 1.0;
  none in common = ERROR with a ``version`` header listing ours).  A ``host`` must
  name a configured virtual host (ERROR otherwise, except on 1.0, which gets the
  first one); without ``host`` the first one is used, unless ``require_host`` (then
  1.1+ gets an ERROR).  ``login``/``passcode`` go to the authenticator, which returns
  the user id or ``None`` (ERROR "authentication failed").
* heart-beats (1.1+): we offer ``config.heartbeat`` as ``sx,sy``; we send an EOL every
  ``max(sx, cy)`` ms without other output; the peer is dead (the connection closes)
  after ``max(cx, sy) * heartbeat_grace`` ms without any byte from it.  0 disables.
* any frame carrying ``receipt`` gets a RECEIPT once done (an ERROR it caused carries
  ``receipt-id``); DISCONNECT with ``receipt`` is answered, then the connection closes.
  "Done" includes what the backend applies later (an :class:`AfterApplied` backend,
  the engine's: ACKs handed to its thread): the RECEIPT waits for its answer.
* bad input (a malformed frame, a crossed limit, a rule broken) gets one ERROR frame
  with a ``message`` header and a text body; input after it is ignored and the
  connection closes ``die_delay`` later.  Other connections are not affected.  The
  frames read before the bad one are handled first, and the ERROR waits for the
  backend's answers to the SENDs before it: their RECEIPTs leave first.
* SUBSCRIBE: ids are unique per connection (1.1+ requires one); at most
  ``max_subscriptions``, and at most ``max_wildcard_subscriptions`` wildcard destinations
  among them (each wildcard part of a composite counts; the broker-wide pattern budget
  is shared by every client, so one connection may not take it all); a temporary
  destination of another connection is refused.
  UNSUBSCRIBE: by ``id`` (1.0 may give ``destination``); ``persistent:true`` destroys a
  durable subscription.
* ACK/NACK: 1.2 names the delivery by ``id`` (our MESSAGE ``ack`` header); 1.1 by
  ``message-id`` + ``subscription``; 1.0 by ``message-id``.  ``client`` mode settles
  every earlier pending delivery of that subscription too (cumulative);
  ``client-individual`` settles one.  An id that names no pending delivery is ignored
  (a duplicate ACK is harmless).
* BEGIN/COMMIT/ABORT: SEND, ACK and NACK carrying ``transaction`` are buffered and
  applied in order at COMMIT, dropped at ABORT or disconnect.  A buffered ACK returns
  the credit of what it names at once (``Backend.credit``), as the Apollo manual says;
  an ABORT does not take it back and a later ACK of the same delivery adds none.  An unknown or
  duplicate transaction id is an ERROR.  Limits: ``max_transactions`` open,
  ``max_transaction_frames`` buffered frames per transaction, ``max_transaction_bytes``
  buffered (bodies and headers) over all of a connection's open transactions.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from broker.stomp.backend import (
    AfterApplied,
    AsyncPublisher,
    Backend,
    BatchPublisher,
    ConnectionInfo,
    Delivery,
    Refusal,
    RunReceiver,
)
from broker.stomp.destinations import parse_destinations, temp_owner
from broker.stomp.errors import (
    BackendError,
    EncodeError,
    ProtocolViolation,
    StompError,
    VersionMismatch,
)
from broker.stomp.frames import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    Command,
    Frame,
    FrameParser,
    Limits,
    SendStreak,
    Version,
    escape_table,
    make_frame,
    serialize,
    serialize_receipt,
    serialize_receipts,
)
from broker.stomp.subscription import (
    AckMode,
    SubscriptionSpec,
    parse_send,
    parse_subscribe,
    read_send_run,
)
from broker.stomp.vhosts import DEFAULT_VIRTUAL_HOSTS, VirtualHost

SUPPORTED_VERSIONS = (Version.V1_0, Version.V1_1, Version.V1_2)
SERVER_NAME = "zerohub/0.1"


@dataclass(frozen=True, slots=True)
class Credentials:
    login: str | None
    passcode: str | None
    virtual_host: str
    version: Version
    peer: str
    #: The listener's id of the connection asking (a backend registers it under that id).
    connection_id: int = 0


#: Returns the user id for these credentials, or None to refuse the connection; may
#: raise BackendError (the broker could not answer: the client gets that ERROR).
Authenticator = Callable[[Credentials], "str | None"]


def allow_anyone(credentials: Credentials) -> str | None:
    """The default authenticator: everyone is let in, as ``login`` or ``anonymous``."""
    return credentials.login or "anonymous"


@dataclass(frozen=True, slots=True)
class SessionConfig:
    limits: Limits = field(default_factory=Limits)
    virtual_hosts: tuple[VirtualHost, ...] = DEFAULT_VIRTUAL_HOSTS
    broker_id: str = "default"
    #: 1.1+ CONNECT without ``host``: refused when True, else the first virtual host
    #: (stomp.py's 1.1 client sends no ``host`` unless given a vhost).
    require_host: bool = False
    #: (sx, sy) offered in CONNECTED: we can send every sx ms, want to hear every sy ms.
    heartbeat: tuple[int, int] = (10_000, 10_000)
    #: The peer is dead after this many times the negotiated receive interval.
    heartbeat_grace: float = 2.0
    #: Seconds between an ERROR frame and the close (Apollo's ``die_delay``).
    die_delay: float = 0.5
    #: Seconds a new connection has to send CONNECT.
    connect_timeout: float = 10.0
    max_subscriptions: int = 1000
    #: Wildcard destinations held by one connection's subscriptions (each subscription
    #: counts its own; a composite counts each wildcard part): the same default as a
    #: TMQP client's ``max_pattern_joins``.
    max_wildcard_subscriptions: int = 16
    max_transactions: int = 16
    max_transaction_frames: int = 10_000
    #: Bytes (bodies and header text) buffered by all of one connection's open
    #: transactions: room for one frame of ``Limits.max_body`` (100 MiB) and its headers.
    max_transaction_bytes: int = 128 * 1024 * 1024
    #: With a backend that publishes asynchronously: SENDs in flight (not yet answered)
    #: per connection, and their body bytes; past either, a SEND waits for its answer.
    max_unanswered_sends: int = 1000
    max_unanswered_bytes: int = 16 * 1024 * 1024
    add_user_header: str | None = None
    add_timestamp_header: str | None = None
    add_redeliveries_header: str | None = None


class SessionState(Enum):
    AWAITING_CONNECT = "awaiting-connect"
    CONNECTED = "connected"
    CLOSING = "closing"  # ERROR or DISCONNECT answered; input ignored
    CLOSED = "closed"  # the transport must be closed now


@dataclass(slots=True)
class _Pending:
    message_id: str
    tag: int


@dataclass(slots=True)
class _Answer:
    """A frame whose RECEIPT waits for an earlier (asynchronous) SEND's answer."""

    receipt: str | None
    size: int = 0
    done: bool = False
    close: bool = False  # DISCONNECT: close once it is answered
    #: SENDs it stands for (a batch: ``Session._publish_run``; else 1)
    count: int = 1
    #: A batch: each SEND's receipt (None: it asked for none), in order; empty when
    #: none of them asked for one.
    receipts: list[str | None] | None = None
    #: An ERROR that waited for the answers before it (``Session._fail_after_answers``):
    #: sent with ``receipt`` as its ``receipt-id``, instead of a RECEIPT.
    error: str | None = None


#: Destination lines kept per subscription by the MESSAGE encoder (a wildcard one may
#: see many destinations: the cache starts again when full).
DESTINATION_LINES = 64
#: The names of the headers every MESSAGE has (user headers by these names are not sent).
_MESSAGE_NAMES = frozenset({"subscription", "message-id", "destination", "content-length"})
_ACK_NAMES = _MESSAGE_NAMES | {"ack"}
#: Frames whose backend call waits for the broker (``EngineBackend._call``), which has
#: applied every frame before them when it returns: their RECEIPT needs no
#: :class:`AfterApplied` answer (a SUBSCRIBE's backlog then follows its RECEIPT).
_APPLIED_ON_RETURN = frozenset({Command.CONNECT, Command.STOMP, Command.SUBSCRIBE})


@dataclass(slots=True)
class _Subscription:
    spec: SubscriptionSpec
    pending: OrderedDict[int, _Pending] = field(default_factory=OrderedDict)
    #: The start of every MESSAGE of this subscription on 1.1/1.2, escaped once:
    #: ``MESSAGE``, ``subscription:ID``, the ``message-id:`` name (see Session._encode).
    head: str = ""
    #: destination -> its escaped ``destination:`` line (with the EOLs around it)
    destination_lines: dict[str, str] = field(default_factory=dict)

    def make_lines(self, destination: str, table: dict[int, str]) -> str:
        """:attr:`head` made if not yet, and ``destination``'s line, made and kept
        (at most ``DESTINATION_LINES``): what the MESSAGE encoders look up first."""
        if not self.head:
            self.head = f"MESSAGE\nsubscription:{self.spec.id.translate(table)}\nmessage-id:"
        line = self.destination_lines.get(destination)
        if line is None:
            if len(self.destination_lines) >= DESTINATION_LINES:
                self.destination_lines.clear()
            line = f"\ndestination:{destination.translate(table)}\n"
            self.destination_lines[destination] = line
        return line


class Session:
    def __init__(
        self,
        backend: Backend,
        connection_id: int,
        now: float,
        *,
        config: SessionConfig | None = None,
        authenticator: Authenticator = allow_anyone,
        peer: str = "",
        wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        writable: Callable[[], bool] = lambda: True,
        on_delivery: Callable[[], None] = lambda: None,
        room: Callable[[], int] | None = None,
    ) -> None:
        self.config = config or SessionConfig()
        self.writable = writable  # False: the transport is full, deliveries are refused
        #: Bytes of output the transport has room for now (<= 0: none; ``writable`` is
        #: then False); read once per run of deliveries (:meth:`deliver_run`).  None: ask
        #: ``writable`` per delivery.
        self.room = room
        self.on_delivery = on_delivery  # a delivery added output (outside receive/tick)
        self.backend = backend
        self.connection_id = connection_id
        self.peer = peer
        self.authenticator = authenticator
        self.wall_clock_ms = wall_clock_ms
        self.state = SessionState.AWAITING_CONNECT
        self.version: Version | None = None
        self.info: ConnectionInfo | None = None
        self.error: str | None = None  # why the session closed, when it was not asked to
        self._parser = FrameParser(self.config.limits, CLIENT_COMMANDS)
        self._out = bytearray()
        self._created = now
        self._last_received = now
        self._last_sent = now
        self._send_interval = 0.0
        self._receive_interval = 0.0
        self._close_at: float | None = None
        self._subscriptions: dict[str, _Subscription] = {}
        self._wildcards = 0  # wildcard destinations of _subscriptions, all counted
        self._tag_owner: dict[int, str] = {}  # delivery tag -> subscription id
        self._transactions: dict[str, list[Frame]] = {}
        self._transaction_bytes = 0  # what _transactions' frames hold (_frame_size)
        self._attached = False
        self._async = backend if isinstance(backend, AsyncPublisher) else None
        #: Receipts wait for the backend to apply every frame before them (AfterApplied).
        self._applied = backend if isinstance(backend, AfterApplied) else None
        #: Runs of plain SENDs go to the backend in one call (``_publish_run``).
        self._batch = (
            backend if self._async is not None and isinstance(backend, BatchPublisher) else None
        )
        #: Receipts in order, behind SENDs still waiting for the backend's answer.
        self._unanswered: deque[_Answer] = deque()
        self._unanswered_bytes = 0
        self._unanswered_count = 0  # SENDs (and receipts) in _unanswered
        self._deferred = False  # the frame being handled answers later
        #: Frames read but not handled yet: a SEND found the window of unanswered SENDs
        #: full, so it and everything after it wait for answers (in order).  The I/O
        #: layer stops reading meanwhile (``reading_paused``), which bounds this to what
        #: one read brought.  With a batch backend the parser gives SENDs of one repeated
        #: head as one :class:`SendStreak` (``_publish_run`` takes it whole, or its SENDs
        #: go one by one: ``_drain``).
        self._parked: deque[Frame | SendStreak] = deque()
        #: Why the parser failed, once it did: the ERROR follows the frames parked
        #: before the bad one (``_drain``); input after it is ignored.
        self._bad_input: str | None = None
        self._draining = False
        self._now = now

    # -- the I/O layer's side -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.state is SessionState.CLOSED

    def receive(self, data: bytes, now: float) -> None:
        if self.state in (SessionState.CLOSING, SessionState.CLOSED):
            return
        if self._bad_input is not None:
            return  # (reading stops once the parser failed: see _drain)
        self._last_received = self._now = now
        frames: Sequence[Frame | SendStreak]
        if self._batch is not None:
            frames, bad = self._parser.feed_streaks_until_error(data)
        else:
            frames, bad = self._parser.feed_until_error(data)
        if bad is not None:
            self._bad_input = str(bad)  # reported after the frames before it
        if frames or bad is not None:
            self._parked.extend(frames)
            self._drain(now)

    @property
    def reading_paused(self) -> bool:
        """True while read frames wait for answers to earlier SENDs: read no more."""
        return bool(self._parked)

    def _window_full(self) -> bool:
        return (
            self._unanswered_count >= self.config.max_unanswered_sends
            or self._unanswered_bytes >= self.config.max_unanswered_bytes
        )

    def _drain(self, now: float) -> None:
        """Handle parked frames in order, up to a SEND the window has no room for."""
        if self._draining:
            return  # an answer given while handling a frame: the loop below goes on
        self._draining = True
        parked = self._parked
        try:
            while parked:
                if self.state not in (SessionState.AWAITING_CONNECT, SessionState.CONNECTED):
                    parked.clear()  # an ERROR or DISCONNECT ended the session: ignored
                    return
                frame = parked[0]
                if (
                    frame.command is Command.SEND
                    and self._async is not None
                    and self.state is SessionState.CONNECTED
                ):
                    if self._window_full() and frame.header("transaction") is None:
                        return  # resumed by _answered
                    if self._batch is not None and self._publish_run(now):
                        continue
                parked.popleft()
                if isinstance(frame, SendStreak):  # (not a run's: its SENDs one by one)
                    parked.extendleft(reversed(frame.frames()))
                    continue
                self._handle(frame, now)
            if self._bad_input is not None and self.state in (
                SessionState.AWAITING_CONNECT,
                SessionState.CONNECTED,
            ):  # every frame before the bad one handled, none ended the session
                self._fail_after_answers(self._bad_input, now)
        finally:
            self._draining = False

    def tick(self, now: float) -> None:
        self._now = now
        if self.state is SessionState.CLOSING:
            if self._close_at is not None and now >= self._close_at:
                self.state = SessionState.CLOSED
            return
        if self.state is SessionState.AWAITING_CONNECT:
            if now - self._created >= self.config.connect_timeout:
                self._fail("no CONNECT frame in time", now)
            return
        if self.state is not SessionState.CONNECTED:
            return
        if self._parked:
            self._last_received = now  # we are the ones not reading: no timeout
        if self._receive_interval and now - self._last_received >= (
            self._receive_interval * self.config.heartbeat_grace
        ):
            self.error = "heart-beat timeout: nothing received from the client"
            self.state = SessionState.CLOSED
            return
        if self._send_interval and now - self._last_sent >= self._send_interval and not self._out:
            self._out += HEARTBEAT

    def next_deadline(self) -> float | None:
        if self.state is SessionState.CLOSING:
            return self._close_at
        if self.state is SessionState.AWAITING_CONNECT:
            return self._created + self.config.connect_timeout
        if self.state is not SessionState.CONNECTED:
            return None
        deadlines = []
        if self._receive_interval:
            grace = self._receive_interval * self.config.heartbeat_grace
            deadlines.append(self._last_received + grace)
        if self._send_interval:
            deadlines.append(self._last_sent + self._send_interval)
        return min(deadlines) if deadlines else None

    @property
    def pending_output(self) -> int:
        """Bytes produced and not yet taken by :meth:`take_output`."""
        return len(self._out)

    def take_output(self, now: float) -> bytes | bytearray:
        """The output produced so far, handed over (not copied: the session writes on in
        a new buffer, and never touches the one it returned)."""
        data = self._out
        if not data:
            return b""
        self._out = bytearray()
        self._last_sent = now
        return data

    def connection_lost(self) -> None:
        """The transport is gone: open transactions are dropped, the backend detaches."""
        self._transactions.clear()
        self._transaction_bytes = 0
        self._parked.clear()
        if self.state is not SessionState.CLOSED:
            self.state = SessionState.CLOSED
        if self._attached:
            self._attached = False
            self.backend.detach(self.connection_id)

    # -- the backend's side ---------------------------------------------------------------

    def deliver(self, delivery: Delivery) -> bool:
        """The delivery sink: appends a MESSAGE frame.

        False (not taken) once the session is over, for an unknown subscription, or
        while ``writable()`` says the transport is full.
        """
        if self.state is not SessionState.CONNECTED or self.version is None:
            return False
        sub = self._subscriptions.get(delivery.subscription)
        if sub is None or not self.writable():
            return False
        self._append(sub, delivery)
        self.on_delivery()
        return True

    def deliver_run(self, deliveries: Sequence[Delivery]) -> int:
        """The run sink (:class:`~broker.stomp.backend.RunReceiver`): :meth:`deliver` of
        each in turn, the transport's room read once (``room``) and counted down by the
        frames appended; returns how many were taken (the first ones)."""
        if self.state is not SessionState.CONNECTED or self.version is None:
            return 0
        if self.room is None:  # no byte count: the single sink's question each time
            taken = 0
            for delivery in deliveries:
                if not self.deliver(delivery):
                    break
                taken += 1
            return taken
        budget = self.room()
        subscriptions = self._subscriptions
        out = self._out
        encode = self._encode
        usual = self.version is not Version.V1_0
        auto = AckMode.AUTO
        config = self.config
        extras = (
            config.add_user_header or config.add_timestamp_header or config.add_redeliveries_header
        )
        table = escape_table(self.version)
        plain: _Subscription | None = None  # one whose MESSAGEs have no header to add
        taken = 0
        for delivery in deliveries:
            sub = subscriptions.get(delivery.subscription)
            if sub is None:
                break
            if budget <= 0:
                self.writable()  # (False: the transport learns it refused one)
                break
            before = len(out)
            if usual and sub.spec.ack is auto and not delivery.browse_end:
                # (_append's case of it, without its call)
                line = sub.destination_lines.get(delivery.destination) if sub is plain else None
                if line is not None and not delivery.headers:
                    # _encode's usual MESSAGE, the same bytes, without its call: the head
                    # and destination line that encode made for this subscription
                    body = delivery.body
                    mid = delivery.message_id
                    if "\\" in mid or ":" in mid or "\n" in mid or "\r" in mid:
                        mid = mid.translate(table)  # (most ids hold nothing to escape)
                    text = f"{sub.head}{mid}{line}content-length:{len(body)}\n\n"
                    if "\0" in text:
                        raise EncodeError("a MESSAGE header contains NUL")
                    out += text.encode("utf-8")
                    out += body
                    out += b"\0"
                else:
                    out += encode(sub, delivery)
                    if not (extras or sub.spec.include_seq):
                        plain = sub
            else:
                self._append(sub, delivery)
            budget -= len(out) - before
            taken += 1
        if taken:
            self.on_delivery()
        return taken

    def deliver_plain(
        self,
        subscription: str,
        destination: str,
        ids: Sequence[str],
        bodies: Sequence[bytes | memoryview],
    ) -> int:
        """The plain run sink (:data:`~broker.stomp.backend.PlainRunSink`): the MESSAGEs
        of an ``ack:auto`` subscription with no header to carry, from their ids and
        bodies -- the bytes :meth:`deliver_run` writes for their deliveries (tests
        compare them), the transport's room read once.  -1 (nothing taken) when the
        subscription is unknown, not ``ack:auto``, or its MESSAGEs carry more (STOMP 1.0
        frames, ``include-seq``, a header the broker adds).

        The run is made as one ``bytes.join`` of its pieces (the head, each id, the
        destination and length line per body size, each body), the ids escaped and
        encoded together: per message no string is formatted and no bytes appended
        one by one.  The room decides as in :meth:`deliver_run` (a message is taken
        while the room left before it is positive); an id holding NUL is an
        :class:`EncodeError` once the messages before it are written."""
        if self.state is not SessionState.CONNECTED or self.version is None or self.room is None:
            return -1
        sub = self._subscriptions.get(subscription)
        config = self.config
        if (
            sub is None
            or sub.spec.ack is not AckMode.AUTO
            or sub.spec.include_seq
            or self.version is Version.V1_0
            or config.add_user_header
            or config.add_timestamp_header
            or config.add_redeliveries_header
        ):
            return -1
        table = escape_table(self.version)
        line = sub.destination_lines.get(destination)
        if line is None or not sub.head:
            line = sub.make_lines(destination, table)
        head = sub.head
        if "\0" in head or "\0" in line:
            raise EncodeError("a MESSAGE header contains NUL")
        count = len(ids)
        if count != len(bodies):
            raise ValueError(f"{count} ids for {len(bodies)} bodies")
        if not count:
            return 0
        budget = self.room()
        if budget <= 0:
            self.writable()  # (False: the transport learns it refused one)
            return 0
        text = "\0".join(ids)  # (NUL: in no escaped id, so it splits them apart again)
        if "\\" in text or ":" in text or "\n" in text or "\r" in text:
            text = text.translate(table)  # (most runs hold nothing to escape)
        mids = text.encode().split(b"\0")
        nul_at = -1  # the first id holding NUL: the run ends before it, then refused
        if len(mids) != count:
            nul_at = next(i for i, mid in enumerate(ids) if "\0" in mid)
            count = nul_at
            del mids[count:]
            bodies = bodies[:count]
        sizes = list(map(len, bodies))
        first = head.encode()
        size = sizes[0] if count else 0
        if sizes.count(size) == count:  # (the usual run: one body size, one length line)
            lines = [f"{line}content-length:{size}\n\n".encode()] * count
        else:
            ends = dict.fromkeys(sizes, b"")
            for size in ends:
                ends[size] = f"{line}content-length:{size}\n\n".encode()
            lines = list(map(ends.__getitem__, sizes))
        parts: list[bytes | memoryview]
        if count == 1:  # (a message alone: no slicing)
            parts = [first, mids[0], lines[0], bodies[0]]
        else:  # a frame's NUL before the next head
            parts = [b"\0" + first] * (4 * count)
            if count:
                parts[0] = first
                parts[1::4] = mids
                parts[2::4] = lines
                parts[3::4] = bodies
        data = b"".join(parts)
        taken = count
        whole = len(data) + 1 if count else 0  # (the last frame's NUL too)
        if whole <= budget:  # (the usual case: the run fits)
            budget -= whole
        else:  # the room ends within the run: the messages taken before it ran out
            taken = 0
            frame = len(first) + 1
            for mid, end, size in zip(mids, lines, sizes, strict=True):
                if budget <= 0:
                    break
                budget -= frame + len(mid) + len(end) + size
                taken += 1
            data = b"".join(parts[: 4 * taken])
        if taken:
            out = self._out
            out += data
            out += b"\0"
        if taken < count or (nul_at >= 0 and budget <= 0):
            self.writable()  # (False: the transport learns it refused one)
        elif nul_at >= 0:
            raise EncodeError("a MESSAGE header contains NUL")
        if taken:
            self.on_delivery()
        return taken

    def _append(self, sub: _Subscription, delivery: Delivery) -> None:
        """The MESSAGE frame of ``delivery`` into the output; its tag pending an ACK.  On
        1.0 (no escapes) an id holding LF goes as the id the backend makes for one STOMP
        cannot carry (``tag-N``, as for NUL: ``engine_backend._delivery``), which 1.0
        ACKs then name; a destination holding LF (a TMQP channel's, matched by a wildcard)
        with it URL-encoded (``%0A``, as STOMP names write other characters)."""
        if delivery.browse_end or self.version is Version.V1_0:
            if "\n" in delivery.message_id:
                delivery = delivery._replace(message_id=f"tag-{delivery.tag}")
            if "\n" in delivery.destination:
                delivery = delivery._replace(destination=delivery.destination.replace("\n", "%0A"))
            self._send(self._message_frame(sub.spec, delivery))
        else:  # (every other delivery: no Frame built, no header list)
            self._out += self._encode(sub, delivery)
        if not delivery.browse_end and sub.spec.ack is not AckMode.AUTO:
            sub.pending[delivery.tag] = _Pending(delivery.message_id, delivery.tag)
            self._tag_owner[delivery.tag] = sub.spec.id

    def _encode(self, sub: _Subscription, delivery: Delivery) -> bytes:
        """The MESSAGE frame of ``delivery`` on 1.1/1.2: the same bytes as
        ``serialize_escaped(MESSAGE, _message_headers(...))`` (tests compare them),
        with what is the same for every message of ``sub`` encoded once."""
        assert self.version is not None
        table = escape_table(self.version)
        spec = sub.spec
        destination = delivery.destination
        line = sub.destination_lines.get(destination)
        if line is None or not sub.head:
            line = sub.make_lines(destination, table)
        body = delivery.body
        ack = self.version is Version.V1_2 and spec.ack is not AckMode.AUTO
        config = self.config
        if not (
            ack
            or delivery.headers
            or spec.include_seq
            or config.add_user_header
            or config.add_timestamp_header
            or config.add_redeliveries_header
        ):  # the usual MESSAGE: nothing but its head, id, destination and length
            mid = delivery.message_id
            if "\\" in mid or ":" in mid or "\n" in mid or "\r" in mid:
                mid = mid.translate(table)  # (most ids hold nothing to escape)
            text = f"{sub.head}{mid}{line}content-length:{len(body)}\n\n"
            if "\0" in text:
                raise EncodeError("a MESSAGE header contains NUL")
            return b"".join((text.encode("utf-8"), body, b"\0"))
        parts = [sub.head, delivery.message_id.translate(table), line]
        if ack:
            parts.append(f"ack:{delivery.tag}\n")
        parts.append(f"content-length:{len(body)}\n")
        extra: list[tuple[str, str]] = []
        if spec.include_seq and delivery.sequence is not None:
            extra.append((spec.include_seq, str(delivery.sequence)))
        if config.add_user_header and delivery.sender is not None:
            extra.append((config.add_user_header, delivery.sender))
        if config.add_timestamp_header and delivery.timestamp_ms is not None:
            extra.append((config.add_timestamp_header, str(delivery.timestamp_ms)))
        if config.add_redeliveries_header and delivery.redeliveries:
            extra.append((config.add_redeliveries_header, str(delivery.redeliveries)))
        if delivery.headers:
            ours = _ACK_NAMES if ack else _MESSAGE_NAMES
            if extra:
                ours = ours.union(name for name, _ in extra)
            extra.extend((n, v) for n, v in delivery.headers if n not in ours)
        for name, value in extra:
            parts.append(f"{name.translate(table)}:{value.translate(table)}\n")
        parts.append("\n")
        text = "".join(parts)
        if "\0" in text:
            raise EncodeError("a MESSAGE header contains NUL")
        return b"".join((text.encode("utf-8"), body, b"\0"))

    def _message_frame(self, spec: SubscriptionSpec, delivery: Delivery) -> Frame:
        if delivery.browse_end:
            return make_frame(
                Command.MESSAGE,
                [
                    ("subscription", spec.id),
                    ("destination", ""),
                    ("message-id", ""),
                    ("browser", "end"),
                ],
            )
        return make_frame(Command.MESSAGE, self._message_headers(spec, delivery), delivery.body)

    def _message_headers(
        self, spec: SubscriptionSpec, delivery: Delivery
    ) -> list[tuple[str, str]]:
        headers = [
            ("subscription", spec.id),
            ("message-id", delivery.message_id),
            ("destination", delivery.destination),
        ]
        if self.version is Version.V1_2 and spec.ack is not AckMode.AUTO:
            headers.append(("ack", str(delivery.tag)))
        headers.append(("content-length", str(len(delivery.body))))
        if spec.include_seq and delivery.sequence is not None:
            headers.append((spec.include_seq, str(delivery.sequence)))
        config = self.config
        if config.add_user_header and delivery.sender is not None:
            headers.append((config.add_user_header, delivery.sender))
        if config.add_timestamp_header and delivery.timestamp_ms is not None:
            headers.append((config.add_timestamp_header, str(delivery.timestamp_ms)))
        if config.add_redeliveries_header and delivery.redeliveries:
            headers.append((config.add_redeliveries_header, str(delivery.redeliveries)))
        ours = {name for name, _ in headers}
        headers.extend(
            (name, value)
            for name, value in delivery.headers
            if name not in ours and self._representable(name, value)
        )
        return headers

    def _representable(self, name: str, value: str) -> bool:
        if self.version is not Version.V1_0:
            return True
        return not ("\n" in name or "\n" in value or ":" in name or value.endswith("\r"))

    # -- frames ---------------------------------------------------------------------------

    def _handle(self, frame: Frame, now: float) -> None:
        try:
            if self.state is SessionState.AWAITING_CONNECT:
                if frame.command not in (Command.CONNECT, Command.STOMP):
                    raise ProtocolViolation(f"expected CONNECT, got {frame.command.value}")
                self._on_connect(frame, now)
                return
            handler = _DISPATCH.get(frame.command)
            if handler is None:
                raise ProtocolViolation(f"unexpected {frame.command.value} frame")
            handler(self, frame, now)
        except VersionMismatch as exc:
            ours = ",".join(v.value for v in SUPPORTED_VERSIONS)
            self._fail(str(exc), now, frame.header("receipt"), (("version", ours),))
            return
        except StompError as exc:
            self._fail_after_answers(str(exc), now, frame.header("receipt"))
            return
        if self._deferred:
            self._deferred = False  # its answer sends the receipt
            return
        receipt = frame.header("receipt")
        if receipt is None:
            return
        if self._applied is not None and frame.command not in _APPLIED_ON_RETURN:
            self._after_applied(_Answer(receipt))
        elif self._unanswered:
            self._unanswered.append(_Answer(receipt, done=True))
            self._unanswered_count += 1
        elif self.state is not SessionState.CLOSED:
            self._out += serialize_receipt(receipt, self.version or Version.V1_2)

    def _after_applied(self, entry: _Answer) -> None:
        """``entry``'s RECEIPT goes once the backend applied every frame before it, after
        the receipts before it (:class:`~broker.stomp.backend.AfterApplied`)."""
        assert self._applied is not None
        self._unanswered.append(entry)
        self._unanswered_count += 1
        self._applied.after_applied(self.connection_id, lambda error: self._answered(entry, error))

    def _on_connect(self, frame: Frame, now: float) -> None:
        version = _negotiate(frame.header("accept-version"))
        if version is None:
            offered = frame.header("accept-version") or ""
            raise VersionMismatch(
                f"Supported protocol versions are 1.0,1.1,1.2 (offered: {offered[:80]})"
            )
        self.version = version
        vhost = self._virtual_host(frame.header("host"), version)
        # every check of the frame first: once the authenticator said yes, CONNECTED follows
        client_hb = _parse_heartbeat(frame.header("heart-beat")) if version.rank else (0, 0)
        credentials = Credentials(
            frame.header("login"),
            frame.header("passcode"),
            vhost.name,
            version,
            self.peer,
            self.connection_id,
        )
        user = self.authenticator(credentials)
        if user is None:
            raise ProtocolViolation("authentication failed")
        self._parser.version = version
        self.info = ConnectionInfo(self.connection_id, user, vhost.name, version.value, self.peer)
        sx, sy = self.config.heartbeat if version.rank else (0, 0)
        cx, cy = client_hb
        self._send_interval = max(sx, cy) / 1000 if sx and cy else 0.0
        self._receive_interval = max(cx, sy) / 1000 if cx and sy else 0.0
        headers = [("session", str(self.connection_id)), ("server", SERVER_NAME)]
        if frame.has("accept-version"):  # a 1.0-only client (no header) gets no version
            headers[:0] = [("version", version.value)]
        if version.rank:
            headers.append(("heart-beat", f"{sx},{sy}"))
        self.state = SessionState.CONNECTED
        self._send(make_frame(Command.CONNECTED, headers))
        self.backend.attach(self.info, self.deliver)
        if isinstance(self.backend, RunReceiver):
            self.backend.attach_runs(self.connection_id, self.deliver_run, self.deliver_plain)
        self._attached = True

    def _virtual_host(self, host: str | None, version: Version) -> VirtualHost:
        hosts = self.config.virtual_hosts
        if host is None:
            if version is Version.V1_0 or not self.config.require_host:
                return hosts[0]
            raise ProtocolViolation("CONNECT needs a host header (STOMP 1.1 and later)")
        for vhost in hosts:
            if host in vhost.host_names or host == vhost.name:
                return vhost
        if version is Version.V1_0:
            return hosts[0]
        raise ProtocolViolation(f"unknown virtual host {host[:80]!r}")

    def _on_send(self, frame: Frame, now: float) -> None:
        if self._buffered(frame):
            return
        if self._async is None or self._window_full():
            self._publish(frame)  # waits for the backend
            return
        spec = parse_send(
            frame,
            broker_id=self.config.broker_id,
            connection_id=self.connection_id,
            now_ms=self.wall_clock_ms(),
        )
        entry = _Answer(frame.header("receipt"), len(spec.body))
        self._async.publish_async(
            self.connection_id, spec, lambda error: self._answered(entry, error)
        )
        self._unanswered.append(entry)
        self._unanswered_bytes += entry.size
        self._unanswered_count += 1
        self._deferred = True

    def _answered(self, entry: _Answer, error: Refusal | None) -> None:
        """The backend's answer to an asynchronous SEND: receipts that waited for it go."""
        entry.done = True
        if self.state is SessionState.CLOSED or not self._unanswered:
            return  # the session is over (an ERROR was sent): nothing more to say
        self._unanswered_bytes -= entry.size
        if error is not None:
            receipt = entry.receipt
            if receipt is None and error.store_failed:
                receipt = self._awaited(entry, 0)
            self._fail(error.reason, self._now, receipt)  # (the queue goes with it)
            self.on_delivery()
            return
        self._release_answered()
        if self._parked:
            self._drain(self._now)
        self.on_delivery()

    def _publish_run(self, now: float) -> bool:
        """Hand the run of plain SENDs at the head of ``_parked`` to the backend in one
        call (:class:`~broker.stomp.backend.BatchPublisher`), as far as the window of
        unanswered SENDs has room (:func:`~broker.stomp.subscription.read_send_run`:
        SENDs that parsed alike as one streak; a parser's SendStreak cut by the window
        leaves its unread SENDs parked, as one); one entry in ``_unanswered`` answers
        them all.

        False when the head SEND is not plain (transactional, or it does not parse: the
        usual path handles it, with its ERROR).  A SEND after the run that does not parse
        is left parked: the next turn of ``_drain`` reports it, after the run was handed
        over, as if each SEND had been handled in turn."""
        parked = self._parked
        config = self.config
        conn = self.connection_id
        run = read_send_run(
            parked,
            config.max_unanswered_sends - self._unanswered_count,
            config.max_unanswered_bytes - self._unanswered_bytes,
            broker_id=config.broker_id,
            connection_id=conn,
            now_ms=self.wall_clock_ms(),
        )
        count = run.sends
        if not count:
            return False
        used = run.items
        items = list(parked)  # (the run's items off the deque without a call per item)
        parked.clear()
        if len(items) > used:
            parked.extend(items[used:])
            del items[used:]
        rest = run.rest
        if rest is not None:  # the streak the window cut: its unread SENDs stay parked
            cut = parked[0]
            parked[0] = rest
            assert isinstance(cut, SendStreak)
            items.append(cut.split(len(cut.bodies) - len(rest.bodies))[0])
        size = run.size
        entry = _Answer(None, size, count=count, receipts=run.receipts)
        assert self._batch is not None
        self._unanswered.append(entry)
        self._unanswered_bytes += size
        self._unanswered_count += count
        try:
            self._batch.publish_batch(
                conn, run.streaks, lambda taken, error: self._answered_run(entry, taken, error)
            )
        except BackendError:
            # nothing was handed over: one by one, the usual path says which SEND fails
            self._unanswered.pop()
            self._unanswered_bytes -= size
            self._unanswered_count -= count
            frames = [
                frame
                for item in items
                for frame in (item.frames() if isinstance(item, SendStreak) else (item,))
            ]
            for frame in frames:
                if self.state is not SessionState.CONNECTED:
                    break
                self._handle(frame, now)
        return True

    def _answered_run(self, entry: _Answer, taken: int, error: Refusal | None) -> None:
        """The backend's answer to a run of SENDs (``_publish_run``): the first ``taken``
        were taken; ``error``: why the next one was refused (the rest took no effect)."""
        if error is None:
            self._answered(entry, None)
            return
        entry.done = True
        if self.state is SessionState.CLOSED or not self._unanswered:
            return  # the session is over (an ERROR was sent): nothing more to say
        # the SENDs before the refused one were taken: their receipts, then the ERROR
        receipts = entry.receipts or []
        failed = receipts[taken] if taken < len(receipts) else None
        if failed is None and error.store_failed:
            failed = self._awaited(entry, taken)
        entry.receipts = receipts[:taken]
        self._release_answered(entry)  # (not the done frames after it: they took no effect)
        self._fail(error.reason, self._now, failed)
        self.on_delivery()

    def _awaited(self, entry: _Answer, taken: int) -> str | None:
        """The first receipt the client awaits from ``entry``'s SEND ``taken`` on (none of
        those RECEIPTs will come): the ERROR of a store failure (``STORE_FAILED``) names it
        even when the SEND it concerns asked for none (a client that asks for a receipt
        on the last SEND of a run only)."""
        skip = None
        for later in self._unanswered:
            if skip is None:
                if later is not entry:
                    continue
                skip = taken
            if later.receipts is not None:
                for receipt in later.receipts[skip:]:
                    if receipt is not None:
                        return receipt
            elif later.receipt is not None:
                return later.receipt
            skip = 0
        return None

    def _release_answered(self, last: _Answer | None = None) -> None:
        """The receipts of the answered entries at the head of the queue go out (``last``:
        up to that one only -- a refused run's entry: a frame after it is answered by the
        ERROR that follows, never by a RECEIPT saying everything before it was applied)."""
        queue = self._unanswered
        while queue and queue[0].done:
            head = queue.popleft()
            self._unanswered_count -= head.count
            if head.receipts is not None:
                self._out += serialize_receipts(head.receipts, self.version or Version.V1_2)
            elif head.receipt is not None and head.error is None:
                self._out += serialize_receipt(head.receipt, self.version or Version.V1_2)
            if head.close:
                self.state = SessionState.CLOSED
                queue.clear()
                self._unanswered_count = 0
            elif head.error is not None:
                self._fail(head.error, self._now, head.receipt)  # (clears the queue)
            if head is last:
                return

    def _publish(self, frame: Frame) -> None:
        spec = parse_send(
            frame,
            broker_id=self.config.broker_id,
            connection_id=self.connection_id,
            now_ms=self.wall_clock_ms(),
        )
        self.backend.publish(self.connection_id, spec)

    def _on_subscribe(self, frame: Frame, now: float) -> None:
        assert self.version is not None
        spec = parse_subscribe(
            frame, self.version, broker_id=self.config.broker_id, connection_id=self.connection_id
        )
        if spec.id in self._subscriptions:
            raise ProtocolViolation(f"subscription id {spec.id[:80]!r} is already in use")
        if len(self._subscriptions) >= self.config.max_subscriptions:
            raise ProtocolViolation(
                f"too many subscriptions (max_subscriptions={self.config.max_subscriptions})"
            )
        wildcards = _wildcards(spec)
        if wildcards and self._wildcards + wildcards > self.config.max_wildcard_subscriptions:
            raise ProtocolViolation(
                "too many wildcard subscriptions (max_wildcard_subscriptions="
                f"{self.config.max_wildcard_subscriptions}; held {self._wildcards},"
                f" this one has {wildcards})"
            )
        for destination in spec.destinations:
            owner = temp_owner(destination.name)
            if owner is not None and owner != (self.config.broker_id, self.connection_id):
                raise ProtocolViolation(
                    f"{destination.stomp[:80]!r} is a temporary destination of another connection"
                )
        self._subscriptions[spec.id] = _Subscription(spec)
        try:
            self.backend.subscribe(self.connection_id, spec)
        except BackendError:
            del self._subscriptions[spec.id]
            raise
        self._wildcards += wildcards

    def _on_unsubscribe(self, frame: Frame, now: float) -> None:
        sub_id = frame.header("id")
        if sub_id is None and self.version is Version.V1_0:
            destination = frame.header("destination")
            if destination is not None:
                parse_destinations(
                    destination,
                    broker_id=self.config.broker_id,
                    connection_id=self.connection_id,
                    allow_wildcards=True,
                )
                sub_id = destination
        if sub_id is None:
            raise ProtocolViolation("UNSUBSCRIBE needs an id header")
        destroy = frame.header("persistent") == "true"
        sub = self._subscriptions.pop(sub_id, None)
        if sub is None and not destroy:
            raise ProtocolViolation(f"no subscription with id {sub_id[:80]!r}")
        if sub is not None:
            self._wildcards -= _wildcards(sub.spec)
            for tag in sub.pending:
                self._tag_owner.pop(tag, None)
        self.backend.unsubscribe(self.connection_id, sub_id, destroy=destroy)

    def _on_ack(self, frame: Frame, now: float) -> None:
        if self._buffered(frame):
            return
        self._settle(frame, ack=True)

    def _on_nack(self, frame: Frame, now: float) -> None:
        if self.version is Version.V1_0:
            raise ProtocolViolation("NACK is not part of STOMP 1.0")
        if self._buffered(frame):
            return
        self._settle(frame, ack=False)

    def _settle(self, frame: Frame, *, ack: bool) -> None:
        tags = self._tags_named_by(frame)
        if not tags:
            return
        if ack:
            self.backend.ack(self.connection_id, tags)
        else:
            self.backend.nack(self.connection_id, tags)

    def _tags_named_by(self, frame: Frame, *, settle: bool = True) -> list[int]:
        """The pending deliveries an ACK/NACK names (cumulative in client mode).

        ``settle`` removes them from the pending set; without it they are only listed
        (a transactional ACK returns credit before its COMMIT settles anything).
        """
        sub, tag = self._find_pending(frame)
        if sub is None or tag is None:
            return []
        tags: list[int] = []
        if sub.spec.ack is AckMode.CLIENT:
            for pending_tag in sub.pending:
                tags.append(pending_tag)
                if pending_tag == tag:
                    break
        else:
            tags.append(tag)
        if settle:
            for settled in tags:
                del sub.pending[settled]
                self._tag_owner.pop(settled, None)
        return tags

    def _find_pending(self, frame: Frame) -> tuple[_Subscription | None, int | None]:
        if self.version is Version.V1_2:
            ack_id = frame.header("id")
            if ack_id is None:
                raise ProtocolViolation(f"{frame.command.value} needs an id header (STOMP 1.2)")
            if not ack_id.isdigit() or len(ack_id) > 20:
                return None, None
            tag = int(ack_id)
            sub_id = self._tag_owner.get(tag)
            if sub_id is None:
                return None, None
            return self._subscriptions.get(sub_id), tag
        message_id = frame.header("message-id")
        if message_id is None:
            raise ProtocolViolation(f"{frame.command.value} needs a message-id header")
        if self.version is Version.V1_1:
            sub_id = frame.header("subscription")
            if sub_id is None:
                raise ProtocolViolation(
                    f"{frame.command.value} needs a subscription header (STOMP 1.1)"
                )
            candidates = [self._subscriptions[sub_id]] if sub_id in self._subscriptions else []
        else:
            candidates = list(self._subscriptions.values())
        for sub in candidates:
            for tag, pending in sub.pending.items():
                if pending.message_id == message_id:
                    return sub, tag
        return None, None

    def _on_begin(self, frame: Frame, now: float) -> None:
        tx = _transaction_id(frame)
        if tx in self._transactions:
            raise ProtocolViolation(f"transaction {tx[:80]!r} is already open")
        if len(self._transactions) >= self.config.max_transactions:
            raise ProtocolViolation(
                f"too many open transactions (max_transactions={self.config.max_transactions})"
            )
        self._transactions[tx] = []

    def _on_commit(self, frame: Frame, now: float) -> None:
        for buffered in self._close_transaction(frame):
            if buffered.command is Command.SEND:
                self._publish(buffered)
            else:
                self._settle(buffered, ack=buffered.command is Command.ACK)

    def _on_abort(self, frame: Frame, now: float) -> None:
        self._close_transaction(frame)

    def _close_transaction(self, frame: Frame) -> list[Frame]:
        tx = _transaction_id(frame)
        frames = self._transactions.pop(tx, None)
        if frames is None:
            raise ProtocolViolation(f"no open transaction {tx[:80]!r}")
        self._transaction_bytes -= sum(_frame_size(buffered) for buffered in frames)
        return frames

    def _buffered(self, frame: Frame) -> bool:
        """True when ``frame`` belongs to a transaction (it is kept for COMMIT)."""
        tx = frame.header("transaction")
        if tx is None:
            return False
        frames = self._transactions.get(tx)
        if frames is None:
            raise ProtocolViolation(f"no open transaction {tx[:80]!r}")
        if len(frames) >= self.config.max_transaction_frames:
            raise ProtocolViolation(
                "too many frames in one transaction "
                f"(max_transaction_frames={self.config.max_transaction_frames})"
            )
        size = _frame_size(frame)
        if self._transaction_bytes + size > self.config.max_transaction_bytes:
            raise ProtocolViolation(
                "too many bytes buffered in transactions "
                f"(max_transaction_bytes={self.config.max_transaction_bytes})"
            )
        if frame.command is Command.SEND:
            # check it now: a bad SEND is reported when sent, not at COMMIT
            parse_send(
                frame,
                broker_id=self.config.broker_id,
                connection_id=self.connection_id,
                now_ms=self.wall_clock_ms(),
            )
        if frame.command is Command.ACK:
            # Apollo: a transactional ACK widens the credit window now, consuming nothing
            tags = self._tags_named_by(frame, settle=False)
            if tags:
                self.backend.credit(self.connection_id, tags)
        frames.append(frame)
        self._transaction_bytes += size
        return True

    def _on_disconnect(self, frame: Frame, now: float) -> None:
        receipt = frame.header("receipt")
        applied = receipt is not None and self._applied is not None
        if self._unanswered or applied:  # its receipt (and the close) after the answers
            self.state = SessionState.CLOSING
            self._close_at = now + self.config.connect_timeout  # the backend never answered
            self._deferred = True
            if applied:  # ... and after the frames before it were applied (their ACKs)
                self._after_applied(_Answer(receipt, close=True))
            else:
                self._unanswered.append(_Answer(receipt, done=True, close=True))
                self._unanswered_count += 1
            return
        if receipt is not None:
            self._out += serialize_receipt(receipt, self.version or Version.V1_2)
        self.state = SessionState.CLOSED

    # -- output ---------------------------------------------------------------------------

    def _send(self, frame: Frame) -> None:
        self._out += serialize(frame, self.version or Version.V1_2)

    def _fail_after_answers(self, reason: str, now: float, receipt: str | None = None) -> None:
        """:meth:`_fail`, once every SEND handed to the backend before the bad frame was
        answered: their RECEIPTs leave first (each was taken: the client is told so),
        then the ERROR.  Nothing after the bad frame takes effect meanwhile (input is
        ignored, nothing parked is handled); if one of those SENDs is refused its ERROR
        is the one.  The close comes ``connect_timeout`` later if the backend never
        answers (as for a DISCONNECT that waits)."""
        if not self._unanswered:
            self._fail(reason, now, receipt)
            return
        self._transactions.clear()
        self._transaction_bytes = 0
        self._parked.clear()
        self.state = SessionState.CLOSING
        self._close_at = now + self.config.connect_timeout
        self._unanswered.append(_Answer(receipt, done=True, error=reason))
        self._unanswered_count += 1

    def _fail(
        self,
        reason: str,
        now: float,
        receipt: str | None = None,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Send one ERROR frame, ignore further input, close ``die_delay`` later."""
        version = self.version or Version.V1_2
        summary = " ".join(reason.split())[:200]
        headers = [("message", summary), ("content-type", "text/plain"), *extra]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        body = (reason + "\n").encode("utf-8")
        headers.append(("content-length", str(len(body))))
        self._out += serialize(make_frame(Command.ERROR, headers, body), version)
        self.error = summary
        self._transactions.clear()
        self._transaction_bytes = 0
        self._parked.clear()
        self._unanswered.clear()
        self._unanswered_bytes = 0
        self._unanswered_count = 0
        self.state = SessionState.CLOSING
        self._close_at = now + self.config.die_delay


def _negotiate(header: str | None) -> Version | None:
    if header is None:
        return Version.V1_0
    offered = {item.strip() for item in header.split(",")}
    common = [v for v in SUPPORTED_VERSIONS if v.value in offered]
    return common[-1] if common else None


def _parse_heartbeat(value: str | None) -> tuple[int, int]:
    if value is None:
        return 0, 0
    first, sep, second = value.partition(",")
    try:
        cx, cy = int(first.strip(), 10), int(second.strip(), 10)
    except ValueError:
        raise ProtocolViolation(f"heart-beat must be two integers 'cx,cy', not {value[:40]!r}")
    if not sep or cx < 0 or cy < 0:
        raise ProtocolViolation(
            f"heart-beat must be two non-negative integers, not {value[:40]!r}"
        )
    return cx, cy


def _transaction_id(frame: Frame) -> str:
    tx = frame.header("transaction")
    if not tx:
        raise ProtocolViolation(f"{frame.command.value} needs a transaction header")
    return tx


_DISPATCH: dict[Command, Callable[[Session, Frame, float], None]] = {
    Command.SEND: Session._on_send,
    Command.SUBSCRIBE: Session._on_subscribe,
    Command.UNSUBSCRIBE: Session._on_unsubscribe,
    Command.ACK: Session._on_ack,
    Command.NACK: Session._on_nack,
    Command.BEGIN: Session._on_begin,
    Command.COMMIT: Session._on_commit,
    Command.ABORT: Session._on_abort,
    Command.DISCONNECT: Session._on_disconnect,
}


def _wildcards(spec: SubscriptionSpec) -> int:
    """The wildcard destinations a subscription holds (``max_wildcard_subscriptions``)."""
    return sum(1 for destination in spec.destinations if destination.wildcard)


def _frame_size(frame: Frame) -> int:
    """What a buffered frame holds, as ``max_transaction_bytes`` counts it: its body and
    its header names and values."""
    return len(frame.body) + sum(len(name) + len(value) for name, value in frame.headers)
