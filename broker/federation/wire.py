"""Federation messages: TMQP direct messages between a link and a broker's federation client.

Every broker that federates runs one local client with the id :data:`FEDERATION_CLIENT`.
A link (this broker's client on the remote broker, type :data:`LINK_TYPE`) talks to the
remote's federation client; the remote answers, and forwards to the link, over the same
connection.  Two kinds (the direct message's content type):

* :data:`INTEREST` (request and response): JSON ``{"broker": ID, "interest": {CHANNEL:
  [ID, ...]}}``: the channels the sender wants messages of, each with the path of broker
  ids the interest came through (the sender first).  Full state each time (idempotent).
* :data:`MESSAGE` (request; an empty OK response once the receiver's broker accepted it):
  the payload is the message's; headers ``Fed-Broker`` (sender), ``Fed-Channel``,
  ``Fed-Queue``, ``Fed-Priority`` (1 or absent), ``Fed-Id``, ``Hops`` (comma-separated
  broker ids the message passed, the sender last), ``Depth`` (hops it may still take
  after this one; -1 unlimited), and the message's own headers.

* :data:`BATCH` (request; content type 250): several MESSAGEs to the same peer in one
  request, sent when more than one is ready at once (within the sender's window).  The
  payload is, per message, a 4-octet little-endian length and the message's header block
  (``key:value`` lines, CRLF-ended, the MESSAGE headers), then a 4-octet length and its
  payload; at most :data:`MAX_BATCH` messages.  The answer (once every message was taken
  or refused) has one octet per message: :data:`BATCH_OK`, :data:`BATCH_RETRY` (refused
  for now: send it again later) or :data:`BATCH_REFUSED` (for good).  A peer that does
  not know BATCH refuses it (400, or 401 "not a federation message" from a zerohub
  before BATCH): the sender then sends that peer single MESSAGEs.

* :data:`STATS` (request, any client of the broker): the answer is the federation's
  counters, its peers (up, in flight, waiting, channels of interest) and joined channels
  as JSON.

The same ``Hops``, ``Depth`` and ``Fed-Id`` headers are on the message as pushed into the
receiving broker's queue, so its subscribers see them and its federation client forwards
it further.  A publisher may set ``Depth`` itself (0: this broker only).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from broker.engine.federated import FED_ID_HEADER, MAX_ID
from broker.engine.federated import FEDERATION_CLIENT as FEDERATION_CLIENT  # its pushes
from broker.federation.errors import BadPeerMessage
from broker.federation.settings import BROKER_ID

#: The client type of a link's connection to a remote broker.
LINK_TYPE = "zerohub-link"

INTEREST = 1
MESSAGE = 2
#: Request (empty payload): the federation's counters, peers and joined channels as JSON.
STATS = 3
#: Request: several MESSAGEs in one (see the module docstring).
BATCH = 250
BATCH_OK, BATCH_RETRY, BATCH_REFUSED = 0, 1, 2
#: Messages in one BATCH at most.
MAX_BATCH = 1_000

HOPS = "Hops"
DEPTH = "Depth"
FED_ID = FED_ID_HEADER
FED_BROKER = "Fed-Broker"
FED_CHANNEL = "Fed-Channel"
FED_QUEUE = "Fed-Queue"
FED_PRIORITY = "Fed-Priority"

#: Headers of a forwarded message that are the federation's, not the publisher's.
_OURS = frozenset(h.lower() for h in (HOPS, DEPTH, FED_ID, FED_BROKER, FED_CHANNEL, FED_QUEUE,
                                      FED_PRIORITY))  # fmt: skip

#: Limits on what a peer may send (a larger value is refused).
MAX_HOPS = 32
MAX_DEPTH = 1000
MAX_FED_ID = MAX_ID
MAX_INTEREST_CHANNELS = 10_000
MAX_INTEREST_SIZE = 4 * 1024 * 1024
MAX_CHANNEL = 255

_CHANNEL = re.compile(r"^[^\x00-\x1f\x7f]{1,255}$")

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message as it travels between brokers."""

    channel: str
    queue_id: int
    fed_id: str
    hops: tuple[str, ...]
    depth: int
    headers: Headers
    payload: bytes
    high_priority: bool = False


def _header(headers: Headers, name: str) -> str | None:
    lname = name.lower()
    for key, value in headers:
        if key.lower() == lname:
            return value
    return None


def own_headers(headers: Headers) -> Headers:
    """``headers`` without the federation's own."""
    return tuple((k, v) for k, v in headers if k.lower() not in _OURS)


