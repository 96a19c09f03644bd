"""Emit the decoder of one message: bounds-checked straight-line reads.

Fixed-size fields are read with one ``unpack_from`` per run; every variable
length is checked against the buffer before slicing; constants, trailing octets
and frame counts are checked.  The module's ``decode()`` turns any low-level
failure into ``DecodeError``.
"""

from __future__ import annotations

from zproto.attrs import attributes, attrs_of, plain_default, twin_name
from zproto.model import VARLEN, Field, Message, Optional, Protocol, to_const_name
from zproto.pysource import (
    LINE_LENGTH,
    ORDER_PREFIX,
    STRUCT_CHAR,
    Source,
    StructNames,
    group_checks,
    lit,
)
from zproto.shape import VARLEN_TWO_OCTETS, Plan


def build(src: Source, msg: Message, entries: list[tuple[str, str]]) -> None:
    """Return a new message ``msg`` holding ``entries`` (attribute, expression), in order.

    The values go into the slots of the message's twin with ordinary attribute stores,
    then the twin becomes the frozen class (see ``zproto.runtime.MessageBase``).
    """
    src(f"m: Any = {twin_name(msg)}()")
    finish(src, msg, entries)


def finish(src: Source, msg: Message, entries: list[tuple[str, str]]) -> None:
    """Fill the rest of the twin ``m`` with ``entries`` and return it as a ``msg``."""
    for ident, expr in entries:
        src(f"m.{ident} = {expr}")
    src(f"m.__class__ = {msg.class_name}")
    src("return m")


def stored_directly(msg: Message) -> set[str]:
    """Fields a decoder reads straight into the slots of the message's twin: those whose
    value is the attribute as read (no constant to check, no bits to split, not in an
    optional section, not a length another field needs)."""
    direct: set[str] = set()
    for item in msg.items:
        if isinstance(item, Optional) or item.derived or item.value is not None:
            continue
        if item.type in ("bits", "uuid") or (item.type == "number" and item.size == VARLEN):
            continue
        direct.add(item.ident)
    return direct


#: Field types a decoder reads the same from a memoryview as from bytes (strings through
#: ``str(view, "utf-8")``, a hash through ``_rt.dec_hash``, a fixed octets field unpacked).
_VIEW_SAFE = frozenset({"number", "bits", "string", "longstr", "chunk", "hash", "uuid"})


def decodes_in_place(msg: Message) -> bool:
    """True when ``msg`` has a chunk field and every field of it reads the same from a
    memoryview: a classic ``decode()`` then hands its decoder a view of a big frame
    (``_rt.frame_view``) and the chunk is a slice of the frame, never copied."""
    fields = msg.fields
    if not any(f.type == "chunk" for f in fields):
        return False
    return all(
        f.type in _VIEW_SAFE or (f.type == "octets" and f.length_ref is None) for f in fields
    )


def fixed_size(msg: Message) -> int | None:
    """The size of a classic message's one frame when every field has a fixed size and
    one byte order (the whole frame is then one ``struct``), else None."""
    if not msg.fields:
        return None
    size = 3
    orders = set()
    for fld in msg.fields:
        if fld.type == "number" and fld.size != VARLEN:
            size += int(fld.size or 1)
            if int(fld.size or 1) > 1:
                orders.add(fld.byteorder)
        elif fld.type == "octets" and fld.length_ref is None:
            size += int(fld.size or 0)
        else:
            return None
    return size if len(orders) <= 1 else None


def bit_values(fld: Field, raw: str) -> dict[str, str]:
    """Expressions of the named bit groups of ``fld`` (not the derived ones) over ``raw``."""
    out: dict[str, str] = {}
    shift = int(fld.size or 1) * 8
    for bit in fld.bits:
        shift -= bit.width
        mask = (1 << bit.width) - 1
        if bit.derived:
            continue
        if bit.width == 1 and bit.value is None:
            out[bit.ident] = f"{raw} & {1 << shift} != 0"
        elif shift:
            out[bit.ident] = f"{raw} >> {shift} & {mask}"
        else:
            out[bit.ident] = f"{raw} & {mask}"
    return out


