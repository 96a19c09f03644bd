"""STOMP destination headers parsed into typed destinations (Apollo rules).

* Prefixes: ``/queue/NAME``, ``/topic/NAME``, ``/dsub/ID`` (a durable subscription),
  ``/temp-queue/NAME`` and ``/temp-topic/NAME``.  A temporary destination is the normal
  queue/topic ``temp.<broker_id>.<connection_id>.NAME``; only that connection may
  subscribe to it (:func:`temp_owner` tells who owns a name).
* Composite destinations: several destinations separated by ``,`` (SEND and SUBSCRIBE).
* Names are made of ``a-z A-Z 0-9 _ - % ~ : space ( ) .`` (the manual's "Destination
  Name Restrictions"); ``.`` separates path segments.  Anything else is refused: other
  characters must be UTF-8 then URL-encoded (``%xx``) by the client.  (The manual's own
  retained-message example, ``/topic/stock/IBM``, breaks that rule; the rule wins.)
* A destination is named within a virtual host (``namespace``, set by the backend that
  maps it: ``broker.stomp.vhosts``); parsing gives the default one's.
* Wildcards, in SUBSCRIBE only: a segment ``*`` matches any one segment, ``**`` any
  number of segments (zero included), ``*`` inside a segment matches any characters
  (``I*``), ``{regex}`` inside a segment matches a regular expression (``*{[0-9]}``).
  Parsed and matched by the engine's ``broker.engine.patterns`` (shared with TMQP
  pattern joins: the same bounds on a ``{regex}``, at most 255 octets in all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache

from broker.engine.errors import PatternError
from broker.engine.patterns import ChannelPattern, is_pattern
from broker.engine.patterns import parse as parse_pattern
from broker.stomp.errors import DestinationError

PATH_SEPARATOR = "."
DESTINATION_SEPARATOR = ","
ANY_CHILD = "*"
ANY_DESCENDANT = "**"
TEMP_PREFIX = "temp."

#: Longest destination header accepted (characters), composite included.
MAX_DESTINATION_LENGTH = 4096
#: Most destinations in one composite destination.
MAX_COMPOSITE = 64
_NAME_CHARS = re.compile(r"[A-Za-z0-9_\-%~: ().]+")


class DestinationKind(Enum):
    QUEUE = "queue"
    TOPIC = "topic"
    DSUB = "dsub"  # a durable subscription addressed by its id


_PREFIXES: dict[str, tuple[DestinationKind, bool]] = {
    "/queue/": (DestinationKind.QUEUE, False),
    "/topic/": (DestinationKind.TOPIC, False),
    "/dsub/": (DestinationKind.DSUB, False),
    "/temp-queue/": (DestinationKind.QUEUE, True),
    "/temp-topic/": (DestinationKind.TOPIC, True),
}
_STOMP_PREFIX = {
    DestinationKind.QUEUE: "/queue/",
    DestinationKind.TOPIC: "/topic/",
    DestinationKind.DSUB: "/dsub/",
}


@dataclass(frozen=True, slots=True)
class Destination:
    """One destination: ``kind`` and the broker-side ``name`` (temporary names expanded)."""

    kind: DestinationKind
    name: str
    pattern: ChannelPattern | None = field(default=None, compare=False)
    #: The namespace of the virtual host it is named in (``broker.stomp.vhosts``; ``""``:
    #: the default one's).  Not part of ``stomp``: a client sees names of its own host.
    namespace: str = ""
    #: The destination as a STOMP header value (``/queue/NAME``); made once (a
    #: destination is parsed once and cached, and read per message delivered).
    stomp: str = field(init=False, compare=False, repr=False)
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stomp", _STOMP_PREFIX[self.kind] + self.name)
        object.__setattr__(self, "_hash", hash((self.kind, self.name, self.namespace)))

    def __hash__(self) -> int:  # (a run of SENDs looks its destination up per message)
        return self._hash

    @property
    def wildcard(self) -> bool:
        return self.pattern is not None

    def matches(self, kind: DestinationKind, name: str, namespace: str = "") -> bool:
        if kind is not self.kind or namespace != self.namespace:
            return False
        if self.pattern is None:
            return name == self.name
        return self.pattern.matches(name)


def temp_name(broker_id: str, connection_id: int, name: str) -> str:
    return f"{TEMP_PREFIX}{broker_id}.{connection_id}.{name}"


def temp_owner(name: str) -> tuple[str, int] | None:
    """``(broker_id, connection_id)`` of a temporary destination name, else None."""
    if not name.startswith(TEMP_PREFIX):
        return None
    parts = name.split(PATH_SEPARATOR, 3)
    if len(parts) < 4 or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def parse_destinations(
    header: str | None,
    *,
    broker_id: str,
    connection_id: int,
    allow_wildcards: bool,
) -> tuple[Destination, ...]:
    """Parse a ``destination`` header (composite allowed) or raise ``DestinationError``.

    Answers are cached (``DESTINATION_CACHE`` entries; a client sends to the same few
    destinations over and over, and each parse checks and may compile patterns)."""
    if header is None or header == "":
        raise DestinationError("missing destination header")
    return _parse_cached(header, broker_id, connection_id, allow_wildcards)


def parse_send_destinations(
    header: str, broker_id: str, connection_id: int
) -> tuple[Destination, ...]:
    """:func:`parse_destinations` of a SEND's ``destination`` header (no wildcards) that
    the caller found present and not empty: the cached parse itself, without that
    function's checks and keywords (a SEND is parsed per message)."""
    return _parse_cached(header, broker_id, connection_id, False)


