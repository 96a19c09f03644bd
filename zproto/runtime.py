"""Support code imported by generated codec modules.

Generated modules inline the hot paths (numbers, strings, chunks) and call these
helpers for the variable-size structures.  Everything here is pure: bytes in,
values out.  Decoders raise ``DecodeError`` or one of ``DECODE_FAILURES`` (which
the generated ``decode()`` turns into ``DecodeError``); encoders raise
``EncodeError`` with the field's name.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Self, cast

from zproto.errors import DecodeError, EncodeError

__all__ = [
    "DECODE_FAILURES",
    "ENCODE_FAILURES",
    "OCTET",
    "PEEK_FAILURES",
    "DecodeError",
    "EncodeError",
    "EncodedHash",
    "Invalid",
    "MessageBase",
    "ascii_regions",
    "dec_hash",
    "dec_hash_lazy",
    "dec_headers",
    "dec_strings",
    "dec_varlen",
    "enc_hash",
    "enc_hash_into",
    "enc_headers",
    "enc_strings",
    "enc_varlen",
    "encode_failure",
    "expose_slots",
    "frame_bytes",
    "frame_of",
    "frame_out",
    "frame_view",
    "frames_out",
    "over_limit",
    "refused",
    "truncated",
    "unknown_fields",
    "utf8_regions",
    "wrong_size",
]


class MessageBase:
    """Base of every generated message class.

    A generated message with fields is a frozen dataclass over a plain slotted "twin"
    class holding its fields (``_NomSlots`` for ``Nom``): a decoder or ``__new__`` makes
    a twin, fills its slots with ordinary attribute stores (the frozen ``__setattr__`` is
    not involved) and then sets ``__class__`` to the frozen class, which adds no slots
    of its own.  This is about twice as fast as giving a frozen object a ``__dict__``.
    """

    __slots__ = ("__weakref__",)
    __match_args__: ClassVar[tuple[str, ...]] = ()  # the field names (dataclass or generated)

    def replace(self, /, **changes: Any) -> Self:
        """A copy with some fields changed (fast; validated when encoded)."""
        names = self.__match_args__
        unknown = changes.keys() - set(names)
        if unknown:
            raise TypeError(f"unknown fields: {sorted(unknown)}")
        values = {name: getattr(self, name) for name in names}
        values.update(changes)
        return type(self)(**values)

    __replace__ = replace  # copy.replace() in Python 3.13+

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and copy by the constructor (the frozen class rejects slot state)."""
        return type(self), tuple(getattr(self, name) for name in self.__match_args__)