class DecoderWriter:
    """Writes ``_decode_<message>`` functions into a module being generated."""

    def __init__(self, proto: Protocol, structs: StructNames) -> None:
        self.proto = proto
        self.structs = structs
        self.classic = proto.dialect == "classic"

    def write(self, src: Source, msg: Message) -> None:
        cname = msg.class_name
        src(f"def _decode_{msg.ident}(buf: bytes, frames: Any) -> {cname}:")
        src.indent()
        n_frames = 1 + sum(1 for f in msg.fields if f.type == "frame")
        has_msg = any(f.type == "msg" for f in msg.fields)
        if has_msg:
            src(f"if len(frames) < {n_frames}:")
            src(f'    raise DecodeError("{cname}: expected at least {n_frames} frames")')
        else:
            src(f"if len(frames) != {n_frames}:")
            src(f'    raise DecodeError("{cname}: expected {n_frames} frame(s)")')
        whole = fixed_size(msg) if self.classic else None
        self._ctx = _DecodeCtx(src, 3 if self.classic else 0, cname, self.structs)
        attrs = attributes(msg)
        self._direct = stored_directly(msg) if attrs else set()
        # a message with a chunk field may be decoded from a memoryview (``frame_view``)
        self._view = self.classic and decodes_in_place(msg)
        if whole is not None:
            # one struct covers the frame, signature and id included (pad octets)
            src(f"if len(buf) != {whole}:")
            src(f'    raise _rt.wrong_size("{cname}", len(buf), {whole})')
            self._ctx.whole = True
        elif msg.fields and any(f.type not in ("frame", "msg") for f in msg.fields):
            src("size = len(buf)")
        if attrs:
            src(f"m: Any = {twin_name(msg)}()")
        frame_index = 1
        for item in msg.items:
            if isinstance(item, Optional):
                self._ctx.flush()
                self._ctx.materialize()
                src(f"if f_{item.flag}:")
                src.indent()
                for fld in item.fields:
                    frame_index = self._decode_field(fld, frame_index)
                self._ctx.flush()
                self._ctx.materialize()
                src.dedent()
                src("else:")
                src.indent()
                for fld in item.fields:
                    for attr in attrs_of(fld):
                        src(f"f_{attr.ident} = {plain_default(attr.default)}")
                    if fld.derived:
                        src(f"f_{fld.ident} = 0")
                src.dedent()
            else:
                frame_index = self._decode_field(item, frame_index)
        self._ctx.flush()
        end = self._ctx.position()
        if whole is not None:
            pass  # the size was checked first
        elif msg.fields and any(f.type not in ("frame", "msg") for f in msg.fields):
            src(f"if size != {end}:")
            src(f'    raise DecodeError("{cname}: trailing octets after the last field")')
        elif self.classic:
            src("if len(buf) != 3:")
            src(f'    raise DecodeError("{cname}: trailing octets after the message id")')
        if attrs:
            rest = [(a.ident, f"f_{a.ident}") for a in attrs if a.ident not in self._direct]
            finish(src, msg, rest)
        else:
            src(f"return {cname}()")
        src.dedent()
        src()
        src()

    def _decode_field(self, fld: Field, frame_index: int) -> int:
        ctx, src = self._ctx, self._ctx.src
        what = f"{self._ctx.cname}.{fld.ident}"
        ident = f"m.{fld.ident}" if fld.ident in self._direct else f"f_{fld.ident}"
        if fld.type == "number":
            if fld.size == VARLEN:
                ctx.flush()
                ctx.materialize()
                src(f"{ident}, pos = _rt.dec_varlen(buf, pos, {lit(fld.byteorder)})")
            else:
                size = int(fld.size or 1)
                ctx.add(ident, STRUCT_CHAR[size], size, fld.byteorder if size > 1 else None)
            if fld.value is not None:
                ctx.after(
                    f"if {ident} != {int(fld.value, 0)}:",
                    f'    raise DecodeError(f"{what} must be {int(fld.value, 0)}, '
                    f'not {{{ident}}}")',
                )
        elif fld.type == "bits":
            size = int(fld.size or 1)
            raw = f"bits_{fld.ident}"
            ctx.add(raw, STRUCT_CHAR[size], size, fld.byteorder if size > 1 else None)
            shift = size * 8
            for bit in fld.bits:
                shift -= bit.width
                mask = (1 << bit.width) - 1
                target = f"f_{bit.ident}"
                if bit.width == 1 and bit.value is None:
                    ctx.after(f"{target} = {raw} & {1 << shift} != 0")
                elif shift:
                    ctx.after(f"{target} = {raw} >> {shift} & {mask}")
                else:
                    ctx.after(f"{target} = {raw} & {mask}")
                if bit.value is not None:
                    ctx.after(
                        f"if {target} != {bit.value}:",
                        f'    raise DecodeError("{self._ctx.cname}.{bit.ident} must be '
                        f'{bit.value}")',
                    )
        elif fld.type == "octets" and fld.length_ref is None:
            size = int(fld.size or 0)
            ctx.add(ident, f"{size}s", size, None)
        elif fld.type == "uuid":
            ctx.add(f"raw_{fld.ident}", "16s", 16, None)
            ctx.after(f"{ident} = uuid.UUID(bytes=raw_{fld.ident})")
        elif fld.type in ("string", "longstr", "chunk", "octets", "headers"):
            ctx.flush()
            ctx.materialize()
            decode = ".decode()" if fld.type in ("string", "longstr") else ""
            if fld.length_ref is not None:
                src(f"end = pos + f_{fld.length_ref}")
                body = "pos"
            elif fld.type == "string":
                src("end = pos + 1 + buf[pos]")
                body = "pos + 1"
            else:
                src("end = pos + 4 + _U32.unpack_from(buf, pos)[0]")
                body = "pos + 4"
            if fld.type == "headers":
                src(f'{ident} = _rt.dec_headers(buf, {body}, end, "{what}")')
            else:
                src("if end > size:")
                src(f'    raise _rt.truncated("{what}")')
                sliced = f"buf[{body}:end]" if body == "pos" else f"buf[{body} : end]"
                if decode and self._view:  # (str() takes a memoryview, .decode() does not)
                    src(f'{ident} = str({sliced}, "utf-8")')
                else:
                    src(f"{ident} = {sliced}{decode}")
            src("pos = end")
            if fld.value is not None:
                src(f"if {ident} != {lit(fld.value)}:")
                src.indent()
                src.wrapped(
                    "raise DecodeError(",
                    [f'f"{what} is not its constant, got {{{ident}!r}}"'],
                    ")",
                )
                src.dedent()
        elif fld.type in ("strings", "hash"):
            ctx.flush()
            ctx.materialize()
            fn = "dec_strings" if fld.type == "strings" else "dec_hash"
            if fld.lazy:
                fn = "dec_hash_lazy"
            limit = "" if fld.limit is None else f", {fld.limit}"
            src(f'{ident}, pos = _rt.{fn}(buf, pos, "{what}"{limit})')
        elif fld.type == "frame":
            src(f"{ident} = _rt.frame_bytes(frames[{frame_index}])")
            return frame_index + 1
        elif fld.type == "msg":
            src(f"{ident} = [_rt.frame_bytes(f) for f in frames[{frame_index}:]]")
        else:  # pragma: no cover
            raise AssertionError(fld.type)
        return frame_index


