"""Sans-IO STOMP frame codec: an incremental parser and a serializer.

Rules enforced by :class:`FrameParser` (the only exception it raises is
:class:`~broker.stomp.errors.FrameError`):

* bytes may arrive split anywhere; several frames may arrive in one chunk; heart-beat
  EOLs (``\\n`` or ``\\r\\n``) between frames are skipped (``heartbeats`` counts them);
* an EOL is ``\\n``; ``\\r\\n`` is accepted before the version is known (CONNECT) and
  on 1.2; on 1.0/1.1 a ``\\r`` belongs to the line;
* the command must be one of the parser's ``commands``; a command line longer than
  :data:`MAX_COMMAND_LENGTH` is refused before its end is seen;
* a header line is ``name:value`` split at the first ``:``; a line without ``:``,
  a NUL byte or invalid UTF-8 is refused; on 1.1 ``\\n \\c \\\\`` and on 1.2 also
  ``\\r`` are unescaped, any other ``\\x`` is refused; 1.0 and the CONNECT/CONNECTED
  frames are never unescaped;
* repeated headers are all kept, in order; :meth:`Frame.header` returns the first
  (the one that counts, per STOMP 1.2);
* ``content-length`` (a decimal integer) gives the body size and the body may
  contain NULs; the byte after the body must be NUL; without it the body ends at the
  first NUL;
* limits (:class:`Limits`, the Apollo manual's defaults): a header line longer than
  ``max_header_length`` bytes, more than ``max_headers`` headers, or a body larger
  than ``max_body`` bytes is refused with ``LimitExceeded`` as soon as it is seen --
  a ``content-length`` above the limit is refused on its own, before any body byte,
  and an unterminated line or body is refused once the limit is crossed; the parser
  never holds more than one limit's worth of an unfinished line or body.

:meth:`FrameParser.feed_streaks_until_error` (the session's reading, with a backend that
takes runs of SENDs) gives SENDs whose heads are byte for byte the head before them as
one :class:`SendStreak` (one headers tuple, a body each) instead of a frame each, and
SENDs alike but the value of their last header, ``receipt`` (stomp.py sorts headers: a
receipt per SEND comes after ``content-length`` and ``destination``), as one with their
receipts beside their bodies; its frames are what :meth:`FrameParser.feed_until_error`
gives.

:func:`serialize` writes a frame for a version: it escapes header names and values
(1.1/1.2, except CONNECT/CONNECTED) and raises ``EncodeError`` for what the version
cannot represent (an EOL in a 1.0 header, a ``:`` in a 1.0 header name...).  It never
adds headers: builders put ``content-length`` on frames that need it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import NamedTuple

from broker.stomp.errors import EncodeError, FrameError, LimitExceeded


class Version(Enum):
    """Protocol versions, ordered by :attr:`rank` (``1.0 < 1.1 < 1.2``)."""

    V1_0 = "1.0"
    V1_1 = "1.1"
    V1_2 = "1.2"

    @property
    def rank(self) -> int:
        return _VERSION_RANK[self]


_VERSION_RANK = {Version.V1_0: 0, Version.V1_1: 1, Version.V1_2: 2}


class Command(StrEnum):
    # client frames
    CONNECT = "CONNECT"
    STOMP = "STOMP"
    SEND = "SEND"
    SUBSCRIBE = "SUBSCRIBE"
    UNSUBSCRIBE = "UNSUBSCRIBE"
    ACK = "ACK"
    NACK = "NACK"
    BEGIN = "BEGIN"
    COMMIT = "COMMIT"
    ABORT = "ABORT"
    DISCONNECT = "DISCONNECT"
    # server frames
    CONNECTED = "CONNECTED"
    MESSAGE = "MESSAGE"
    RECEIPT = "RECEIPT"
    ERROR = "ERROR"


CLIENT_COMMANDS: frozenset[Command] = frozenset(
    {
        Command.CONNECT,
        Command.STOMP,
        Command.SEND,
        Command.SUBSCRIBE,
        Command.UNSUBSCRIBE,
        Command.ACK,
        Command.NACK,
        Command.BEGIN,
        Command.COMMIT,
        Command.ABORT,
        Command.DISCONNECT,
    }
)
SERVER_COMMANDS: frozenset[Command] = frozenset(
    {Command.CONNECTED, Command.MESSAGE, Command.RECEIPT, Command.ERROR}
)
ALL_COMMANDS: frozenset[Command] = CLIENT_COMMANDS | SERVER_COMMANDS

#: Frames whose headers are never escaped (STOMP 1.1 and 1.2 say so).
_UNESCAPED_COMMANDS = frozenset({Command.CONNECT, Command.STOMP, Command.CONNECTED})

#: Longest command line accepted (bytes, before its EOL); the longest command is 11.
MAX_COMMAND_LENGTH = 32
#: The parser's fast path reads a frame's command and headers in one go when their end
#: (an empty line) is within this many bytes; anything else goes line by line.
FAST_HEAD = 4096

KIB = 1024
MIB = 1024 * KIB

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-frame limits; defaults are the Apollo manual's."""

    #: Longest header line, ``name:value`` escaped as on the wire, in bytes (10k).
    max_header_length: int = 10 * KIB
    #: Most headers in one frame (1000).
    max_headers: int = 1000
    #: Largest body in bytes (100M); ``max_data_length`` in the manual.
    max_body: int = 100 * MIB