#: Parsed destination headers kept (least recently used go first).
DESTINATION_CACHE = 1024


@lru_cache(maxsize=DESTINATION_CACHE)
def _parse_cached(
    header: str, broker_id: str, connection_id: int, allow_wildcards: bool
) -> tuple[Destination, ...]:
    if len(header) > MAX_DESTINATION_LENGTH:
        raise DestinationError(f"destination longer than {MAX_DESTINATION_LENGTH} characters")
    parts = header.split(DESTINATION_SEPARATOR)
    if len(parts) > MAX_COMPOSITE:
        raise DestinationError(f"more than {MAX_COMPOSITE} destinations in a composite")
    return tuple(_parse_one(part, broker_id, connection_id, allow_wildcards) for part in parts)


def _split_prefix(text: str) -> tuple[DestinationKind, bool, str]:
    for prefix, (kind, temporary) in _PREFIXES.items():
        if text.startswith(prefix):
            return kind, temporary, text[len(prefix) :]
    raise DestinationError(
        f"destination {text[:80]!r} must start with /queue/, /topic/, /dsub/, "
        "/temp-queue/ or /temp-topic/"
    )


def _parse_one(
    text: str, broker_id: str, connection_id: int, allow_wildcards: bool
) -> Destination:
    kind, temporary, name = _split_prefix(text)
    if not name:
        raise DestinationError(f"destination {text[:80]!r} has an empty name")
    pattern: ChannelPattern | None = None
    if is_pattern(name):
        if not allow_wildcards:
            raise DestinationError(
                f"destination {text[:80]!r}: wildcards may only be used in SUBSCRIBE"
            )
        if kind is DestinationKind.DSUB:
            raise DestinationError(f"destination {text[:80]!r}: /dsub/ ids take no wildcards")
        pattern = compile_pattern(name)
    else:
        _check_name(name, text)
    if temporary:
        name = temp_name(broker_id, connection_id, name)
        if pattern is not None:
            pattern = compile_pattern(name)
    return Destination(kind, name, pattern)


def _check_name(name: str, text: str) -> None:
    if not _NAME_CHARS.fullmatch(name):
        raise DestinationError(
            f"destination {text[:80]!r}: names use a-z A-Z 0-9 _ - % ~ : space ( ) . only "
            "(URL-encode other characters)"
        )
    if "" in name.split(PATH_SEPARATOR):
        raise DestinationError(f"destination {text[:80]!r} has an empty path segment")


# -- wildcards ---------------------------------------------------------------------------

#: One character a literal part of a STOMP wildcard may hold (the name rules; ``.`` is
#: the separator).
_LITERAL = re.compile(r"[A-Za-z0-9_\-%~: ()]")


def compile_pattern(text: str) -> ChannelPattern:
    """The engine's pattern (``broker.engine.patterns``: parsing, matching and the
    bounds on a ``{regex}`` are shared with TMQP pattern joins) under STOMP's name
    rules, or DestinationError."""
    try:
        return parse_pattern(text, _LITERAL)
    except PatternError as exc:
        raise DestinationError(f"destination {exc.reason}") from None