class _DecodeCtx:
    """Tracks the read position and batches fixed-size fields into one struct."""

    def __init__(self, src: Source, start: int, cname: str, structs: StructNames) -> None:
        self.src = src
        self.base: str | None = None  # "pos" once a variable-size field was read
        self.offset = start
        self.cname = cname
        self.structs = structs
        self.run: list[tuple[str, str]] = []  # (target, char)
        self.run_size = 0
        self.run_order: str | None = None
        self.pending: list[str] = []
        self.whole = False  # the first run is the whole frame: unpack it all, pad first

    def position(self) -> str:
        if self.base is None:
            return str(self.offset)
        return "pos" if self.offset == 0 else f"pos + {self.offset}"

    def add(self, target: str, char: str, size: int, order: str | None) -> None:
        if order is not None and self.run_order is not None and order != self.run_order:
            self.flush()
        self.run.append((target, char))
        self.run_size += size
        if order is not None:
            self.run_order = order

    def after(self, *lines: str) -> None:
        """Lines to emit once the current run has been unpacked."""
        self.pending.extend(lines)

    def flush(self) -> None:
        if self.run:
            chars = "".join(c for _, c in self.run)
            if self.whole:
                fmt = f"{ORDER_PREFIX[self.run_order or 'big']}{self.offset}x{chars}"
                call = f"{self.structs.name(fmt)}.unpack(buf)"
                self.whole = False
            else:
                fmt = ORDER_PREFIX[self.run_order or "big"] + chars
                call = f"{self.structs.name(fmt)}.unpack_from(buf, {self.position()})"
            self.src.unpack([t for t, _ in self.run], call)
            self.offset += self.run_size
            self.run, self.run_size, self.run_order = [], 0, None
        for line in self.pending:
            self.src(line)
        self.pending = []

    def materialize(self) -> None:
        if self.base is None or self.offset:
            self.src(f"pos = {self.position()}")
        self.base, self.offset = "pos", 0