class FrozenMessage(MessageBase):
    """The methods ``@dataclass(frozen=True)`` would make, for a model whose classes are
    plain (``classes = "plain"``): written once here, so making the classes costs
    nothing at import (a dataclass is made by compiling its methods: ~0.4 ms each).
    A generated class lists its fields in ``__match_args__`` and derives from its twin
    first (the slots), then from this.  Equality and hash over the fields in order
    (same class only), the dataclass repr, and no assignment or deletion
    (``dataclasses.FrozenInstanceError``)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            names = self.__match_args__
            return [getattr(other, n) for n in names] == [getattr(self, n) for n in names]
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple([getattr(self, name) for name in self.__match_args__]))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__match_args__)
        return f"{type(self).__qualname__}({shown})"

    def __setattr__(self, name: str, value: Any) -> None:
        from dataclasses import FrozenInstanceError  # (imported when raised: start-up)

        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        from dataclasses import FrozenInstanceError

        raise FrozenInstanceError(f"cannot delete field {name!r}")


def unknown_fields(changes: dict[str, Any], names: tuple[str, ...]) -> TypeError:
    """The error of a generated ``replace()`` given names that are not fields."""
    return TypeError(f"unknown fields: {sorted(set(changes) - set(names))}")


def expose_slots(cls: type) -> type:
    """Drop the class-level defaults the dataclass decorator left on a generated message
    class: they would hide the slots of its twin (the defaults stay in its fields)."""
    for name in cls.__match_args__:  # type: ignore[attr-defined]
        if name in vars(cls):
            delattr(cls, name)
    return cls


class Invalid(Exception):
    """Internal: a fast-path check failed; the validator will say which field."""


#: Exceptions a generated decoder may hit on malformed input; ``decode()``
#: converts them into ``DecodeError``.
DECODE_FAILURES = (struct.error, IndexError, ValueError, TypeError, OverflowError)
#: What a generated ``peek_<field>`` turns into None.
PEEK_FAILURES = (DecodeError, *DECODE_FAILURES)
#: Exceptions a generated encoder may hit on a malformed message.
ENCODE_FAILURES = (struct.error, TypeError, ValueError, AttributeError, OverflowError, Invalid)

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_LIMITS = {1: 0xFF, 2: 0xFFFF, 4: 0xFFFFFFFF, 8: 0xFFFFFFFFFFFFFFFF}


def truncated(what: str) -> DecodeError:
    return DecodeError(f"{what}: length runs past the end of the frame")


def over_limit(what: str, count: int, limit: int) -> DecodeError:
    """A strings/hash field with more entries than its model's ``limit=`` (refused
    before any is decoded: tiny entries cost ~30x their octets as Python objects)."""
    return DecodeError(f"{what}: {count} entries, more than {limit}")


def wrong_size(name: str, size: int, expected: int) -> DecodeError:
    """The error of a fixed-size message whose frame has another size."""
    if size < expected:
        return DecodeError(f"{name}: truncated ({size} of {expected} octets)")
    return DecodeError(f"{name}: trailing octets after the last field ({size} > {expected})")


def refused(frames: Any, signature: bytes) -> DecodeError:
    """Why a classic ``decode()`` turned frames away before a message decoder ran: no
    frames, a first frame that is not bytes-like, a wrong signature or an unknown id.

    The generated ``decode()`` dispatches with a few cheap tests; this sorts out, on the
    slow path, which one failed (the signature before the id).
    """
    if not frames:
        return DecodeError("no frames", signature_ok=False)
    try:
        buf = frame_bytes(frames[0])
    except (TypeError, LookupError):
        return DecodeError("not bytes-like", signature_ok=False)
    if len(buf) < 3 or buf[:2] != signature:
        return DecodeError("bad signature", signature_ok=False)
    return DecodeError(f"unknown message id {buf[2]}", message_id=buf[2])


def frame_bytes(frame: Any) -> bytes:
    """A received frame as bytes (accepts bytes, bytearray, memoryview, zmq.Frame)."""
    if type(frame) is bytes:
        return frame
    return memoryview(frame).tobytes()


#: A received frame this long or longer, of a message with a chunk field, is decoded in
#: place (``frame_view``): its chunk is a memoryview of the frame, not a copy.
VIEW_MIN = 64 << 10


def frame_view(frame: Any, ids: frozenset[int]) -> Any:
    """A received frame to decode: a memoryview of it when it is at least ``VIEW_MIN``
    octets and its message id is in ``ids`` (messages with a chunk field: their
    decoders take a view, and the chunk stays in the frame's memory), else bytes."""
    view = memoryview(frame)
    if view.nbytes >= VIEW_MIN:
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        if view[2] in ids:
            return view
    return view.tobytes()


def frame_out(value: Any) -> bytes:
    """A frame field to send: bytes-like only (an int must not become zero bytes)."""
    if type(value) is bytes:
        return value
    try:
        return memoryview(value).tobytes()
    except TypeError:
        raise Invalid from None


def frame_of(buf: bytearray) -> bytes:
    """A frame built in one growing buffer, handed on as it is (not copied: a copy
    would hold a big hash twice).  Typed ``bytes``; it is a ``bytearray``: equal to
    the same octets as ``bytes``, sent and decoded alike, but not hashable."""
    return cast(bytes, buf)


def frames_out(value: Any) -> list[bytes]:
    """A msg field to send: a list of bytes-like frames."""
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        raise Invalid
    return [frame_out(item) for item in value]


# ---------------------------------------------------------------------------
# classic zproto structures


#: One-octet ``bytes`` for each value 0..255 (a look-up instead of building one).
OCTET = tuple(bytes((n,)) for n in range(256))
_OCTET = OCTET


#: A hash value longer than this (an ASCII one) is appended a slice at a time.
_BIG_VALUE = 1 << 16


def enc_hash(value: Mapping[str, str]) -> bytes:
    """hash: number-4 count, then (string key, longstr value) per entry."""
    out = bytearray()
    enc_hash_into(out, value)
    return bytes(out)


def enc_hash_into(out: bytearray, value: Mapping[str, str]) -> None:
    """Append a hash to ``out``: the message's one growing buffer.

    A list of four pieces per entry then joined made a peak of ~8x the result (a
    100,000-file ICANHAZ cache: 56 MiB for 6.7 MiB); a buffer per field then joined
    into the frame still held the field twice.  The entries are read one at a time,
    so a mapping that makes them on demand (a packed index) is never held as a dict.
    """
    if type(value) is EncodedHash:  # (a lazy field decoded from a frame: as it came)
        out += value.octets
        return
    out += _U32.pack(len(value))
    octet = _OCTET
    u32 = _U32.pack
    for key, val in value.items():
        k = key.encode("utf-8")
        try:
            out += octet[len(k)]
        except IndexError:
            raise EncodeError(f"hash key {key[:40]!r}... is longer than 255 octets") from None
        out += k
        if len(val) > _BIG_VALUE and val.isascii():  # (its length in octets is len())
            out += u32(len(val))
            for start in range(0, len(val), _BIG_VALUE):  # not a whole encoded copy
                out += val[start : start + _BIG_VALUE].encode("ascii")
        else:
            v = val.encode("utf-8")
            out += u32(len(v))
            out += v


def dec_hash(
    buf: bytes, pos: int, what: str, limit: int | None = None
) -> tuple[dict[str, str], int]:
    size = len(buf)
    (count,) = _U32.unpack_from(buf, pos)
    pos += 4
    if limit is not None and count > limit:
        raise over_limit(what, count, limit)
    if count * 5 > size - pos:  # every entry takes at least 5 octets
        raise truncated(what)
    out: dict[str, str] = {}
    for _ in range(count):
        end = pos + 1 + buf[pos]
        if end + 4 > size:
            raise truncated(what)
        key = str(buf[pos + 1 : end], "utf-8")  # (str(): buf may be a memoryview)
        (length,) = _U32.unpack_from(buf, end)
        pos = end + 4 + length
        if pos > size:
            raise truncated(what)
        out[key] = str(buf[end + 4 : pos], "utf-8")
    return out, pos


class EncodedHash(Mapping[str, str]):
    """A ``lazy`` hash field (the last of its message) as received: its octets kept, its
    entries decoded when first read.

    ``octets`` (the count and the entries, as on the wire) lets a receiver compare a big
    hash with one it expects at C speed, without a dict of every entry: a FILEMQ server
    answering a mirror whose resync cache says exactly what it has.  The decoder
    (``dec_hash_lazy``) checked the count against the model's ``limit=`` and walked the
    entries (lengths, UTF-8): a malformed field is a ``DecodeError`` from ``decode()``,
    as for any other field, and the entries of one it made always read.  Equal to any
    mapping with the same entries.
    """

    __slots__ = ("_count", "_entries", "_what", "octets")

    def __init__(self, octets: bytes, count: int, what: str) -> None:
        self.octets: bytes = octets
        self._count = count
        self._what = what
        self._entries: dict[str, str] | None = None

    def decoded(self) -> dict[str, str]:
        """The entries (decoded once); ``DecodeError`` when the octets are malformed."""
        if self._entries is None:
            try:
                entries, end = dec_hash(self.octets, 0, self._what)
            except DECODE_FAILURES as exc:
                raise DecodeError(f"{self._what}: malformed ({exc})") from None
            if end != len(self.octets):
                raise DecodeError(f"{self._what}: trailing octets after the last entry")
            self._entries = entries
        return self._entries

    def __getitem__(self, key: str) -> str:
        return self.decoded()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.decoded())

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        """As the dict of its entries (a message's repr reads the same either way); one
        that does not decode says so instead of raising."""
        try:
            return repr(self.decoded())
        except DecodeError:
            return f"<malformed hash field: {self._count} entries, {len(self.octets)} octets>"


