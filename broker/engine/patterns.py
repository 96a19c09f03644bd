"""Channel-name patterns (Apollo's wildcard rules) and the pattern joins of clients.

A pattern names channels by their ``.``-separated segments:

* ``*`` as a whole segment matches any one segment; ``*`` inside a segment any
  characters of it (``ord*``);
* ``**`` as a whole segment matches any number of segments, none included;
* ``{regex}`` inside a segment matches a regular expression over that segment's
  characters (``item{[0-9]+}``); braces nest, so ``{[0-9]{2}}`` is one regex;
* any other character stands for itself.

Both doors share it: a TMQP ``JOIN`` with header ``Pattern: yes`` (``broker.engine.
operations``) and a STOMP wildcard ``SUBSCRIBE`` (``broker.stomp.destinations``, which
adds STOMP's own name rules on top).

A ``{regex}`` is hostile input and Python's ``re`` has no timeout, so only forms whose
matching cost is bounded are compiled: at most :data:`MAX_REGEX_LENGTH` characters, at
most :data:`MAX_REPEATS` repetition operators (``* + ? {m,n}``) and :data:`MAX_ALTERNATIVES`
``|`` in one regex, no repeated group (``(a+)+``, the catastrophic form), no
back-reference and no ``(?...)`` construct other than ``(?:``.  A name segment is at most
255 octets (a channel name's bound), so one regex costs at most about 255 ** MAX_REPEATS
steps times the alternatives' paths, and a pattern is matched with a table of
(pattern segment, name segment) pairs, each regex tried at most once per pair, so
``**`` never makes the cost exponential.  Anything else: :class:`PatternError`.

:class:`PatternJoins` keeps each client's pattern joins (sans-IO: names and ids only; the
channel registry joins and leaves, ``broker.engine.channels``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Generic, TypeVar

from broker.engine.errors import PatternError

SEPARATOR = "."
ANY_SEGMENT = "*"
ANY_SEGMENTS = "**"
#: Longest pattern accepted (octets, as a channel name).
MAX_PATTERN_LENGTH = 255
#: Longest ``{regex}`` accepted (characters).
MAX_REGEX_LENGTH = 64
#: Repetition operators (``*``, ``+``, ``?``, ``{m,n}``) one ``{regex}`` may hold.
MAX_REPEATS = 2
#: ``|`` one ``{regex}`` may hold.
MAX_ALTERNATIVES = 4
#: Compiled patterns kept (clients join the same few over and over).
PATTERN_CACHE = 1024

K = TypeVar("K")

_REPEAT = frozenset("*+?")
_BOUNDED_REPEAT = re.compile(r"\{\d*(,\d*)?\}")


def is_pattern(text: str) -> bool:
    """Does ``text`` use pattern syntax (``*``, ``{``)?  (A channel name may, literally.)"""
    return ANY_SEGMENT in text or "{" in text


@dataclass(frozen=True, slots=True)
class ChannelPattern:
    """A parsed pattern: one compiled regex per segment, ``None`` standing for ``**``;
    ``head``: the first segment when it is literal (a matching name starts with it and
    a separator, or is it), else None."""

    text: str
    segments: tuple[re.Pattern[str] | None, ...]
    head: str | None = None

    def matches(self, name: str) -> bool:
        return _matches(self.segments, name.split(SEPARATOR))


def _matches(segments: tuple[re.Pattern[str] | None, ...], names: list[str]) -> bool:
    """Table match: ``reach[j]``: the segments so far can cover the first ``j`` names."""
    reach = [True] + [False] * len(names)
    for segment in segments:
        nxt = [False] * (len(names) + 1)
        if segment is None:  # '**': from the first reachable point on, everything
            seen = False
            for j, ok in enumerate(reach):
                seen = seen or ok
                nxt[j] = seen
        else:
            for j in range(len(names)):
                if reach[j] and segment.fullmatch(names[j]) is not None:
                    nxt[j + 1] = True
        reach = nxt
        if not any(reach):
            return False
    return reach[-1]


@lru_cache(maxsize=PATTERN_CACHE)
def parse(text: str, literal: re.Pattern[str] | None = None) -> ChannelPattern:
    """Parse a pattern or raise :class:`PatternError`.  ``literal``: the characters a
    literal part may hold (a door's name rules; None: any but ``*``/``{``/``}``/``.``)."""
    if not text:
        raise PatternError("an empty pattern")
    if len(text.encode()) > MAX_PATTERN_LENGTH:
        raise PatternError(f"a pattern longer than {MAX_PATTERN_LENGTH} octets")
    compiled: list[re.Pattern[str] | None] = []
    segments = _split(text)
    for segment in segments:
        if segment == ANY_SEGMENTS:
            if not compiled or compiled[-1] is not None:  # '**.**' is '**'
                compiled.append(None)
        else:
            compiled.append(_segment(segment, text, literal))
    first = segments[0]
    head = None if ANY_SEGMENT in first or "{" in first else first
    return ChannelPattern(text, tuple(compiled), head)


def _split(text: str) -> list[str]:
    """The segments: split at ``.`` outside braces (a regex may hold dots)."""
    segments: list[str] = []
    start = depth = 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise PatternError(f"pattern {text[:80]!r}: unbalanced '}}'")
        elif ch == SEPARATOR and depth == 0:
            segments.append(text[start:i])
            start = i + 1
    if depth:
        raise PatternError(f"pattern {text[:80]!r}: unbalanced '{{'")
    segments.append(text[start:])
    return segments


def _segment(segment: str, text: str, literal: re.Pattern[str] | None) -> re.Pattern[str]:
    if not segment:
        raise PatternError(f"pattern {text[:80]!r} has an empty segment")
    out: list[str] = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "{":
            end = _closing(segment, i, text)
            out.append(f"(?:{_checked_regex(segment[i + 1 : end], text)})")
            i = end + 1
            continue
        if ch == ANY_SEGMENT:
            out.append(".*")
        elif ch == "}" or (literal is not None and not literal.fullmatch(ch)):
            raise PatternError(f"pattern {text[:80]!r}: character {ch!r} is not allowed")
        else:
            out.append(re.escape(ch))
        i += 1
    try:
        return re.compile("".join(out), re.DOTALL)
    except re.error as exc:
        raise PatternError(f"pattern {text[:80]!r}: bad regex ({exc})") from None


def _closing(segment: str, start: int, text: str) -> int:
    depth = 0
    for j in range(start, len(segment)):
        if segment[j] == "{":
            depth += 1
        elif segment[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise PatternError(f"pattern {text[:80]!r}: unbalanced '{{'")


def _checked_regex(regex: str, text: str) -> str:
    """``regex`` if its matching cost is bounded (module docstring), else PatternError."""
    where = f"pattern {text[:80]!r}: {{regex}}"
    if not regex:
        raise PatternError(f"{where} is empty")
    if len(regex) > MAX_REGEX_LENGTH:
        raise PatternError(f"{where} longer than {MAX_REGEX_LENGTH} characters")
    repeats = alternatives = 0
    after_group = False  # the last atom was a ')' (a repeat of it is refused)
    i = 0
    while i < len(regex):
        ch = regex[i]
        bounded = _BOUNDED_REPEAT.match(regex, i) if ch == "{" else None
        if ch in _REPEAT or bounded is not None:
            if after_group:
                raise PatternError(f"{where}: a repeated group is not accepted")
            repeats += 1
            i = bounded.end() if bounded is not None else i + 1
            continue
        after_group = False
        if ch == "\\":
            if i + 1 < len(regex) and regex[i + 1] in "0123456789gkP":
                raise PatternError(f"{where}: back-references are not accepted")
            i += 2
            continue
        if ch == "[":
            i = _class_end(regex, i, where)
            continue
        if ch == "(":
            if regex.startswith("(?:", i):
                i += 3  # (its '?' is no repetition)
                continue
            if regex.startswith("(?", i):
                raise PatternError(f"{where}: only (?: groups are accepted")
        elif ch == ")":
            after_group = True
        elif ch == "|":
            alternatives += 1
        i += 1
    if repeats > MAX_REPEATS:
        raise PatternError(f"{where} holds more than {MAX_REPEATS} repetition operators")
    if alternatives > MAX_ALTERNATIVES:
        raise PatternError(f"{where} holds more than {MAX_ALTERNATIVES} '|'")
    return regex


def _class_end(regex: str, start: int, where: str) -> int:
    """Index after the character class opening at ``start``."""
    i = start + 1
    if i < len(regex) and regex[i] == "^":
        i += 1
    if i < len(regex) and regex[i] == "]":
        i += 1  # a leading ']' is literal
    while i < len(regex):
        if regex[i] == "\\":
            i += 2
            continue
        if regex[i] == "]":
            return i + 1
        i += 1
    raise PatternError(f"{where}: unbalanced '['")


# -- the pattern joins of clients --------------------------------------------------------


@dataclass(slots=True)
class PatternJoin:
    """One client's pattern join: the window it asked for and the channels it joined
    (those the client was not a consumer of already)."""

    pattern: ChannelPattern
    prefetch: int | None
    channels: set[str] = field(default_factory=set)


class PatternIndex(Generic[K]):
    """Patterns held by keys (clients, subscriptions), to find the keys one of whose
    patterns matches a name without trying every key's every pattern: each distinct
    pattern text is tried once, and only the patterns whose literal first segment is the
    name's first segment (or whose first segment is not literal).  Keys come back in the
    order they first held a pattern.  A thousand clients with sixteen patterns each cost
    a channel's creation ~9-15 ms tried one by one (session 18)."""

    def __init__(self) -> None:
        self._keys_of: dict[str, dict[K, None]] = {}  # pattern text -> its holders
        #: First literal segment (None: not literal) -> pattern text -> the pattern.
        self._by_head: dict[str | None, dict[str, ChannelPattern]] = {}
        self._held: dict[K, int] = {}  # key -> patterns it holds
        self._rank: dict[K, int] = {}  # key -> the order of its first pattern
        self._ranks = 0

    def __len__(self) -> int:
        """Distinct pattern texts held."""
        return len(self._keys_of)

    def __contains__(self, text: object) -> bool:
        return text in self._keys_of

    def add(self, key: K, pattern: ChannelPattern) -> None:
        """``key`` holds ``pattern`` (again: no change)."""
        keys = self._keys_of.get(pattern.text)
        if keys is None:
            keys = self._keys_of[pattern.text] = {}
            self._by_head.setdefault(pattern.head, {})[pattern.text] = pattern
        elif key in keys:
            return
        keys[key] = None
        held = self._held.get(key)
        if held is None:
            self._ranks += 1
            self._rank[key] = self._ranks
        self._held[key] = (held or 0) + 1

    def discard(self, key: K, pattern: ChannelPattern) -> None:
        """``key`` no longer holds ``pattern`` (not held: no change)."""
        keys = self._keys_of.get(pattern.text)
        if keys is None or key not in keys:
            return
        del keys[key]
        if not keys:
            del self._keys_of[pattern.text]
            patterns = self._by_head[pattern.head]
            del patterns[pattern.text]
            if not patterns:
                del self._by_head[pattern.head]
        held = self._held[key] - 1
        if held:
            self._held[key] = held
        else:
            del self._held[key], self._rank[key]

    def matched(self, name: str) -> set[str]:
        """The texts of the patterns held that match ``name``."""
        names = name.split(SEPARATOR)
        matched: set[str] = set()
        for head in (names[0], None):
            for text, pattern in self._by_head.get(head, {}).items():
                if _matches(pattern.segments, names):
                    matched.add(text)
        return matched

    def holders(self, texts: set[str]) -> list[K]:
        """The keys holding one of ``texts`` (from :meth:`matched`), in order."""
        keys: set[K] = set()
        for text in texts:
            keys.update(self._keys_of[text])
        return sorted(keys, key=self._rank.__getitem__)


class PatternJoins:
    """Every client's pattern joins, by client id then pattern text (in join order), and
    their :class:`PatternIndex` (what a new channel matches)."""

    def __init__(self) -> None:
        #: Client id -> pattern text -> its join; empty: nobody joined a pattern (the
        #: channel registry reads it per channel created: an attribute, not a call).
        self.by_client: dict[str, dict[str, PatternJoin]] = {}
        self._index: PatternIndex[str] = PatternIndex()
        #: The counts of the patterns other doors hold (STOMP wildcards): one broker-wide
        #: budget, ``Limits.max_patterns``, for every door (:meth:`held`).
        self._elsewhere: list[Callable[[], int]] = []

    def count_elsewhere(self, held: Callable[[], int]) -> None:
        """Count the patterns ``held()`` says another door holds in :meth:`held`."""
        self._elsewhere.append(held)

    def held(self) -> int:
        """Distinct patterns the broker holds: joined here, and held by other doors
        (a text each door holds counts once per door)."""
        return len(self._index) + sum(count() for count in self._elsewhere)

    def of(self, client_id: str) -> dict[str, PatternJoin]:
        """The client's pattern joins (empty if none; do not change it)."""
        return self.by_client.get(client_id, {})

    def joined(self, text: str) -> bool:
        """Has some client joined pattern ``text``?"""
        return text in self._index

    def __len__(self) -> int:
        """Distinct pattern texts joined."""
        return len(self._index)

    def add(self, client_id: str, join: PatternJoin) -> None:
        self.by_client.setdefault(client_id, {})[join.pattern.text] = join
        self._index.add(client_id, join.pattern)

    def remove(self, client_id: str, text: str) -> PatternJoin | None:
        joins = self.by_client.get(client_id)
        if joins is None:
            return None
        join = joins.pop(text, None)
        if join is not None:
            self._index.discard(client_id, join.pattern)
        if not joins:
            del self.by_client[client_id]
        return join

    def forget_client(self, client_id: str) -> None:
        for join in self.by_client.pop(client_id, {}).values():
            self._index.discard(client_id, join.pattern)

    def release(self, client_id: str, channel: str) -> None:
        """The client no longer holds ``channel`` through a pattern (it joined or left it
        by name, or the channel went)."""
        for join in self.by_client.get(client_id, {}).values():
            join.channels.discard(channel)

    def holder(self, client_id: str, channel: str) -> PatternJoin | None:
        """The client's pattern join other than those holding ``channel`` that matches
        it (to hand it over when its holder is left), or None."""
        for join in self.by_client.get(client_id, {}).values():
            if channel not in join.channels and join.pattern.matches(channel):
                return join
        return None

    def matching(self, channel: str) -> Iterator[tuple[str, PatternJoin]]:
        """(client id, its first pattern join) for each client one of whose patterns
        matches ``channel``, clients in the order of their first pattern join."""
        matched = self._index.matched(channel)
        if not matched:
            return
        for client_id in self._index.holders(matched):
            joins = self.by_client.get(client_id)
            if joins is None:  # (left while an earlier one was joined)
                continue
            for join in joins.values():
                if join.pattern.text in matched:
                    yield client_id, join
                    break
