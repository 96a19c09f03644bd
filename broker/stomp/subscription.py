"""SUBSCRIBE and SEND headers parsed into typed options (the Apollo extensions).

SUBSCRIBE (:func:`parse_subscribe`):

* ``id`` -- required on 1.1/1.2; on 1.0 it defaults to the destination header;
* ``ack`` -- ``auto`` (default), ``client`` (cumulative), ``client-individual``;
* ``credit:count[,size]`` -- flow-control windows; absent = ``655360,655360``; a
  missing size = ``65536``;
* ``browser:true``, ``browser-end:false`` -- non-destructive browsing;
* ``from-seq:N`` (``-1`` tail, ``0`` head) and ``include-seq:HEADER`` -- queue
  sequences; ``from-seq`` on a wildcard or composite destination is refused;
* ``persistent:true`` -- a durable subscription (needs an explicit ``id``);
* ``exclusive:true``; ``selector:...`` (SQL-92, parsed here: a bad one is an ERROR).

SEND (:func:`parse_send`; a run of them: :func:`read_send_run`): ``persistent:true``,
``retain:set|true|remove``, ``expires`` (ms since the epoch) or ``ttl`` (ms from now;
turned into ``expires``),
``message_group``, ``reply-to`` (a temporary destination is rewritten to its normal
name, ``/queue/temp.<broker>.<connection>.NAME``).  The frame's own control headers
(``destination``, ``receipt``, ``transaction``, ``content-length``) are not carried.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from broker.selector import Selector, SelectorError, parse_selector
from broker.stomp.destinations import Destination, parse_destinations, parse_send_destinations
from broker.stomp.errors import ProtocolViolation, StompError
from broker.stomp.frames import Command, Frame, Headers, SendStreak, Version

#: Default credit windows when SUBSCRIBE has no ``credit`` header (messages, bytes).
DEFAULT_CREDIT_COUNT = 655360
DEFAULT_CREDIT_SIZE = 655360
#: Size window when ``credit`` gives only a count (the typical TCP receive buffer).
DEFAULT_CREDIT_SIZE_ALONE = 65536
#: Longest subscription id accepted (characters).
MAX_SUBSCRIPTION_ID = 256

_CONTROL_HEADERS = frozenset({"destination", "receipt", "transaction", "content-length"})
#: SEND headers not carried to consumers as they came (``expires`` is put back, computed).
_NOT_CARRIED = _CONTROL_HEADERS | {"ttl", "expires"}


class AckMode(Enum):
    AUTO = "auto"
    CLIENT = "client"
    CLIENT_INDIVIDUAL = "client-individual"


class RetainAction(Enum):
    SET = "set"
    REMOVE = "remove"


@dataclass(frozen=True, slots=True)
class Credit:
    """Flow-control windows; a message may go while either is positive."""

    count: int = DEFAULT_CREDIT_COUNT
    size: int = DEFAULT_CREDIT_SIZE


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    id: str
    destinations: tuple[Destination, ...]
    ack: AckMode = AckMode.AUTO
    credit: Credit = Credit()
    browser: bool = False
    browser_end: bool = True
    from_seq: int | None = None
    include_seq: str | None = None
    persistent: bool = False
    exclusive: bool = False
    selector: Selector | None = None  # parsed; .matches(headers), .text

    @property
    def destination_header(self) -> str:
        return ",".join(d.stomp for d in self.destinations)


class PublishSpec(NamedTuple):
    """A parsed SEND.  (A named tuple, not a frozen dataclass: one is made per SEND, as
    a :class:`~broker.stomp.backend.Delivery` per message delivered.)"""

    destinations: tuple[Destination, ...]
    headers: tuple[tuple[str, str], ...]  # user headers carried to consumers (first wins)
    body: bytes
    persistent: bool = False
    retain: RetainAction | None = None
    expires: int | None = None  # ms since the epoch
    message_group: str | None = None


class PublishStreak(NamedTuple):
    """SENDs in a row that parsed alike (:func:`read_send_run`): what each one's
    :class:`PublishSpec` holds but its body -- the same destinations tuple, carried
    headers and rules -- and their bodies, in order.  Fields as a PublishSpec's, with
    ``bodies`` for ``body``: ``PublishSpec(destinations, headers, body, *rules)`` is
    each SEND's spec (:meth:`specs`)."""

    destinations: tuple[Destination, ...]
    headers: tuple[tuple[str, str], ...]
    bodies: list[bytes]
    persistent: bool = False
    retain: RetainAction | None = None
    expires: int | None = None
    message_group: str | None = None

    def specs(self) -> list[PublishSpec]:
        """Each SEND's spec, in order."""
        rules = self[3:]
        return [_new_spec(PublishSpec, (self[0], self[1], body, *rules)) for body in self[2]]