class Frame(NamedTuple):
    """One STOMP frame.  (A named tuple, not a frozen dataclass: the parser makes one per
    frame read, and a frozen dataclass's ``__init__`` costs about twice as much.)"""

    command: Command
    headers: Headers = ()
    body: bytes = b""

    def header(self, name: str, default: str | None = None) -> str | None:
        """The first value of header ``name`` (repeated headers: the first wins)."""
        for key, value in self.headers:
            if key == name:
                return value
        return default

    def has(self, name: str) -> bool:
        return any(key == name for key, _ in self.headers)


def make_frame(
    command: Command, headers: Iterable[tuple[str, str]] = (), body: bytes = b""
) -> Frame:
    return Frame(command, tuple(headers), body)


class SendStreak(NamedTuple):
    """SENDs in a row whose heads are byte for byte alike, as
    :meth:`FrameParser.feed_streaks_until_error` reads them: the frames
    ``Frame(command, headers, body)`` for each of ``bodies``, in order, held as one item
    (one headers tuple, a body per SEND, every body the head's ``content-length`` long).
    Same first two fields as a :class:`Frame`: ``command`` (always SEND), ``headers``.

    ``receipts`` (None: none): SENDs whose heads are alike but the value of their last
    line, a ``receipt`` header (a producer asking a receipt per SEND; ``headers`` has no
    other ``receipt``): SEND i is ``Frame(command, (*headers, ("receipt", receipts[i])),
    bodies[i])``."""

    command: Command
    headers: Headers
    bodies: list[bytes]
    receipts: list[str] | None = None

    def header(self, name: str, default: str | None = None) -> str | None:
        """The first value of header ``name`` (as :meth:`Frame.header`) of its first SEND."""
        for key, value in self.headers:
            if key == name:
                return value
        if name == "receipt" and self.receipts is not None:
            return self.receipts[0]
        return default

    def frames(self) -> list[Frame]:
        """The SENDs it stands for, one frame each."""
        command = self.command
        headers = self.headers
        if self.receipts is None:
            return [Frame(command, headers, body) for body in self.bodies]
        return [
            Frame(command, (*headers, ("receipt", receipt)), body)
            for receipt, body in zip(self.receipts, self.bodies, strict=True)
        ]

    def split(self, taken: int) -> tuple[SendStreak, SendStreak]:
        """Its first ``taken`` SENDs and the others, as two streaks (0 < taken < len)."""
        command, headers, bodies, receipts = self
        if receipts is None:
            return (
                SendStreak(command, headers, bodies[:taken]),
                SendStreak(command, headers, bodies[taken:]),
            )
        return (
            SendStreak(command, headers, bodies[:taken], receipts[:taken]),
            SendStreak(command, headers, bodies[taken:], receipts[taken:]),
        )


# -- escaping ----------------------------------------------------------------------------

_ESCAPES_1_1 = {ord("n"): "\n", ord("c"): ":", ord("\\"): "\\"}
_ESCAPES_1_2 = {**_ESCAPES_1_1, ord("r"): "\r"}
_ENCODE_1_1 = str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c"})
_ENCODE_1_2 = str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c", "\r": "\\r"})


def escape_table(version: Version) -> dict[int, str]:
    """The ``str.translate`` table escaping header names and values on 1.1 or 1.2."""
    return _ENCODE_1_2 if version is Version.V1_2 else _ENCODE_1_1


def _escapes_for(version: Version | None, command: Command) -> dict[int, str] | None:
    if version is None or version is Version.V1_0 or command in _UNESCAPED_COMMANDS:
        return None
    return _ESCAPES_1_2 if version is Version.V1_2 else _ESCAPES_1_1


