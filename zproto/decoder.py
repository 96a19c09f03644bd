"""Emit the decoder of one message: bounds-checked straight-line reads.

Fixed-size fields are read with one ``unpack_from`` per run; every variable
length is checked against the buffer before slicing; constants, trailing octets
and frame counts are checked.  The module's ``decode()`` turns any low-level
failure into ``DecodeError``.
"""

from __future__ import annotations

from zproto.attrs import attributes, attrs_of, plain_default
from zproto.model import VARLEN, Field, Message, Optional, Protocol
from zproto.pysource import LINE_LENGTH, ORDER_PREFIX, STRUCT_CHAR, Source, StructNames, lit


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
        self._ctx = _DecodeCtx(src, 3 if self.classic else 0, cname, self.structs)
        if msg.fields and any(f.type not in ("frame", "msg") for f in msg.fields):
            src("size = len(buf)")
        frame_index = 1
        for item in msg.items:
            if isinstance(item, Optional):
                self._ctx.flush()
                self._ctx.materialize()
                src(f"if {item.flag}:")
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
                        src(f"{attr.ident} = {plain_default(attr.default)}")
                    if fld.derived:
                        src(f"{fld.ident} = 0")
                src.dedent()
            else:
                frame_index = self._decode_field(item, frame_index)
        self._ctx.flush()
        end = self._ctx.position()
        if msg.fields and any(f.type not in ("frame", "msg") for f in msg.fields):
            src(f"if size != {end}:")
            src(f'    raise DecodeError("{cname}: trailing octets after the last field")')
        elif self.classic:
            src("if len(buf) != 3:")
            src(f'    raise DecodeError("{cname}: trailing octets after the message id")')
        attrs = attributes(msg)
        if attrs:
            src.wrapped("state = {", [f'"{a.ident}": {a.ident}' for a in attrs], "}")
            src(f"m = _new({cname})")
            src('_set(m, "__dict__", state)')
            src("return m")
        else:
            src(f"return {cname}()")
        src.dedent()
        src()
        src()

    def _decode_field(self, fld: Field, frame_index: int) -> int:
        ctx, src = self._ctx, self._ctx.src
        ident, what = fld.ident, f"{self._ctx.cname}.{fld.ident}"
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
            raw = f"bits_{ident}"
            ctx.add(raw, STRUCT_CHAR[size], size, fld.byteorder if size > 1 else None)
            shift = size * 8
            for bit in fld.bits:
                shift -= bit.width
                mask = (1 << bit.width) - 1
                if bit.width == 1 and bit.value is None:
                    ctx.after(f"{bit.ident} = {raw} & {1 << shift} != 0")
                elif shift:
                    ctx.after(f"{bit.ident} = {raw} >> {shift} & {mask}")
                else:
                    ctx.after(f"{bit.ident} = {raw} & {mask}")
                if bit.value is not None:
                    ctx.after(
                        f"if {bit.ident} != {bit.value}:",
                        f'    raise DecodeError("{self._ctx.cname}.{bit.ident} must be '
                        f'{bit.value}")',
                    )
        elif fld.type == "octets" and fld.length_ref is None:
            size = int(fld.size or 0)
            ctx.add(ident, f"{size}s", size, None)
        elif fld.type == "uuid":
            ctx.add(f"raw_{ident}", "16s", 16, None)
            ctx.after(f"{ident} = uuid.UUID(bytes=raw_{ident})")
        elif fld.type in ("string", "longstr", "chunk", "octets", "headers"):
            ctx.flush()
            ctx.materialize()
            decode = ".decode()" if fld.type in ("string", "longstr") else ""
            if fld.length_ref is not None:
                src(f"end = pos + {fld.length_ref}")
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
            src(f'{ident}, pos = _rt.{fn}(buf, pos, "{what}")')
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
            fmt = ORDER_PREFIX[self.run_order or "big"] + "".join(c for _, c in self.run)
            targets = ", ".join(t for t, _ in self.run)
            if len(self.run) == 1:
                targets += ","
            call = f"{self.structs.name(fmt)}.unpack_from(buf, {self.position()})"
            line = f"({targets}) = {call}"
            if len(line) + 4 * self.src.level <= LINE_LENGTH:
                self.src(line)
            else:
                self.src(f"({targets}) = (")
                self.src(f"    {call}")
                self.src(")")
            self.offset += self.run_size
            self.run, self.run_size, self.run_order = [], 0, None
        for line in self.pending:
            self.src(line)
        self.pending = []

    def materialize(self) -> None:
        if self.base is None or self.offset:
            self.src(f"pos = {self.position()}")
        self.base, self.offset = "pos", 0