def dec_hash_lazy(
    buf: Any, pos: int, what: str, limit: int | None = None
) -> tuple[EncodedHash, int]:
    """A ``lazy`` hash: its count checked (``limit=``, at least 5 octets an entry), the
    rest of the frame kept as its octets (a ``bytes`` copy: comparing a memoryview with
    ``bytes`` goes an item at a time, ~15x slower than the copy and a memcmp), its
    entries walked (``_walk_hash``: malformed is a ``DecodeError`` here, as for every
    field) and decoded when read."""
    size = len(buf)
    (count,) = _U32.unpack_from(buf, pos)
    if limit is not None and count > limit:
        raise over_limit(what, count, limit)
    if count * 5 > size - pos - 4:
        raise truncated(what)
    octets = bytes(buf[pos:])
    _walk_hash(octets, count, what)
    return EncodedHash(octets, count, what), size


#: Octets of a hash checked to be ASCII at a time (a slice copied: ``bytes.isascii``).
_ASCII_SLICE = 1 << 16


def _ascii_past_count(octets: bytes) -> bool:
    """Are the octets of a hash all ASCII after its 4-octet count (C speed, a slice at
    a time: no copy of the whole)?"""
    return all(
        octets[at : at + _ASCII_SLICE].isascii() for at in range(4, len(octets), _ASCII_SLICE)
    )