def parse_hops(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    hops = tuple(text.split(","))
    if len(hops) > MAX_HOPS:
        raise BadPeerMessage(f"{len(hops)} hops, more than {MAX_HOPS}")
    for hop in hops:
        if not BROKER_ID.match(hop):
            raise BadPeerMessage(f"bad broker id {hop[:70]!r} in Hops")
    return hops


def parse_depth(text: str | None, default: int) -> int:
    if text is None:
        return default
    try:
        depth = int(text)
    except ValueError:
        raise BadPeerMessage(f"Depth is not a number: {text[:40]!r}") from None
    if not -1 <= depth <= MAX_DEPTH:
        raise BadPeerMessage(f"Depth {depth} outside -1..{MAX_DEPTH}")
    return depth


def check_fed_id(value: str) -> str:
    if not value or len(value) > MAX_FED_ID or any(ord(c) < 32 for c in value):
        raise BadPeerMessage(f"bad Fed-Id {value[:70]!r}")
    return value


def check_channel(value: str | None) -> str:
    if value is None or not _CHANNEL.match(value):
        raise BadPeerMessage(f"bad channel name {str(value)[:70]!r}")
    return value


def message_headers(env: Envelope, sender: str) -> Headers:
    """The headers of the direct message carrying ``env`` from ``sender``."""
    ours: list[tuple[str, str]] = [
        (FED_BROKER, sender),
        (FED_CHANNEL, env.channel),
        (FED_QUEUE, str(env.queue_id)),
        (FED_ID, env.fed_id),
        (HOPS, ",".join(env.hops)),
        (DEPTH, str(env.depth)),
    ]
    if env.high_priority:
        ours.append((FED_PRIORITY, "1"))
    return (*ours, *env.headers)


def parse_message(headers: Headers, payload: bytes) -> tuple[str, Envelope]:
    """(sender id, envelope) of a MESSAGE direct message (``BadPeerMessage`` if bad)."""
    sender = _header(headers, FED_BROKER) or ""
    if not BROKER_ID.match(sender):
        raise BadPeerMessage(f"bad Fed-Broker {sender[:70]!r}")
    channel = check_channel(_header(headers, FED_CHANNEL))
    queue_text = _header(headers, FED_QUEUE) or ""
    if not queue_text.isdigit() or not 0 <= int(queue_text) <= 65535:
        raise BadPeerMessage(f"bad Fed-Queue {queue_text[:20]!r}")
    fed_id = check_fed_id(_header(headers, FED_ID) or "")
    hops = parse_hops(_header(headers, HOPS))
    if not hops or hops[-1] != sender:
        raise BadPeerMessage("Hops must end with the sender's id")
    depth = parse_depth(_header(headers, DEPTH) or "", 0)
    env = Envelope(
        channel,
        int(queue_text),
        fed_id,
        hops,
        depth,
        own_headers(headers),
        bytes(payload),
        _header(headers, FED_PRIORITY) == "1",
    )
    return sender, env


def local_headers(env: Envelope) -> Headers:
    """The headers of ``env`` as pushed into this broker's queue."""
    return (*env.headers, (HOPS, ",".join(env.hops)), (DEPTH, str(env.depth)),
            (FED_ID, env.fed_id))  # fmt: skip


Interest = dict[str, tuple[str, ...]]


def encode_interest(broker: str, interest: Interest) -> bytes:
    body = {"broker": broker, "interest": {c: list(p) for c, p in sorted(interest.items())}}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_interest(payload: bytes) -> tuple[str, Interest]:
    """(sender id, interest) of an INTEREST payload (``BadPeerMessage`` if bad)."""
    if len(payload) > MAX_INTEREST_SIZE:
        raise BadPeerMessage(f"interest of {len(payload)} octets over {MAX_INTEREST_SIZE}")
    try:
        body: Any = json.loads(bytes(payload))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadPeerMessage(f"interest is not JSON: {type(exc).__name__}") from None
    if not isinstance(body, dict):
        raise BadPeerMessage("interest is not a JSON object")
    broker = body.get("broker")
    table = body.get("interest")
    if not isinstance(broker, str) or not BROKER_ID.match(broker):
        raise BadPeerMessage(f"bad broker id in interest: {str(broker)[:70]!r}")
    if not isinstance(table, dict) or len(table) > MAX_INTEREST_CHANNELS:
        raise BadPeerMessage("interest table missing or over the limit")
    interest: Interest = {}
    for channel, path in table.items():
        check_channel(channel)
        if not isinstance(path, list) or not path or len(path) > MAX_HOPS:
            raise BadPeerMessage(f"bad interest path for {channel[:70]!r}")
        if not all(isinstance(p, str) and BROKER_ID.match(p) for p in path):
            raise BadPeerMessage(f"bad broker id in the path for {channel[:70]!r}")
        if path[0] != broker:
            raise BadPeerMessage("an interest path must start with the sender's id")
        interest[channel] = tuple(path)
    return broker, interest


def _header_block(headers: Headers) -> bytes:
    return "".join(f"{k}:{v}\r\n" for k, v in headers).encode()


def encode_batch(items: list[tuple[Headers, bytes]]) -> bytes:
    """A BATCH payload of (MESSAGE headers, payload) items."""
    parts: list[bytes] = []
    for headers, payload in items:
        block = _header_block(headers)
        parts += [len(block).to_bytes(4, "little"), block,
                  len(payload).to_bytes(4, "little"), payload]  # fmt: skip
    return b"".join(parts)


def decode_batch(data: bytes) -> list[tuple[Headers, bytes]]:
    """The items of a BATCH payload (``BadPeerMessage`` if malformed or over a limit)."""
    view = memoryview(data)
    items: list[tuple[Headers, bytes]] = []
    at = 0

    def take() -> bytes:
        nonlocal at
        if at + 4 > len(view):
            raise BadPeerMessage("batch cut short")
        size = int.from_bytes(view[at : at + 4], "little")
        at += 4
        if at + size > len(view):
            raise BadPeerMessage("batch item cut short")
        chunk = bytes(view[at : at + size])
        at += size
        return chunk

    while at < len(view):
        if len(items) >= MAX_BATCH:
            raise BadPeerMessage(f"batch of more than {MAX_BATCH} messages")
        try:
            text = take().decode()
        except UnicodeDecodeError:
            raise BadPeerMessage("batch headers are not UTF-8") from None
        headers: list[tuple[str, str]] = []
        for line in text.split("\r\n"):
            if not line:
                continue
            key, colon, value = line.partition(":")
            if not colon:
                raise BadPeerMessage(f"bad batch header line {line[:40]!r}")
            headers.append((key.strip(), value.strip()))
        items.append((tuple(headers), take()))
    if not items:
        raise BadPeerMessage("empty batch")
    return items