# ---------------------------------------------------------------------------
# the simplest shape of a binary frame


def decode_or_none(src: Source, name: str, frame: str) -> None:
    """``name = decode((frame,))``, None when ``decode`` refuses the frame: the fallback of
    the generated run decoders (``decode`` has the last word on every error)."""
    src("try:")
    src(f"    {name} = decode(({frame},))")
    src("except DecodeError:")
    src(f"    {name} = None")


def unpack_bits(src: Source, targets: list[str]) -> None:
    """``(target, ...) = bits``: the remembered values of the head's bits into their
    slots (laid out as ``ruff format`` would)."""
    if len(targets) == 1:
        src(f"({targets[0]},) = bits")
    else:
        src.wrapped("(", targets, ") = bits")


def bits_key(plan: Plan) -> str:
    """One int from the raw bits fields of a simplest-shape head (the key of the
    remembered base states): the local they were read into as one number
    (``plan.key``), else made from each, the first most significant."""
    if plan.key is not None:
        return plan.key
    parts = []
    shift = 0
    for fld in reversed(plan.bits):
        parts.append(f"bits_{fld.ident} << {shift}" if shift else f"bits_{fld.ident}")
        shift += int(fld.size or 1) * 8
    return " | ".join(reversed(parts))


class FastDecoderWriter:
    """Writes the ``decode(frames)`` of a binary model: a one-frame message in its simplest
    shape is decoded inline, with one ``struct`` and one length check; anything else,
    errors included, goes to the general decoder (``_decode``)."""

    def __init__(self, structs: StructNames) -> None:
        self.structs = structs

    def write(
        self,
        src: Source,
        msg: Message,
        plan: Plan,
        literal_size: int,
        wide_at: int | None = None,
    ) -> None:
        """``decode``; literals (``literal_size`` octets at most) are never fast.
        ``wide_at``: the offset of the one variable-length number of the head, when the
        module has ``_decode_at_wide``: a frame whose number there is in its three-octet
        form (a TMQP frame of 253 to 65,535 payload octets: a 4 KiB delivery, a delivery
        batch) is tried by that before the general decoder (``_decode_wide_first``)."""
        if wide_at is not None:
            src("def _decode_wide_first(frames: Any, buf: bytes, size: int) -> Message:")
            src('    """``decode`` of a frame not in the simplest shape: its wide form where')
            src('    it lies (``_decode_at_wide``), else the general decoder."""')
            src(f"    if size > {wide_at} and buf[{wide_at}] == {VARLEN_TWO_OCTETS}:")
            src("        m = _decode_at_wide(buf, 0, size)")
            src("        if m is not None:")
            src("            return m")
            src("    return _decode(frames)")
            src()
            src()
        values: dict[str, str] = {}
        for fld in plan.bits:
            values.update(bit_values(fld, f"bits_{fld.ident}"))
        if values:
            self._base(src, msg, plan, values)
        src("def decode(frames: Any) -> Message:")
        src.indent()
        src('"""Decode ZeroMQ frames (bytes-like) into a message.')
        src()
        src("Raises DecodeError, and nothing else, on malformed input.")
        src('"""')
        src("try:")
        src("    buf = frames[0]")
        src("    single = type(buf) is bytes and len(frames) == 1")
        src("except (TypeError, LookupError):")
        src("    single = False  # the general decoder says what is wrong")
        src("if not single:")
        src("    return _decode(frames)")
        src("size = len(buf)")
        first = None if wide_at is None else "return _decode_wide_first(frames, buf, size)"
        self._simplest(
            src, msg, plan, literal_size, values, None, "return _decode(frames)", first=first
        )
        src.dedent()
        src()
        src()

    def write_at(
        self, src: Source, msg: Message, plan: Plan, literal_size: int, wide: bool = False
    ) -> None:
        """``_decode_at(buf, p, end)``: the frame ``buf[p:end]`` in its simplest shape,
        decoded where it lies (no copy of it), else None (``decode_entries``).  Written
        after :meth:`write`, whose remembered base states it shares.  ``wide`` (``plan``
        made with ``plan_fast(msg, wide=True)``): ``_decode_at_wide``, the same for that
        shape with its variable-length numbers in their three-octet form."""
        values: dict[str, str] = {}
        for fld in plan.bits:
            values.update(bit_values(fld, f"bits_{fld.ident}"))
        name = "_decode_at_wide" if wide else "_decode_at"
        src(f"def {name}(buf: bytes, p: int, end: int) -> {msg.class_name} | None:")
        src.indent()
        simplest = "``decode((buf[p:end],))`` when that frame has the simplest shape"
        if wide:
            src(f'"""{simplest} but for')
            src('its variable-length numbers in their three-octet form, else None."""')
        else:
            src(f'"""{simplest}, else None."""')
        src("size = end - p")
        self._simplest(src, msg, plan, literal_size, values, "p", "return None")
        src.dedent()
        src()
        src()

    @staticmethod
    def inlinable(plan: Plan) -> bool:
        """Whether :meth:`write_inline` can write ``plan``'s decoder: the head's bits
        decide fields (the frame is filled in a twin and ends in a statement of choice)."""
        return any(bit_values(fld, f"bits_{fld.ident}") for fld in plan.bits)

    def write_inline(self, src: Source, msg: Message, plan: Plan, literal_size: int) -> None:
        """The body of ``_decode_at(buf, start, end)`` inline, in a loop run once: ``m``
        the frame ``buf[start:end]`` (``size`` octets) in its simplest shape, else ``m``
        stays None (a Python call less per entry of ``decode_entries``).  Only for a
        ``plan`` that is :meth:`inlinable`."""
        values: dict[str, str] = {}
        for fld in plan.bits:
            values.update(bit_values(fld, f"bits_{fld.ident}"))
        src("m: Any = None")
        src("while True:  # (once: a frame of another shape breaks out, m None)")
        src.indent()
        self._simplest(src, msg, plan, literal_size, values, "start", "break", "break")
        src.dedent()

    def _simplest(
        self,
        src: Source,
        msg: Message,
        plan: Plan,
        literal_size: int,
        values: dict[str, str],
        base: str | None,
        fail: str,
        made: str = "return m",
        first: str | None = None,
    ) -> None:
        """The body of a simplest-shape decoder of ``buf`` (``size`` octets from ``base``,
        a variable, or from 0 when None): ``fail`` for any other frame, ``made`` once the
        frame ``m`` is made (when the head's bits decide fields); ``first`` (if given)
        instead of ``fail`` when the size or a one-octet length is out of the shape."""
        cname = msg.class_name
        entries = self.checked_fields(src, msg, plan, literal_size, base, fail, first)
        if values:
            # the fields the head's bits decide: a remembered tuple per value of the bits
            self.remembered_bits(src, msg, plan, "key")
            src(f"m{': Any' if made == 'return m' else ''} = {twin_name(msg)}()")
            unpack_bits(src, [f"m.{name}" for name in values])
            for name, expr in entries:
                src(f"m.{name} = {expr}")
            src(f"m.__class__ = {cname}")
            src(made)
        else:
            build(src, msg, entries)

    @staticmethod
    def remembered_bits(src: Source, msg: Message, plan: Plan, key: str) -> None:
        """``bits``: the remembered values of the fields the head's bits decide (the
        table ``_BASES_<MESSAGE>`` that :meth:`write` makes), ``key`` a free local."""
        const = to_const_name(msg.name)
        if plan.key is not None:
            key = plan.key  # (read as one number by the head's struct)
        else:
            src(f"{key} = {bits_key(plan)}")
        src(f"bits = _BASES_{const}.get({key})")
        src("if bits is None:")
        src(f"    bits = _base_{msg.ident}({key})")

    def checked_fields(
        self,
        src: Source,
        msg: Message,
        plan: Plan,
        literal_size: int,
        base: str | None,
        fail: str,
        first: str | None = None,
    ) -> list[tuple[str, str]]:
        """The checks of a frame in its simplest shape (``buf``, ``size`` octets from
        ``base``, a variable, or from 0 when None; ``fail`` for any other frame) and its
        tail fields into locals ``f_<field>``; returns (attribute, expression) of every
        attribute the head's bits do not decide, in the message's order."""
        attrs = attributes(msg)
        values: dict[str, str] = {}
        for fld in plan.bits:
            values.update(bit_values(fld, f"bits_{fld.ident}"))
        struct_name = self.structs.name(plan.format())
        absent = {a.ident for f in plan.absent for a in attrs_of(f)}

        def at(offset: int | str) -> str:
            return str(offset) if base is None else f"{base} + {offset}"

        def part(start: str, end: str) -> str:  # (spaced as ruff formats a slice)
            return f"buf[{start} : {end}]" if " " in start else f"buf[{start}:{end}]"

        tests = [f"size < {max(plan.head_size, literal_size + 1)}"]
        tests += [f"buf[{at(offset)}] > 252" for offset in plan.short_lengths]
        src(f"if {' or '.join(tests)}:")
        src(f"    {fail if first is None else first}")
        where = "buf" if base is None else f"buf, {base}"
        src.unpack([t for t, _, _ in plan.head], f"{struct_name}.unpack_from({where})")
        checks = [f"{raw} & {mask}" for raw, mask in plan.clear_flags]
        checks += [f"{expr} != {value}" for expr, value in plan.constants]
        ends: list[str] = []
        position = at(plan.head_size)
        for fld in plan.tail:
            src(f"e_{fld.ident} = {position} + f_{fld.length_ref}")
            position = f"e_{fld.ident}"
            ends.append(position)
        checks.append(f"{position} != {'size' if base is None else 'end'}")
        for group in group_checks(checks, LINE_LENGTH - 4 * src.level - 4):
            src(f"if {group}:")
            src(f"    {fail}")
        strings = [f for f in plan.tail if f.type == "string"]
        if strings:
            src("try:")
            src.indent()
        start = at(plan.head_size)
        for fld, end in zip(plan.tail, ends, strict=True):
            if fld.type == "string":
                src(f"f_{fld.ident} = {part(start, end)}.decode()")
            start = end
        if strings:
            src.dedent()
            src("except UnicodeDecodeError:")
            src(f"    {fail}")
        start = at(plan.head_size)
        for fld, end in zip(plan.tail, ends, strict=True):
            if fld.type == "octets":
                src(f"f_{fld.ident} = {part(start, end)}")
            start = end
        entries = []
        for attr in attrs:
            if attr.ident in values:
                continue
            if attr.ident in absent:
                entries.append((attr.ident, plain_default(attr.default)))
            else:
                entries.append((attr.ident, f"f_{attr.ident}"))
        return entries

    def _base(self, src: Source, msg: Message, plan: Plan, values: dict[str, str]) -> None:
        """``_base_<message>(key)``: the values of the fields the head's bits decide, for
        frames whose head bits are ``key``; at most ``BASES_LIMIT`` of them are remembered
        (a few are common)."""
        const = to_const_name(msg.name)
        src(f"_BASES_{const}: dict[int, tuple[Any, ...]] = {{}}")
        src()
        src()
        src(f"def _base_{msg.ident}(key: int) -> tuple[Any, ...]:")
        src.indent()
        src('"""The fields the bits of the head decide, in the order of the message."""')
        shift = sum(int(f.size or 1) * 8 for f in plan.bits)
        for n, fld in enumerate(plan.bits):
            size = int(fld.size or 1) * 8
            shift = plan.key_shifts[n] if plan.key is not None else shift - size
            mask = (1 << size) - 1
            src(
                f"bits_{fld.ident} = key >> {shift} & {mask}"
                if shift
                else f"bits_{fld.ident} = key & {mask}"
            )
        exprs = list(values.values())
        if len(exprs) == 1:
            src(f"bits = ({exprs[0]},)")
        else:
            src.wrapped("bits = (", exprs, ")")
        src(f"if len(_BASES_{const}) < {BASES_LIMIT}:")
        src(f"    _BASES_{const}[key] = bits")
        src("return bits")
        src.dedent()
        src()
        src()


def wide_marker(plan: Plan) -> int | None:
    """The offset of ``plan``'s one variable-length number in the head, where a frame of
    the wide shape (``plan_fast(msg, wide=True)``) has the octet 253; None: not one."""
    return plan.short_lengths[0] if len(plan.short_lengths) == 1 else None


#: Most base states remembered per message (distinct values of the head's bits).
BASES_LIMIT = 1024