def _walk_hash(octets: bytes, count: int, what: str) -> None:
    """Check the ``count`` entries of hash ``octets`` (count first) without keeping any:
    each length within the octets, the last entry ending where the octets end, keys and
    values UTF-8.  Octets all ASCII after the count are UTF-8 as they are (lengths
    included): only the lengths are walked; otherwise each key and value is decoded
    (and dropped).  (100,000 FILEMQ cache entries: ~35-45 ms, no dict, no str kept.)"""
    size = len(octets)
    u32 = _U32.unpack_from
    pos = 4
    try:
        if _ascii_past_count(octets):
            for _ in range(count):  # (a length past the end: the next read fails)
                end = pos + 1 + octets[pos]
                pos = end + 4 + u32(octets, end)[0]
        else:
            for _ in range(count):
                end = pos + 1 + octets[pos]
                (length,) = u32(octets, end)  # (struct.error: the key runs past the end)
                start, pos = pos + 1, end + 4 + length
                if pos > size:
                    raise truncated(what)
                str(octets[start:end], "utf-8")
                str(octets[end + 4 : pos], "utf-8")
    except (IndexError, struct.error):
        raise truncated(what) from None
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{what}: malformed ({exc})") from None
    if pos > size:
        raise truncated(what)
    if pos != size:
        raise DecodeError(f"{what}: trailing octets after the last entry")