def _unescape(raw: str, table: dict[int, str]) -> str:
    if "\\" not in raw:
        return raw
    out: list[str] = []
    i = 0
    n = len(raw)
    while i < n:
        ch = raw[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= n:
            raise FrameError("header ends with an incomplete escape sequence")
        nxt = table.get(ord(raw[i + 1]))
        if nxt is None:
            raise FrameError(f"undefined escape sequence \\{raw[i + 1]} in header")
        out.append(nxt)
        i += 2
    return "".join(out)


# -- parser ------------------------------------------------------------------------------


class _State(Enum):
    IDLE = "idle"  # between frames: skipping heart-beat EOLs
    HEADERS = "headers"  # command read; reading header lines
    BODY = "body"  # headers read; reading the body


class FrameParser:
    """Incremental STOMP parser: ``feed(chunk)`` returns the frames completed by it.

    ``version`` selects EOL and escaping rules; ``None`` (before CONNECT is seen) accepts
    CRLF and does not unescape.  The session sets it once the version is negotiated.
    After a ``FrameError`` the parser is unusable (the connection must end).
    """

    def __init__(
        self,
        limits: Limits | None = None,
        commands: frozenset[Command] = CLIENT_COMMANDS,
        version: Version | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.commands = commands
        self.version = version
        self.heartbeats = 0
        self._buf = bytearray()
        self._pos = 0
        self._state = _State.IDLE
        self._command: Command | None = None
        self._headers: list[tuple[str, str]] = []
        self._body_length: int | None = None
        self._scan_from = 0  # where the search for the body's NUL resumes
        self._broken: FrameError | None = None
        self._lead = ""  # the last fast head's text but its last line
        self._prefix: _HeadPrefix | None = None  # a repeated lead, as bytes and as read
        self._same: _SameHead | None = None  # a repeated whole head (under _prefix)

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._buf) - self._pos

    @property
    def idle(self) -> bool:
        """True when no part of a frame is pending (between frames)."""
        return self._state is _State.IDLE and self.buffered == 0

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes; raises the :class:`FrameError` of the first
        bad one (the good frames before it in ``data`` are then lost: a session uses
        :meth:`feed_until_error`)."""
        frames, error = self.feed_until_error(data)
        if error is not None:
            raise error
        return frames

    def feed_until_error(self, data: bytes) -> tuple[list[Frame], FrameError | None]:
        """The frames ``data`` completes up to the first one that does not parse, and
        that one's error (None: all good).  After an error the parser is broken: every
        later call returns no frame and the same error."""
        return self._feed(data, False)  # type: ignore[return-value]  # (no streak in it)

    def feed_streaks_until_error(
        self, data: bytes
    ) -> tuple[list[Frame | SendStreak], FrameError | None]:
        """:meth:`feed_until_error`, where SENDs in a row whose heads are byte for byte
        the head before them (:class:`_SameHead`) come as one :class:`SendStreak` each
        time a read brings them (a producer sending the same headers every time: no
        Frame per SEND).  Its frames are the ones :meth:`feed_until_error` gives."""
        return self._feed(data, True)

    def _feed(
        self, data: bytes, streaks: bool
    ) -> tuple[list[Frame | SendStreak], FrameError | None]:
        if self._broken is not None:
            return [], self._broken
        if data:
            self._buf += data
        frames: list[Frame | SendStreak] = []
        try:
            while True:
                if self._prefix is not None and self._state is _State.IDLE:
                    self._read_repeats(frames, streaks)
                frame = self._step()
                if frame is None:
                    break
                frames.append(frame)
        except FrameError as exc:
            self._broken = exc
            self._buf.clear()
            self._pos = 0
            return frames, exc
        if self._pos:
            del self._buf[: self._pos]
            self._scan_from -= self._pos
            self._pos = 0
        return frames, None

    def _step(self) -> Frame | None:
        """Advance by at most one frame; return it when complete, else None."""
        while True:
            if self._state is _State.IDLE:
                pos = self._pos
                if pos >= len(self._buf):
                    return None
                if self._buf[pos] in _EOL_BYTES and not self._skip_eols():
                    return None
                head = self._fast_head()
                if head is not None:
                    return self._read_body() if head is _HEAD_ONLY else head
                line = self._line(MAX_COMMAND_LENGTH, "command")
                if line is None:
                    return None
                self._start_frame(line)
            elif self._state is _State.HEADERS:
                line = self._line(self.limits.max_header_length, "max_header_length")
                if line is None:
                    return None
                if line:
                    self._add_header(line)
                else:
                    self._start_body()
            else:
                return self._read_body()

    def _fast_head(self) -> Frame | None:
        """Read a whole command + header block at once when it is plainly well formed:
        ends within :data:`FAST_HEAD` bytes, LF line ends only, no NUL, valid UTF-8,
        within the limits, every header line with a ``:``.  None (nothing consumed):
        the line-by-line path reads it and reports what is wrong.  The whole frame when
        its ``content-length`` body and NUL are in the buffer already (the usual frame of
        a run: no state kept between head and body), else :data:`_HEAD_ONLY` (state BODY:
        ``_read_body`` goes on)."""
        buf = self._buf
        pos = self._pos
        prefix = self._prefix
        read = None
        if (
            prefix is not None
            and prefix.version is self.version
            and buf.startswith(prefix.raw, pos)
        ):
            read = self._repeat_head(prefix)
        if read is not None:
            command, headers, length, start = read
        else:  # (inline, not a method: the usual head of a connection's first frames)
            end = buf.find(b"\n\n", pos, pos + FAST_HEAD)
            if end < 0:
                return None
            try:
                text = buf[pos:end].decode("utf-8")
            except UnicodeDecodeError:
                return None
            if "\r" in text or "\0" in text:
                return None
            lines = text.split("\n")
            found = _COMMANDS.get(lines[0])
            limits = self.limits
            if found is None or found not in self.commands or len(lines) > limits.max_headers + 1:
                return None
            command = found
            table = _escapes_for(self.version, command) if "\\" in text else None
            read_lines: list[tuple[str, str]] = []
            append = read_lines.append
            limit = limits.max_header_length
            short = limit // 4  # (a line this long cannot pass the limit in UTF-8)
            length = None  # the first content-length (read here, not in a 2nd pass)
            length_at = 0  # its index in the headers
            for line in itertools.islice(lines, 1, None):
                name, sep, value = line.partition(":")
                if not sep or (len(line) > short and len(line.encode("utf-8")) > limit):
                    return None
                if table is not None:
                    name = _unescape(name, table)
                    value = _unescape(value, table)
                if length is None and name == "content-length":
                    length = value
                    length_at = len(read_lines)
                append((name, value))
            if len(read_lines) > 1:  # (a head of one header line has nothing to repeat)
                lead = text.rpartition("\n")[0]  # the command and the header lines but the last
                if lead == self._lead:  # two heads in a row start so: the next ones may too
                    last = len(read_lines) - 1
                    lead_length = length if length_at < last else None
                    self._same = None
                    self._prefix = _HeadPrefix(
                        f"{lead}\n".encode(),
                        self.version,
                        command,
                        tuple(read_lines[:last]),
                        lead_length,
                        _size_of(lead_length),
                    )
                self._lead = lead
            headers = read_lines
            start = end + 2
        if length is not None and length.isdigit() and length.isascii() and len(length) <= 20:
            stop = start + int(length)  # (the body's end: its NUL is there, if it came)
            if stop < len(buf) and buf[stop] == 0 and stop - start <= self.limits.max_body:
                self._pos = stop + 1
                return Frame(command, tuple(headers), bytes(buf[start:stop]))
        self._command = command
        self._headers = headers
        self._pos = start
        self._begin_body(length)
        return _HEAD_ONLY

    def _read_repeats(self, frames: list[Frame | SendStreak], streaks: bool = False) -> None:
        """Append to ``frames`` the whole frames at the buffer's position whose heads
        repeat the kept lead (:meth:`_repeat_head`'s case) and whose ``content-length``
        body and NUL are buffered, in one loop: what :meth:`_step`, :meth:`_fast_head`
        and :meth:`_repeat_head` give for each, without their three calls per frame (a
        run of pipelined SENDs or ACKs is read here).  Stops, consuming nothing of it,
        at the first frame that is anything else -- an escape, CR, NUL or bad UTF-8 in
        its last line, an over-long line, no or a bad ``content-length``, a body not all
        here, a heart-beat -- which the usual path then reads, or refuses, as before.

        A head that is byte for byte the head read just before it (a producer sending
        the same headers every time) is that head again: the frame gets the same
        headers tuple and body length, with one comparison (:class:`_SameHead`).  Such
        frames in a row are one stride apart (head, body, NUL): found by one
        ``startswith`` and one NUL test each, then their bodies cut from one copy of
        the stretch; ``streaks`` (SENDs): the stretch is one :class:`SendStreak`."""
        prefix = self._prefix
        # (a lead whose content-length the parser refuses: its frames go the usual way)
        if prefix is None or prefix.version is not self.version or prefix.size < -1:
            return
        buf = self._buf
        pos = self._pos
        raw = prefix.raw
        if not buf.startswith(raw, pos):  # (no frame of the lead here)
            return
        skip = len(raw)
        command = prefix.command
        lead = prefix.headers
        lead_size = prefix.size  # (-1: none in the lead)
        limit = self.limits.max_header_length
        max_body = self.limits.max_body
        n = len(buf)
        find = buf.find
        startswith = buf.startswith
        new_frame = _new_tuple
        append = frames.append
        same = self._same
        streak = streaks and command is Command.SEND
        # SENDs of the lead plus a last line ``receipt:VALUE`` (a receipt per SEND): one
        # streak, their receipts beside their bodies -- when the lead gives the body's
        # length and asks no receipt itself (a repeated receipt: the first one counts)
        tagged = (
            raw + b"receipt:"
            if streak and 0 <= lead_size <= max_body and all(name != "receipt" for name, _ in lead)
            else None
        )
        last_line = ""  # the last line of the frame read just before (here)
        while True:
            if same is not None:
                head = same.head
                if startswith(head, pos):
                    stride = same.skip + same.size + 1  # (head, body, NUL)
                    first = pos
                    end = pos + stride
                    while end <= n and buf[end - 1] == 0:
                        pos = end
                        if not startswith(head, pos):
                            break
                        end = pos + stride
                    if pos > first:
                        stretch = bytes(buf[first:pos])
                        body_size = same.size
                        bodies = [
                            stretch[at : at + body_size]
                            for at in range(same.skip, pos - first, stride)
                        ]
                        if streak:
                            append(new_frame(SendStreak, (command, same.headers, bodies, None)))
                        else:
                            kept = same.headers
                            frames += [new_frame(Frame, (command, kept, b)) for b in bodies]
                    if startswith(head, pos):  # not all here, or no NUL where it says
                        break
                if n - pos < len(head):  # (the next head is not all here: kept for it)
                    break
                same = None
            if not startswith(raw, pos):
                break
            if tagged is not None and startswith(tagged, pos):
                before = pos
                pos, repeated = self._read_receipts(frames, pos, tagged, lead, lead_size)
                if repeated is None:
                    if pos == before:  # not all here, or what the usual path reads
                        break
                    last_line = ""
                    continue
                last_line = repeated  # (read below: the head alike after it, by comparison)
            at = pos + skip
            end = find(b"\n", at, pos + FAST_HEAD)
            if end < 0 or end + 1 >= n or buf[end + 1] != 0x0A:  # (the empty line after it)
                break
            try:
                line = buf[at:end].decode("utf-8")
            except UnicodeDecodeError:
                break
            if "\r" in line or "\0" in line or "\\" in line:
                break
            name, sep, value = line.partition(":")
            # (the line's UTF-8 is its bytes: end - at is what the limit counts)
            if not sep or end - at > limit:
                break
            size = lead_size
            if size < 0:
                if name != "content-length" or not _is_length(value):
                    break
                size = int(value)
            start = end + 2
            stop = start + size
            if stop >= n or buf[stop] != 0 or size > max_body:
                break
            headers = (*lead, (name, value))
            append(new_frame(Frame, (command, headers, bytes(buf[start:stop]))))
            if line == last_line:  # two heads alike in a row: the next ones may be too
                same = _SameHead(bytes(buf[pos:start]), start - pos, headers, size)
            last_line = line
            pos = stop + 1
        self._same = same
        self._pos = pos

    def _read_receipts(
        self,
        frames: list[Frame | SendStreak],
        pos: int,
        tagged: bytes,
        lead: Headers,
        size: int,
    ) -> tuple[int, str | None]:
        """:meth:`_read_repeats`' SENDs at ``pos`` whose heads are the lead (asking no
        receipt, its content-length ``size``) plus a last line ``receipt:VALUE``
        (``tagged``: the lead and ``receipt:``), whole in the buffer: one
        :class:`SendStreak` with their receipts, appended to ``frames``.  Where the first
        SEND not in it starts, and that SEND's last line when the first SEND's head comes
        again whole right after it (a producer repeating one head, which the usual loop
        reads by comparison, :class:`_SameHead`: only the first SEND is taken here).  A
        value with an escape, CR, NUL or bad UTF-8, or a line over the limit, stops it
        (the usual path reads that SEND, or refuses it).

        No call per SEND: SENDs of one length, the first one's (values of one length),
        are cut at their strides and checked whole (:func:`_same_stride`); else the
        buffer from ``pos`` is split at ``tagged``; a piece is a
        SEND of the streak when it is ``VALUE``, the empty line, ``size`` bytes and the
        NUL -- read from its length alone, the value the bytes before (a body holding
        ``tagged`` cuts its piece short, which then fails, and the streak ends there).
        The values are decoded and checked in one go."""
        buf = self._buf
        n = len(buf)
        value_at = len(tagged)
        # a value's bytes: its line (``receipt:`` + value) within the limit, and its EOL
        # within FAST_HEAD of its SEND (as the other readers of a head)
        most = min(self.limits.max_header_length - 8, FAST_HEAD - 1 - value_at)
        end = buf.find(b"\n", pos + value_at, pos + FAST_HEAD)
        stop = end + 2 + size
        if (
            end < 0
            or end - pos - value_at > most
            or stop >= n
            or buf[end + 1] != 0x0A
            or buf[stop] != 0
        ):  # (the first one is not all here, or is not one)
            return pos, None
        # its head again right after it: that one only, the comparison reads the next
        repeat = buf.startswith(bytes(buf[pos : end + 1]), stop + 1)
        data = bytes(buf[pos:])
        if not repeat:
            stride = stop + 1 - pos  # (the first SEND's length)
            strided = _same_stride(data, tagged, stride, end - pos - value_at)
            if strided is not None:
                receipts, bodies = strided
                frames.append(_new_tuple(SendStreak, (Command.SEND, lead, bodies, receipts)))
                return pos + len(bodies) * stride, None
        pieces = data.split(tagged)  # (pieces[0]: the b"" before the first)
        extra = size + 3  # a piece's length less its value's
        last = len(pieces) - 1
        count = 0
        for piece in itertools.islice(pieces, 1, None):
            length = len(piece) - extra
            if length < 0 or length > most or piece[-1] != 0:
                break
            if piece[length] != 0x0A or piece[length + 1] != 0x0A:
                break
            count += 1
        if count == last - 1 and not repeat:  # the last piece: a SEND and what follows it
            piece = pieces[last]
            length = piece.find(b"\n", 0, most + 1)
            if (
                length >= 0
                and length + extra <= len(piece)
                and piece[length + 1] == 0x0A
                and piece[length + extra - 1] == 0
            ):
                pieces[last] = piece[: length + extra]
                count += 1
        if repeat:
            count = min(count, 1)
        if not count:
            return pos, None
        taken = pieces[1 : count + 1]
        values = [piece[: len(piece) - extra] for piece in taken]
        try:
            text = b"\n".join(values).decode("utf-8")
        except UnicodeDecodeError:
            text = "\\"  # (found below)
        receipts = text.split("\n")
        if len(receipts) != count or "\r" in text or "\0" in text or "\\" in text:
            kept = 0  # the SENDs before the first value the usual path reads (or refuses)
            for value in values:
                try:
                    one = value.decode("utf-8")
                except UnicodeDecodeError:
                    break
                if "\n" in one or "\r" in one or "\0" in one or "\\" in one:
                    break
                kept += 1
            if not kept:
                return pos, None
            del taken[kept:], values[kept:]
            receipts = b"\n".join(values).decode("utf-8").split("\n")
            count = kept
            repeat = False
        pos += count * value_at + sum(map(len, taken))
        bodies = [piece[-size - 1 : -1] for piece in taken]
        frames.append(_new_tuple(SendStreak, (Command.SEND, lead, bodies, receipts)))
        return pos, (f"receipt:{receipts[0]}" if repeat else None)

    def _repeat_head(
        self, prefix: _HeadPrefix
    ) -> tuple[Command, list[tuple[str, str]], str | None, int] | None:
        """The head at the buffer's position, which starts with ``prefix``: only its last
        line is read (a run's SENDs differ in a receipt at most, ACKs in their id); its
        command, headers, first content-length and where its body starts.  None: not one
        more line then the empty line (or not plainly well formed): the usual reading."""
        buf = self._buf
        pos = self._pos
        at = pos + len(prefix.raw)
        end = buf.find(b"\n", at, pos + FAST_HEAD)
        if end < 0 or buf.find(b"\n", end + 1, end + 2) < 0:  # (no empty line after it)
            return None
        try:
            line = buf[at:end].decode("utf-8")
        except UnicodeDecodeError:
            return None
        if "\r" in line or "\0" in line:
            return None
        name, sep, value = line.partition(":")
        limit = self.limits.max_header_length
        if not sep or (len(line) > limit // 4 and len(line.encode("utf-8")) > limit):
            return None
        if "\\" in line:
            table = _escapes_for(self.version, prefix.command)
            if table is not None:
                name = _unescape(name, table)
                value = _unescape(value, table)
        length = prefix.length
        if length is None and name == "content-length":
            length = value
        return prefix.command, [*prefix.headers, (name, value)], length, end + 2

    def _skip_eols(self) -> bool:
        """Skip heart-beat EOLs; True when a command byte is next."""
        buf = self._buf
        n = len(buf)
        while self._pos < n:
            b = buf[self._pos]
            if b == 0x0A:
                self._pos += 1
                self.heartbeats += 1
            elif b == 0x0D:
                if self._pos + 1 >= n:
                    return False
                if buf[self._pos + 1] != 0x0A:
                    return True  # a stray CR starts a (bad) command line
                self._pos += 2
                self.heartbeats += 1
            else:
                return True
        return False

    def _line(self, limit: int, limit_name: str) -> bytes | None:
        end = self._buf.find(b"\n", self._pos)
        if end < 0:
            if len(self._buf) - self._pos > limit:
                self._too_long(limit, limit_name)
            return None
        line = bytes(self._buf[self._pos : end])
        if line.endswith(b"\r") and (self.version is None or self.version is Version.V1_2):
            line = line[:-1]
        if len(line) > limit:
            self._too_long(limit, limit_name)
        self._pos = end + 1
        return line

    @staticmethod
    def _too_long(limit: int, limit_name: str) -> None:
        if limit_name == "command":
            raise FrameError(f"command line longer than {limit} bytes")
        raise LimitExceeded(limit_name, f"a header line is longer than {limit} bytes")

    def _start_frame(self, line: bytes) -> None:
        try:
            command = Command(line.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            shown = line[:MAX_COMMAND_LENGTH].decode("ascii", "replace")
            raise FrameError(f"unknown command {shown!r}")
        if command not in self.commands:
            raise FrameError(f"unexpected command {command.value}")
        self._command = command
        self._headers = []
        self._state = _State.HEADERS

    def _add_header(self, line: bytes) -> None:
        if len(self._headers) >= self.limits.max_headers:
            raise LimitExceeded(
                "max_headers", f"more than {self.limits.max_headers} headers in a frame"
            )
        if b"\0" in line:
            raise FrameError("NUL byte in a header line")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("header line is not valid UTF-8")
        name, sep, value = text.partition(":")
        if not sep:
            raise FrameError(f"header line without ':' ({text[:40]!r})")
        assert self._command is not None
        table = _escapes_for(self.version, self._command)
        if table is not None:
            name = _unescape(name, table)
            value = _unescape(value, table)
        self._headers.append((name, value))

    def _start_body(self) -> None:
        for name, value in self._headers:
            if name == "content-length":
                self._begin_body(value)
                return
        self._begin_body(None)

    def _begin_body(self, length_text: str | None) -> None:
        """The body comes next; ``length_text``: the frame's first content-length."""
        length = None if length_text is None else _parse_length(length_text)
        if length is not None and length > self.limits.max_body:
            raise LimitExceeded(
                "max_body", f"content-length {length} is above {self.limits.max_body} bytes"
            )
        self._body_length = length
        self._scan_from = self._pos
        self._state = _State.BODY

    def _read_body(self) -> Frame | None:
        buf = self._buf
        start = self._pos
        if self._body_length is not None:
            end = start + self._body_length
            if len(buf) <= end:
                return None
            if buf[end] != 0:
                raise FrameError("frame body is not followed by NUL (wrong content-length?)")
        else:
            end = buf.find(b"\0", self._scan_from)
            if (end < 0 and len(buf) - start > self.limits.max_body) or (
                end - start > self.limits.max_body
            ):
                raise LimitExceeded(
                    "max_body", f"a body is longer than {self.limits.max_body} bytes"
                )
            if end < 0:
                self._scan_from = len(buf)
                return None
        assert self._command is not None
        frame = Frame(self._command, tuple(self._headers), bytes(buf[start:end]))
        self._pos = end + 1
        self._state = _State.IDLE
        self._command = None
        self._headers = []
        self._body_length = None
        return frame


_COMMANDS = {c.value: c for c in Command}


class _HeadPrefix(NamedTuple):
    """What :meth:`FrameParser._fast_head` read of a head but its last header line: a
    head starting with the same bytes (under the same version) is that plus one line."""

    raw: bytes  # the command line and the header lines before the last, as received
    version: Version | None
    command: Command
    headers: Headers  # those lines' headers (unescaped)
    length: str | None  # the first content-length among them
    size: int  # that length as a number; -1: none, -2: one the parser refuses


class _SameHead(NamedTuple):
    """A whole head (command line to the empty line) that :meth:`FrameParser._read_repeats`
    read twice in a row under the kept lead: the same bytes again are the same frame
    head, read without a look at its lines."""

    head: bytes  # the head as received, its empty line included
    skip: int  # len(head): where the body starts
    headers: Headers  # what it read (one tuple, shared by the frames of that head)
    size: int  # its content-length (checked: digits, at most max_body)


def _same_stride(
    data: bytes, tagged: bytes, stride: int, length: int
) -> tuple[list[str], list[bytes]] | None:
    """:meth:`FrameParser._read_receipts`' SENDs at the start of ``data`` when they are
    ``stride`` bytes each, the first one's (values of one length, ``length``): their
    receipts and bodies, at least two SENDs, else None (the pieces' way reads them).
    The last SEND that starts with ``tagged`` one stride after the other and ends with a
    NUL is found by bisection; the stretch up to it is then checked whole against the
    frames its values and bodies make (one join, one comparison), the values decoded and
    checked in one go."""
    count = len(data) // stride
    if count < 2:
        return None

    def aligned(k: int) -> bool:  # (SEND k-1 starts and ends one stride after the others)
        return data[k * stride - 1] == 0 and data.startswith(tagged, (k - 1) * stride)

    if not aligned(count):
        low, high = 1, count  # (aligned(1): the first SEND, checked by the caller)
        while high - low > 1:
            middle = (low + high) // 2
            if aligned(middle):
                low = middle
            else:
                high = middle
        count = low
        if count < 2:
            return None
    value_at = len(tagged)
    value_end = value_at + length
    body_at = value_end + 2
    body_end = stride - 1
    starts = range(0, count * stride, stride)
    values = [data[at + value_at : at + value_end] for at in starts]
    bodies = [data[at + body_at : at + body_end] for at in starts]
    made = b"".join(
        itertools.chain.from_iterable(
            zip(
                itertools.repeat(tagged),
                values,
                itertools.repeat(b"\n\n"),
                bodies,
                itertools.repeat(b"\0"),
            )
        )
    )
    if not data.startswith(made):
        return None
    try:
        text = b"\n".join(values).decode("utf-8")
    except UnicodeDecodeError:
        return None
    receipts = text.split("\n")
    if len(receipts) != count or "\r" in text or "\0" in text or "\\" in text:
        return None
    return receipts, bodies


def _is_length(text: str) -> bool:
    """Is ``text`` a content-length the parser reads (ASCII digits, at most 20)?"""
    return text.isdigit() and text.isascii() and len(text) <= 20


def _size_of(length: str | None) -> int:
    """A lead's content-length as :attr:`_HeadPrefix.size` says it."""
    if length is None:
        return -1
    return int(length) if _is_length(length) else -2


#: A named tuple made from its fields' tuple without its class's Python ``__new__``.
_new_tuple = tuple.__new__

#: ``FrameParser._fast_head`` read a head; its body is still to come.
_HEAD_ONLY = Frame(Command.SEND, (), b"")
_EOL_BYTES = (0x0A, 0x0D)  # a heart-beat between frames starts with one


def _parse_length(value: str) -> int:
    text = value
    if not text.isdigit() or not text.isascii() or len(text) > 20:
        raise FrameError(f"content-length is not a non-negative integer ({value[:40]!r})")
    return int(text)


def parse_all(data: bytes, version: Version | None = None) -> list[Frame]:
    """Parse a complete byte string (tests and tools); raises on a trailing fragment."""
    parser = FrameParser(commands=ALL_COMMANDS, version=version)
    frames = parser.feed(data)
    if not parser.idle:
        raise FrameError("incomplete frame at the end of the data")
    return frames


# -- serializer --------------------------------------------------------------------------


def serialize(frame: Frame, version: Version = Version.V1_2) -> bytes:
    """Bytes of ``frame`` as ``version`` writes it (LF line ends, trailing NUL)."""
    escape = frame.command not in _UNESCAPED_COMMANDS and version is not Version.V1_0
    # a 1.0 frame is read with a CR before the LF in its line (not CONNECT/CONNECTED,
    # read before the version is known): written so, a value ending with CR reads back
    cr_kept = not escape and version is Version.V1_0 and frame.command not in _UNESCAPED_COMMANDS
    table = _ENCODE_1_2 if version is Version.V1_2 else _ENCODE_1_1
    parts = [frame.command.value, "\n"]
    append = parts.append
    length: str | None = None
    for name, value in frame.headers:
        if "\0" in name or "\0" in value:
            raise EncodeError(f"header {name[:40]!r} contains NUL")
        if length is None and name == "content-length":
            length = value
        if escape:
            append(f"{name.translate(table)}:{value.translate(table)}\n")
        else:
            _check_raw_header(name, value, version, cr_kept)
            append(f"{name}:{value}\n")
    append("\n")
    head = "".join(parts).encode("utf-8")
    body = frame.body
    if length is None and b"\0" in body:
        raise EncodeError("a body with NUL bytes needs a content-length header")
    if length is not None and length != str(len(body)):
        raise EncodeError(f"content-length {length} does not match the body ({len(body)})")
    return b"".join((head, body, b"\0"))


def serialize_escaped(
    command: Command, headers: Iterable[tuple[str, str]], body: bytes, version: Version
) -> bytes:
    """``serialize(Frame(command, headers, body), version)`` for a command whose headers
    are escaped on ``version`` (1.1/1.2, not CONNECT/CONNECTED) and whose ``headers``
    already hold the body's ``content-length``: no Frame is built (every MESSAGE)."""
    table = _ENCODE_1_2 if version is Version.V1_2 else _ENCODE_1_1
    parts = [command.value, "\n"]
    append = parts.append
    for name, value in headers:
        if "\0" in name or "\0" in value:
            raise EncodeError(f"header {name[:40]!r} contains NUL")
        append(f"{name.translate(table)}:{value.translate(table)}\n")
    append("\n")
    return b"".join(("".join(parts).encode("utf-8"), body, b"\0"))


def serialize_receipt(receipt_id: str, version: Version = Version.V1_2) -> bytes:
    """``serialize`` of a RECEIPT frame for ``receipt_id``, without building the frame."""
    if version is Version.V1_0 or "\0" in receipt_id:
        return serialize(Frame(Command.RECEIPT, (("receipt-id", receipt_id),)), version)
    table = _ENCODE_1_2 if version is Version.V1_2 else _ENCODE_1_1
    return b"RECEIPT\nreceipt-id:" + receipt_id.translate(table).encode("utf-8") + b"\n\n\0"


def serialize_receipts(
    receipt_ids: Iterable[str | None], version: Version = Version.V1_2
) -> bytes:
    """The RECEIPT frames of ``receipt_ids`` (None: none), in order: the bytes of
    :func:`serialize_receipt` of each, escaped and encoded in one go (a run of SENDs is
    answered at once).  EncodeError (an id with a NUL) before anything is written."""
    ids = [r for r in receipt_ids if r is not None]
    joined = "".join(ids)  # (what one id holds, the run's ids hold)
    if version is Version.V1_0 or "\0" in joined:
        return b"".join([serialize_receipt(r, version) for r in ids])
    if not ("\\" in joined or ":" in joined or "\n" in joined or "\r" in joined):
        # nothing to escape (the usual run): the frames are one join of the ids
        return f"{_RECEIPT_HEAD}{_RECEIPT_SEPARATOR.join(ids)}\n\n\0".encode() if ids else b""
    table = _ENCODE_1_2 if version is Version.V1_2 else _ENCODE_1_1
    # (translate only an id with something to escape: ~10x the cost of the test)
    return "".join(
        [
            "RECEIPT\nreceipt-id:"
            + (r.translate(table) if "\\" in r or ":" in r or "\n" in r or "\r" in r else r)
            + "\n\n\0"
            for r in ids
        ]
    ).encode()


#: A RECEIPT frame up to its id, and what comes between two ids in a run of them.
_RECEIPT_HEAD = "RECEIPT\nreceipt-id:"
_RECEIPT_SEPARATOR = "\n\n\0" + _RECEIPT_HEAD


def _check_raw_header(name: str, value: str, version: Version, cr_kept: bool = False) -> None:
    """Refuse what an unescaped header line cannot hold; ``cr_kept``: the reader keeps a
    CR before the LF in the line (a 1.0 frame but CONNECT/CONNECTED: ``FrameParser``'s
    rule), so a name or value ending with CR is written as it is."""
    if "\n" in name or "\n" in value or ":" in name:
        raise EncodeError(
            f"header {name[:40]!r} cannot be written unescaped "
            f"(STOMP {version.value}, {'no escapes' if version is Version.V1_0 else 'CONNECT'})"
        )
    if not cr_kept and (value.endswith("\r") or name.endswith("\r")):
        raise EncodeError(f"header {name[:40]!r} ends with CR (read back as a CRLF)")


HEARTBEAT = b"\n"