class SendRun(NamedTuple):
    """What :func:`read_send_run` read at the head of the session's parked frames."""

    streaks: list[PublishStreak]  # the run's SENDs, in order
    receipts: list[str | None]  # each SEND's receipt (None: none); [] when none asked
    size: int  # their body bytes
    sends: int  # SENDs
    items: int  # frames and streaks read whole, from the first
    #: The unread SENDs of the streak at ``items``, when the window cut it (else None).
    rest: SendStreak | None


#: ``PublishSpec(...)`` from a tuple of every field, without the named tuple's
#: Python-level ``__new__`` (one per SEND); the usual SEND's last four fields.
_new_spec = tuple.__new__
_NO_RULES = (False, None, None, None)


def _flag(frame: Frame, name: str, default: bool = False) -> bool:
    return _flag_value(name, frame.header(name), default)


def _flag_value(name: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    if value in ("true", "false"):
        return value == "true"
    raise ProtocolViolation(f"header {name} must be true or false, not {value[:40]!r}")


def _integer(frame: Frame, name: str, minimum: int) -> int | None:
    return _integer_value(name, frame.header(name), minimum)


def _integer_value(name: str, value: str | None, minimum: int) -> int | None:
    if value is None:
        return None
    try:
        number = int(value, 10)
    except ValueError:
        raise ProtocolViolation(f"header {name} must be an integer, not {value[:40]!r}")
    if number < minimum or len(value) > 20:
        raise ProtocolViolation(f"header {name} out of range ({value[:40]!r})")
    return number


def parse_credit(value: str | None) -> Credit:
    if value is None:
        return Credit()
    count_text, _, size_text = value.partition(",")
    try:
        count = int(count_text, 10)
        size = int(size_text, 10) if size_text else DEFAULT_CREDIT_SIZE_ALONE
    except ValueError:
        raise ProtocolViolation(f"credit must be count[,size], not {value[:40]!r}")
    if count < 0 or size < 0:
        raise ProtocolViolation(f"credit windows cannot be negative ({value[:40]!r})")
    return Credit(count, size)


def parse_ack_mode(value: str | None) -> AckMode:
    if value is None:
        return AckMode.AUTO
    try:
        return AckMode(value)
    except ValueError:
        raise ProtocolViolation(
            f"ack must be auto, client or client-individual, not {value[:40]!r}"
        )


def parse_subscribe(
    frame: Frame, version: Version, *, broker_id: str, connection_id: int
) -> SubscriptionSpec:
    destination_header = frame.header("destination")
    destinations = parse_destinations(
        destination_header, broker_id=broker_id, connection_id=connection_id, allow_wildcards=True
    )
    sub_id = frame.header("id")
    persistent = _flag(frame, "persistent")
    if sub_id is None:
        if version is not Version.V1_0:
            raise ProtocolViolation("SUBSCRIBE needs an id header (STOMP 1.1 and later)")
        if persistent:
            raise ProtocolViolation("a persistent (durable) subscription needs an id header")
        assert destination_header is not None
        sub_id = destination_header
    if not sub_id or len(sub_id) > MAX_SUBSCRIPTION_ID:
        raise ProtocolViolation(f"subscription id must be 1..{MAX_SUBSCRIPTION_ID} characters")
    from_seq = _integer(frame, "from-seq", -1)
    if from_seq is not None and (len(destinations) > 1 or destinations[0].wildcard):
        raise ProtocolViolation("from-seq cannot be used with a wildcard or composite destination")
    include_seq = frame.header("include-seq")
    if include_seq == "":
        raise ProtocolViolation("include-seq must name a header")
    return SubscriptionSpec(
        id=sub_id,
        destinations=destinations,
        ack=parse_ack_mode(frame.header("ack")),
        credit=parse_credit(frame.header("credit")),
        browser=_flag(frame, "browser"),
        browser_end=_flag(frame, "browser-end", default=True),
        from_seq=from_seq,
        include_seq=include_seq,
        persistent=persistent,
        exclusive=_flag(frame, "exclusive"),
        selector=_selector(frame.header("selector")),
    )


def _selector(text: str | None) -> Selector | None:
    if text is None or not text.strip():
        return None
    try:
        return parse_selector(text)
    except SelectorError as exc:
        raise ProtocolViolation(str(exc)) from None


def parse_send(frame: Frame, *, broker_id: str, connection_id: int, now_ms: int) -> PublishSpec:
    return _parse_send(frame, broker_id, connection_id, now_ms)[0]


def parse_send_control(
    frame: Frame, *, broker_id: str, connection_id: int, now_ms: int
) -> tuple[PublishSpec, str | None, str | None]:
    """:func:`parse_send`, with the frame's ``receipt`` and ``transaction`` headers (None:
    absent) read in the same pass (the session's batched SEND path).  The usual SEND
    (:func:`_parse_send`'s first case, with a destination) is read here, without its call
    nor :func:`parse_destinations`' (the same spec)."""
    headers = frame.headers
    first = dict(headers)
    if len(first) == len(headers) and first.keys() <= _CONTROL_HEADERS:
        destination = first.get("destination")
        if destination:
            destinations = parse_send_destinations(destination, broker_id, connection_id)
            return (
                _new_spec(PublishSpec, (destinations, (), frame.body, *_NO_RULES)),
                first.get("receipt"),
                first.get("transaction"),
            )
    spec, first = _parse_send(frame, broker_id, connection_id, now_ms)
    return spec, first.get("receipt"), first.get("transaction")


def read_send_run(
    items: Iterable[Frame | SendStreak],
    room: int,
    room_bytes: int,
    *,
    broker_id: str,
    connection_id: int,
    now_ms: int,
) -> SendRun:
    """The run of plain SENDs at the head of ``items`` (the session's batched path:
    frames, and the parser's :class:`~broker.stomp.frames.SendStreak` s, each one its
    SENDs in turn): as :func:`parse_send_control` gives each SEND's spec and receipt,
    SENDs in a row whose specs differ in their body only gathered in one
    :class:`PublishStreak`; their receipts (None: none asked; no list at all, ``[]``,
    when none of them asked) and body bytes.  The run ends before the first SEND that is
    not one, carries a ``transaction`` or does not parse (the session's usual path then
    reads it, or reports it), and where the window ends: ``room`` SENDs at most, none
    once the bodies before it hold ``room_bytes`` -- in the middle of a SendStreak when
    so (its unread SENDs: :attr:`SendRun.rest`).

    A header block is read once per run, not once per SEND: a SEND whose headers are
    the very tuple of the SEND before it (the parser gives every frame of a repeated
    head one tuple; a SendStreak is that, read once) takes that one's answer; one whose
    headers are a *receipt lead* plus a last ``receipt`` line (a producer asking a
    receipt per SEND) takes the lead's destinations and reads only its receipt.  A
    receipt lead: the headers before a last ``receipt`` of a SEND that parsed, when they
    are ``destination`` and ``content-length`` only (:func:`_receipt_lead`).  A
    SendStreak with ``receipts`` (its lead's headers asking none, a receipt per SEND
    beside its bodies) is read as its lead's header block once, its receipts taken as
    they are."""
    streaks: list[PublishStreak] = []
    receipts: list[str | None] = []
    add_receipt = receipts.append
    send = Command.SEND
    count = 0  # SENDs taken
    size = 0
    used = 0  # items taken whole
    rest: SendStreak | None = None
    asked = False  # a SEND of the run asked for a receipt (else receipts stays empty)
    last: Headers | None = None  # the header block read last, and its answer:
    destinations: tuple[Destination, ...] = ()
    carried: Headers = ()
    rules: tuple[object, ...] = _NO_RULES
    receipt: str | None = None
    transaction: str | None = None
    lead: Headers | None = None  # the receipt lead seen last, and its destinations
    lead_destinations: tuple[Destination, ...] = ()
    bodies: list[bytes] = []  # the open streak's (the last of streaks), and its answer:
    open_destinations: tuple[Destination, ...] | None = None
    open_carried: Headers = ()
    open_rules: tuple[object, ...] = _NO_RULES
    item: Any  # (a Frame, or a SendStreak: told apart by class, without a call)
    tags: list[str] | None  # a SendStreak's receipts, one per SEND (None: in its headers)
    for item in items:
        single = item.__class__ is Frame
        if single:
            command, headers, body = item
        else:
            command, headers, body, tags = item
        if command is not send or count >= room or size >= room_bytes:
            break
        if headers is not last:
            if (
                lead is not None
                and headers
                and headers[-1][0] == "receipt"
                and headers[:-1] == lead
            ):
                destinations, carried, rules = lead_destinations, (), _NO_RULES
                receipt, transaction = headers[-1][1], None
            else:
                frame = item if item.__class__ is Frame else Frame(command, headers)
                try:
                    spec, receipt, transaction = parse_send_control(
                        frame, broker_id=broker_id, connection_id=connection_id, now_ms=now_ms
                    )
                except StompError:
                    break
                destinations, carried, rules = spec[0], spec[1], spec[3:]
                if rules == _NO_RULES:
                    rules = _NO_RULES  # (the one object: the streak goes on)
                if receipt is not None and _receipt_lead(headers):
                    lead, lead_destinations = headers[:-1], destinations
            last = headers
            if transaction is None and (
                destinations is not open_destinations
                or carried is not open_carried
                or rules is not open_rules
            ):  # (another answer: another streak)
                bodies = []
                streaks.append(_new_spec(PublishStreak, (destinations, carried, bodies, *rules)))
                open_destinations, open_carried, open_rules = destinations, carried, rules
        if transaction is not None:
            break
        if single:
            bodies.append(body)
            if asked:
                add_receipt(receipt)
            elif receipt is not None:  # the first receipt asked: None for the SENDs before
                asked = True
                receipts += [None] * count
                add_receipt(receipt)
            count += 1
            size += len(body)
            used += 1
            continue
        # a SendStreak: SENDs of one head, bodies of one length; the window may cut it
        many = len(body)
        length = len(body[0])
        taken = min(many, room - count)
        if length:  # (SEND i goes while size + i * length < room_bytes)
            taken = min(taken, (room_bytes - size + length - 1) // length)
        if taken < many:
            bodies += body[:taken]
            rest = SendStreak(
                command, headers, body[taken:], None if tags is None else tags[taken:]
            )
        else:
            bodies += body
            used += 1
        if tags is not None:  # a receipt per SEND (the lead asks none: receipt is None)
            if not asked:
                asked = True
                receipts += [None] * count
            receipts += tags if taken == many else tags[:taken]
        elif asked:
            receipts += [receipt] * taken
        elif receipt is not None:
            asked = True
            receipts += [None] * count
            receipts += [receipt] * taken
        count += taken
        size += taken * length
        if rest is not None:
            break
    return SendRun(streaks, receipts, size, count, used, rest)


#: The headers a receipt lead may hold (:func:`read_send_run`).
_LEAD_NAMES = frozenset({"destination", "content-length"})


def _receipt_lead(headers: Headers) -> bool:
    """Are ``headers`` a receipt lead and a last ``receipt`` (:func:`read_send_run`)?
    (Only ``destination`` and ``content-length`` before it, repeats allowed: such a block
    parses as the lead's destinations, nothing carried, no rule and that receipt, for
    every receipt value -- once it parsed at all.)"""
    return headers[-1][0] == "receipt" and all(name in _LEAD_NAMES for name, _ in headers[:-1])


def _parse_send(
    frame: Frame, broker_id: str, connection_id: int, now_ms: int
) -> tuple[PublishSpec, dict[str, str]]:
    first = dict(frame.headers)
    if len(first) == len(frame.headers) and first.keys() <= _CONTROL_HEADERS:
        # the usual SEND: control headers only, none twice (nothing to carry, no rule)
        destinations = parse_destinations(
            first.get("destination"),
            broker_id=broker_id,
            connection_id=connection_id,
            allow_wildcards=False,
        )
        return _new_spec(PublishSpec, (destinations, (), frame.body, *_NO_RULES)), first
    # one pass over the headers (a SEND is parsed per message): the first value of each
    # name, and the user headers in order; then the checks, in the order they always had
    first = {}
    headers: list[tuple[str, str]] = []
    for name, value in frame.headers:
        if name in first:
            continue
        first[name] = value
        if name not in _NOT_CARRIED:
            headers.append((name, value))
    destinations = parse_destinations(
        first.get("destination"),
        broker_id=broker_id,
        connection_id=connection_id,
        allow_wildcards=False,
    )
    retain_text = first.get("retain")
    retain: RetainAction | None = None
    if retain_text is not None:
        if retain_text in ("set", "true"):
            retain = RetainAction.SET
        elif retain_text == "remove":
            retain = RetainAction.REMOVE
        else:
            raise ProtocolViolation(f"retain must be set or remove, not {retain_text[:40]!r}")
    expires = _integer_value("expires", first.get("expires"), 0)
    ttl = _integer_value("ttl", first.get("ttl"), 0)
    if ttl is not None and expires is None:
        expires = now_ms + ttl
    reply_to = first.get("reply-to")
    if reply_to is not None:
        rewritten = _rewrite_reply_to(reply_to, broker_id, connection_id)
        if rewritten != reply_to:
            headers = [(n, rewritten if n == "reply-to" else v) for n, v in headers]
    if expires is not None:
        headers.append(("expires", str(expires)))
    spec = PublishSpec(
        destinations=destinations,
        headers=tuple(headers),
        body=frame.body,
        persistent=_flag_value("persistent", first.get("persistent"), False),
        retain=retain,
        expires=expires,
        message_group=first.get("message_group"),
    )
    return spec, first


def _rewrite_reply_to(value: str, broker_id: str, connection_id: int) -> str:
    if not value.startswith(("/temp-queue/", "/temp-topic/")):
        return value
    destinations = parse_destinations(
        value, broker_id=broker_id, connection_id=connection_id, allow_wildcards=False
    )
    return ",".join(d.stomp for d in destinations)