def enc_strings(value: Sequence[str]) -> bytes:
    """strings: number-4 count, then a longstr per item."""
    if isinstance(value, (str, bytes)):
        raise EncodeError("a strings field takes a list of str, not a single value")
    parts = [_U32.pack(len(value))]
    for item in value:
        data = item.encode("utf-8")
        parts.append(_U32.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def dec_strings(
    buf: bytes, pos: int, what: str, limit: int | None = None
) -> tuple[list[str], int]:
    size = len(buf)
    (count,) = _U32.unpack_from(buf, pos)
    pos += 4
    if limit is not None and count > limit:
        raise over_limit(what, count, limit)
    if count * 4 > size - pos:
        raise truncated(what)
    out: list[str] = []
    for _ in range(count):
        (length,) = _U32.unpack_from(buf, pos)
        end = pos + 4 + length
        if end > size:
            raise truncated(what)
        out.append(buf[pos + 4 : end].decode("utf-8"))
        pos = end
    return out, pos


def _joined(buf: bytes, bounds: Sequence[int]) -> bytes:
    pairs = iter(bounds)
    return b"".join([buf[start:end] for start, end in zip(pairs, pairs, strict=True)])


def ascii_regions(buf: bytes, bounds: Sequence[int]) -> bool:
    """Whether every region ``buf[bounds[2 i] : bounds[2 i + 1]]`` is ASCII (so UTF-8
    too, whatever its boundaries): one join and one ``isascii`` for them all."""
    return _joined(buf, bounds).isascii()


def utf8_regions(buf: bytes, bounds: Sequence[int]) -> bool:
    """Whether every region ``buf[bounds[2 i] : bounds[2 i + 1]]`` is UTF-8, checked for
    them all at once: one join and one ``isascii`` (the common case), else one decode.

    For decoders that keep string fields encoded and decode them when first read (a run
    of frames, a lazy hash): the octets are checked when received, as an eager decode
    would, for the cost of one call for the lot instead of one per field.  Why one decode
    of the joined regions suffices: text that decodes is whole characters, each starting
    at an octet outside 0x80-0xBF; a region that is empty or starts with such an octet
    then starts on a character boundary, so every region is whole characters alone.
    Each region must lie in ``buf`` with its start before its end (callers have checked
    the lengths).
    """
    joined = _joined(buf, bounds)
    if joined.isascii():
        return True
    pairs = iter(bounds)
    if [
        start
        for start, end in zip(pairs, pairs, strict=True)
        if start < end and buf[start] & 0xC0 == 0x80
    ]:
        return False  # a region starting inside a character
    try:
        joined.decode()
    except UnicodeDecodeError:
        return False
    return True


# ---------------------------------------------------------------------------
# binary dialect structures

_VARLEN = {
    "little": (struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")),
    "big": (struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")),
}


def enc_varlen(value: int, byteorder: str) -> bytes:
    """TMQP length: one octet < 253 holds it; 253 -> u16, 254 -> u32, 255 -> u64 follows.

    The writer picks the smallest form.
    """
    u16, u32, u64 = _VARLEN[byteorder]
    if value < 0:
        raise EncodeError(f"length {value} is negative")
    if value < 253:
        return bytes((value,))
    if value <= 0xFFFF:
        return b"\xfd" + u16.pack(value)
    if value <= 0xFFFFFFFF:
        return b"\xfe" + u32.pack(value)
    return b"\xff" + u64.pack(value)


def dec_varlen(buf: bytes, pos: int, byteorder: str) -> tuple[int, int]:
    first = buf[pos]
    if first < 253:
        return first, pos + 1
    u16, u32, u64 = _VARLEN[byteorder]
    if first == 253:
        return u16.unpack_from(buf, pos + 1)[0], pos + 3
    if first == 254:
        return u32.unpack_from(buf, pos + 1)[0], pos + 5
    return u64.unpack_from(buf, pos + 1)[0], pos + 9


def enc_headers(value: Iterable[tuple[str, str]]) -> bytes:
    """A ``key:value\\r\\n`` block; keys and values are UTF-8 without CR/LF."""
    lines: list[str] = []
    for key, val in value:
        if not key or ":" in key or "\r" in key or "\n" in key:
            raise EncodeError(f"header key {key!r} is empty or holds ':', CR or LF")
        if "\r" in val or "\n" in val:
            raise EncodeError(f"header {key!r}: value holds CR or LF")
        lines.append(f"{key}:{val}\r\n")
    return "".join(lines).encode("utf-8")


def dec_headers(buf: bytes, pos: int, end: int, what: str) -> tuple[tuple[str, str], ...]:
    """Parse a header block; accepts optional whitespace around key and value."""
    if end > len(buf):
        raise truncated(what)
    text = buf[pos:end].decode("utf-8")
    out: list[tuple[str, str]] = []
    for line in text.split("\r\n"):
        if not line:
            continue
        key, sep, val = line.partition(":")
        key = key.strip()
        if not sep or not key or "\n" in line or "\r" in line:
            raise DecodeError(f"{what}: malformed header line {line[:60]!r}")
        out.append((key, val.strip()))
    return tuple(out)


# ---------------------------------------------------------------------------
# encode-side validation (slow path, runs only after the fast path failed)


def _check(msg: Any, attr: str, kind: str, limit: int | None, const: Any) -> str | None:
    value = getattr(msg, attr)
    if kind in ("number", "bit"):
        if type(value) is bool and kind == "bit":
            return None
        if not isinstance(value, int) or (isinstance(value, bool) and kind != "bit"):
            return f"must be an int, not {type(value).__name__}"
        top = (1 << (limit or 1)) - 1 if kind == "bit" else _LIMITS.get(limit or 8, _LIMITS[8])
        if not 0 <= value <= top:
            return f"{value} is out of range 0..{top}"
    elif kind in ("string", "longstr"):
        if not isinstance(value, str):
            return f"must be a str, not {type(value).__name__}"
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            return "is not encodable as UTF-8"
        if limit is not None and size > limit:
            return f"is {size} octets long, more than the {limit} its length field holds"
    elif kind in ("octets", "chunk", "frame"):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            return f"must be bytes, not {type(value).__name__}"
        if kind == "octets" and const is not None and len(value) != const:
            return f"must be exactly {const} octets, not {len(value)}"
        if limit is not None and len(value) > limit:
            return f"is {len(value)} octets long, more than the {limit} its length field holds"
    elif kind == "uuid":
        import uuid  # only the validator needs it: keeps start-up of codec users lean

        if not isinstance(value, uuid.UUID):
            return f"must be a uuid.UUID, not {type(value).__name__}"
    elif kind == "strings":
        if isinstance(value, (str, bytes)) or not all(isinstance(v, str) for v in value):
            return "must be a list of str"
        try:
            enc_strings(value)
        except (EncodeError, UnicodeEncodeError) as exc:
            return f"is not encodable: {exc}"
    elif kind == "hash":
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            return "must be a dict of str to str"
        try:
            enc_hash(value)
        except (EncodeError, UnicodeEncodeError) as exc:
            return f"is not encodable: {exc}"
    elif kind == "msg":
        if isinstance(value, (str, bytes)) or not all(
            isinstance(v, (bytes, bytearray, memoryview)) for v in value
        ):
            return "must be a list of bytes frames"
    elif kind == "headers":
        try:
            size = len(enc_headers(value))
        except (EncodeError, TypeError, ValueError, AttributeError) as exc:
            return f"is not a valid header list: {exc}"
        if limit is not None and size > limit:
            return f"block is {size} octets long, more than the {limit} its length field holds"
    if const is not None and kind not in ("octets",) and value != const:
        return f"must be the constant {const!r}"
    return None


def encode_failure(
    msg: Any, spec: Sequence[tuple[str, str, int | None, Any]], exc: BaseException
) -> EncodeError:
    """Find the field that made the fast path fail and describe it."""
    name = type(msg).__name__
    for attr, kind, limit, const in spec:
        try:
            problem = _check(msg, attr, kind, limit, const)
        except AttributeError:
            problem = "is missing"
        except (TypeError, ValueError, OverflowError) as err:  # e.g. not iterable at all
            problem = f"is not a valid {kind}: {err}"
        if problem:
            return EncodeError(f"{name}.{attr} {problem}")
    return EncodeError(f"cannot encode {name}: {exc}")
