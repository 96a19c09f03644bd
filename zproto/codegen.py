"""Generate a Python codec module from a loaded protocol model.

The generated module is straight-line code: runs of fixed-size fields become one
precompiled ``struct.Struct`` per run, variable-size fields are sliced with an
explicit bounds check, and the rare structures (hashes, string lists, header
blocks, TMQP lengths) call ``zproto.runtime``.  Encoders take a fast path and
only on failure run a validator that names the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zproto import __version__
from zproto.model import VARLEN, Bit, Field, Message, Optional, Protocol, to_const_name

_STRUCT_CHAR = {1: "B", 2: "H", 4: "I", 8: "Q"}
#: Generated code is written to be stable under ``ruff format`` at this width.
LINE_LENGTH = 99
_ORDER_PREFIX = {"big": ">", "little": "<"}


def lit(value: object) -> str:
    """Python literal with the double quotes a formatter would choose."""
    text = repr(value)
    if isinstance(value, bytes) and text.startswith("b'") and '"' not in text:
        return 'b"' + text[2:-1] + '"'
    if isinstance(value, str) and text.startswith("'") and '"' not in value:
        return '"' + text[1:-1] + '"'
    if isinstance(value, tuple):
        inner = ", ".join(lit(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return text


def wrap(indent: int, head: str, args: list[str], tail: str) -> list[str]:
    """``head + args + tail`` on one line if it fits, else one argument per line.

    The exploded form ends with a trailing comma, which formatters keep as is.
    """
    one = " " * indent + head + ", ".join(args) + tail
    if len(one) <= LINE_LENGTH:
        return [one]
    pad = " " * (indent + 4)
    return [" " * indent + head] + [f"{pad}{a}," for a in args] + [" " * indent + tail]


def _pytype(fld: Field) -> str:
    return {
        "number": "int",
        "octets": "bytes",
        "chunk": "bytes",
        "frame": "bytes",
        "string": "str",
        "longstr": "str",
        "strings": "list[str]",
        "hash": "dict[str, str]",
        "uuid": "uuid.UUID",
        "msg": "list[bytes]",
        "headers": "tuple[tuple[str, str], ...]",
    }[fld.type]


def _default(fld: Field) -> str:
    """Source text of the dataclass default of a field."""
    fixed = fld.value if fld.value is not None else fld.default
    if fixed is not None:
        return repr(int(fixed, 0)) if fld.type == "number" else lit(fixed)
    return {
        "number": "0",
        "octets": lit(bytes(int(fld.size or 0))) if fld.length_ref is None else 'b""',
        "chunk": 'b""',
        "frame": 'b""',
        "string": '""',
        "longstr": '""',
        "strings": "field(default_factory=list)",
        "hash": "field(default_factory=dict)",
        "uuid": "_NIL_UUID",
        "msg": "field(default_factory=list)",
        "headers": "()",
    }[fld.type]


@dataclass
class Attr:
    """One attribute of a generated dataclass."""

    ident: str
    pytype: str
    default: str
    doc: str
    spec: tuple[str, int | None, object]  # kind, limit, constant for the validator


def attributes(msg: Message) -> list[Attr]:
    """Dataclass attributes of a message, in wire order (derived fields left out)."""
    limits = _length_limits(msg)
    out: list[Attr] = []
    for fld in msg.fields:
        if fld.derived:
            continue
        if fld.type == "bits":
            for bit in fld.bits:
                if bit.derived:
                    continue
                pytype = "bool" if bit.width == 1 and bit.value is None else "int"
                default = _bit_default(bit, pytype)
                out.append(
                    Attr(
                        bit.ident, pytype, default, bit.description, ("bit", bit.width, bit.value)
                    )
                )
            continue
        kind = fld.type
        limit: int | None = None
        const: object = None
        if fld.type == "number":
            limit = 8 if fld.size == VARLEN else int(fld.size or 1)
            const = None if fld.value is None else int(fld.value, 0)
        elif fld.type == "string":
            limit = 255 if fld.length_ref is None else limits[fld.ident]
            const = fld.value
        elif fld.type == "longstr":
            limit = 0xFFFFFFFF
            const = fld.value
        elif fld.type == "chunk":
            limit = 0xFFFFFFFF
        elif fld.type == "octets":
            if fld.length_ref is None:
                const = int(fld.size or 0)
            else:
                limit = limits[fld.ident]
        elif fld.type == "headers":
            limit = limits[fld.ident]
        out.append(
            Attr(fld.ident, _pytype(fld), _default(fld), fld.description, (kind, limit, const))
        )
    return out


def _bit_default(bit: Bit, pytype: str) -> str:
    fixed = bit.value if bit.value is not None else bit.default
    if pytype == "bool":
        return "True" if fixed else "False"
    return repr(fixed or 0)


def _length_limits(msg: Message) -> dict[str, int]:
    """Largest length each length-referencing field can have."""
    by_ident = {f.ident: f for f in msg.fields}
    out: dict[str, int] = {}
    for fld in msg.fields:
        if fld.length_ref is not None:
            ref = by_ident[fld.length_ref]
            size = 8 if ref.size == VARLEN else int(ref.size or 1)
            out[fld.ident] = (1 << (8 * size)) - 1
    return out


# ---------------------------------------------------------------------------
# source writer


@dataclass
class _Src:
    lines: list[str] = field(default_factory=list)
    level: int = 0

    def __call__(self, line: str = "") -> None:
        self.lines.append(("    " * self.level + line) if line else "")

    def wrapped(self, head: str, args: list[str], tail: str) -> None:
        for line in wrap(4 * self.level, head, args, tail):
            self.lines.append(line)

    def indent(self) -> None:
        self.level += 1

    def dedent(self) -> None:
        self.level -= 1


class _Structs:
    """Module-level struct.Struct constants, named after their format."""

    def __init__(self) -> None:
        self.formats: dict[str, str] = {}

    def name(self, fmt: str) -> str:
        if fmt not in self.formats:
            order = "BE" if fmt[0] == ">" else "LE"
            self.formats[fmt] = f"_{order}_{fmt[1:]}"
        return self.formats[fmt]


@dataclass
class _Item:
    """One piece of a message's first frame while encoding."""

    kind: str  # "struct" | "bytes"
    expr: str
    char: str = ""
    order: str | None = None  # None: byte order irrelevant (one octet)


#: A join() operand: (callee, arguments) for a struct pack, (expression, None) else.
_Operand = tuple[str, list[str] | None]


def _merge(items: list[_Item], structs: _Structs) -> list[_Operand]:
    """Turn items into join() operands, merging runs of struct items."""
    out: list[_Operand] = []
    run: list[_Item] = []
    run_order: str | None = None

    def flush() -> None:
        nonlocal run, run_order
        if run:
            fmt = _ORDER_PREFIX[run_order or "big"] + "".join(i.char for i in run)
            out.append((f"{structs.name(fmt)}.pack", [i.expr for i in run]))
        run, run_order = [], None

    for item in items:
        if item.kind == "struct":
            if item.order is not None and run_order is not None and item.order != run_order:
                flush()
            run.append(item)
            if item.order is not None:
                run_order = item.order
        else:
            flush()
            out.append((item.expr, None))
    flush()
    return out


def _emit(src: _Src, before: str, operand: _Operand, after: str) -> None:
    expr, args = operand
    if args is None:
        src(before + expr + after)
    else:
        src.wrapped(before + expr + "(", args, ")" + after)


class PythonGenerator:
    def __init__(self, proto: Protocol, source_name: str) -> None:
        self.proto = proto
        self.source_name = source_name
        self.structs = _Structs()
        self.classic = proto.dialect == "classic"

    # -- whole module ------------------------------------------------------

    def generate(self) -> str:
        body = _Src()
        for msg in self.proto.messages:
            self._dataclass(body, msg)
        union_names = [m.class_name for m in self.proto.messages]
        body("#: Any message of this protocol.")
        for line in _assign("Message", union_names, " | ", LINE_LENGTH):
            body(line)
        body()
        body()
        for msg in self.proto.messages:
            self._encoder(body, msg)
        for msg in self.proto.messages:
            if msg.literal is None:
                self._decoder(body, msg)
        self._api(body)
        return self._header() + "\n".join(body.lines).rstrip() + "\n"

    def _header(self) -> str:
        p = self.proto
        out = _Src()
        out(f"# Generated by zproto {__version__} from {self.source_name} (model {p.name!r}).")
        out("# DO NOT EDIT: change the model and run `zproto generate` (CI runs `zproto check`).")
        doc = p.title.strip()
        out(f'"""{doc}.' if not doc.endswith(".") else f'"""{doc}')
        out()
        if p.description:
            for line in p.description.replace('"""', "'''").replace("\\", "\\\\").splitlines():
                out(line)
            out()
        out("Generated codec: ``encode(msg) -> list[bytes]`` and ``decode(frames) -> msg``.")
        out("``decode`` raises only ``zproto.errors.DecodeError``; ``encode`` raises")
        out("``zproto.errors.EncodeError`` for an invalid message.")
        out('"""')
        out()
        out("from __future__ import annotations")
        out()
        imports = ["struct"]
        if any(f.type == "uuid" for m in p.messages for f in m.fields):
            imports.append("uuid")
        for mod in imports:
            out(f"import {mod}")
        needs_field = any(
            a.default.startswith("field(") for m in p.messages for a in attributes(m)
        )
        dc = "dataclass, field" if needs_field else "dataclass"
        out(f"from dataclasses import {dc}")
        if self.classic:
            out("from enum import IntEnum")
        typing = ["Any"]
        if self.classic:
            typing.append("ClassVar")
        if any(attributes(m) for m in p.messages):
            typing.append("Self")
        out(f"from typing import {', '.join(sorted(typing))}")
        out()
        out("from zproto import runtime as _rt")
        out("from zproto.errors import DecodeError, EncodeError")
        out()
        names = ["DecodeError", "EncodeError", "Message"]
        if self.classic:
            names.append("MessageId")
        names += [m.class_name for m in p.messages]
        names += ["decode", "encode"]
        names += [to_const_name(d.name) for d in p.defines]
        out("__all__ = [")
        for name in sorted(set(names), key=_isort_key):
            out(f'    "{name}",')
        out("]")
        out()
        for define in p.defines:
            value = define.value
            try:
                literal = repr(int(value, 0))
            except ValueError:
                literal = lit(value)
            out(f"{to_const_name(define.name)} = {literal}")
        if self.classic:
            out(f"SIGNATURE = {lit(p.signature_bytes)}")
        out(f"MODEL_NAME = {lit(p.name)}")
        if any(f.type == "uuid" for m in p.messages for f in m.fields):
            out("_NIL_UUID = uuid.UUID(int=0)")
        out("_new = object.__new__")
        out("_set = object.__setattr__")
        out()
        # struct constants are known only after the body was generated
        for fmt, name in sorted(self.structs.formats.items(), key=lambda kv: kv[1]):
            out(f"{name} = struct.Struct({lit(fmt)})")
        out('_U32 = struct.Struct(">I")')
        if self.classic:
            out()
            out()
            out("class MessageId(IntEnum):")
            out('    """Message ids on the wire."""')
            out()
            for msg in p.messages:
                out(f"    {to_const_name(msg.name)} = {msg.id}")
        out()
        out()
        return "\n".join(out.lines) + "\n"

    # -- dataclasses -------------------------------------------------------

    def _dataclass(self, src: _Src, msg: Message) -> None:
        attrs = attributes(msg)
        src("@dataclass(frozen=True, init=False)")
        src(f"class {msg.class_name}:")
        src.indent()
        doc = msg.description or msg.name
        lines = doc.replace('"""', "'''").replace("\\", "\\\\").splitlines()
        if len(lines) == 1:
            src(f'"""{lines[0]}"""')
        else:
            src(f'"""{lines[0]}')
            src()
            for line in lines[1:]:
                src(line)
            src('"""')
        src()
        if self.classic:
            src(f"ID: ClassVar[MessageId] = MessageId.{to_const_name(msg.name)}")
        for attr in attrs:
            comment = attr.doc.splitlines()[0] if attr.doc else ""
            line = f"{attr.ident}: {attr.pytype} = {attr.default}"
            if comment and len(line) + len(comment) + 8 <= 99:
                line += f"  # {comment}"
            src(line)
        if self.classic or attrs:
            src()
        if attrs:
            self._init(src, attrs)
            src("def replace(self, **changes: Any) -> Self:")
            src('    """A copy with some fields changed (fast; no validation until encode)."""')
            src("    if not changes.keys() <= self.__dict__.keys():")
            src('        raise TypeError(f"unknown fields: {set(changes) - set(self.__dict__)}")')
            src("    state = self.__dict__.copy()")
            src("    state.update(changes)")
            src("    copy = _new(type(self))")
            src('    _set(copy, "__dict__", state)')
            src("    return copy")
            src()
            src("__replace__ = replace")
            src()
        src("def encode(self) -> list[bytes]:")
        src('    """Encode into ZeroMQ frames."""')
        src(f"    return _encode_{msg.ident}(self)")
        src.dedent()
        src()
        src()
        # what the slow-path validator checks: (attribute, kind, limit, constant)
        entries = [lit((a.ident, a.spec[0], a.spec[1], a.spec[2])) for a in attrs]
        name = f"_SPEC_{to_const_name(msg.name)}: Any = "
        if len(entries) == 1:
            src.wrapped(name + "(", entries, ",)")
        elif entries:
            src(name + "(")
            for entry in entries:
                src(f"    {entry},")
            src(")")
        else:
            src(name + "()")
        src()
        src()

    def _init(self, src: _Src, attrs: list[Attr]) -> None:
        """``__init__`` storing every field with one ``__dict__`` assignment.

        A frozen dataclass's own ``__init__`` sets fields one by one through
        ``object.__setattr__``; this is about twice as fast and keeps the same
        signature (list/dict defaults are fresh objects per instance).
        """
        params = ["self"]
        values = []
        for attr in attrs:
            if attr.default.startswith("field(default_factory="):
                params.append(f"{attr.ident}: {attr.pytype} | None = None")
                fresh = _plain_default(attr.default)
                values.append(f"{fresh} if {attr.ident} is None else {attr.ident}")
            else:
                params.append(f"{attr.ident}: {attr.pytype} = {attr.default}")
                values.append(attr.ident)
        src.wrapped("def __init__(", params, ") -> None:")
        src.indent()
        entries = [f'"{a.ident}": {v}' for a, v in zip(attrs, values, strict=True)]
        src.wrapped("state = {", entries, "}")
        src('_set(self, "__dict__", state)')
        src.dedent()
        src()

    # -- encoders ----------------------------------------------------------

    def _encoder(self, src: _Src, msg: Message) -> None:
        cname, const = msg.class_name, to_const_name(msg.name)
        src(f"def _encode_{msg.ident}(m: {cname}) -> list[bytes]:")
        src.indent()
        if msg.literal is not None:
            src(f"return [{lit(msg.literal)}]")
            src.dedent()
            src()
            src()
            return
        if not msg.fields:
            src(f"return [{lit(self.proto.signature_bytes + bytes((msg.id or 0,)))}]")
            src.dedent()
            src()
            src()
            return
        src("try:")
        src.indent()
        prep: list[str] = []
        checks: list[str] = []
        sections: list[tuple[str | None, list[_Item]]] = [(None, [])]
        frames: list[str] = []
        if self.classic:
            sig = self.proto.signature_bytes
            for value in (sig[0], sig[1], msg.id or 0):
                sections[0][1].append(_Item("struct", f"0x{value:02X}", "B"))
        length_of: dict[str, str] = {}  # derived length field -> expression
        for fld in msg.fields:
            if fld.length_ref is not None:
                length_of[fld.length_ref] = f"len(v_{fld.ident})"
        for item in msg.items:  # flags first: the bit fields holding them come earlier
            if isinstance(item, Optional):
                present = " or ".join(self._nonempty(f) for f in item.fields if not f.derived)
                prep.append(f"{item.flag} = bool({present})")
        for item in msg.items:
            if isinstance(item, Optional):
                sections.append((item.flag, []))
                for fld in item.fields:
                    self._encode_field(fld, prep, checks, sections[-1][1], frames, length_of)
                sections.append((None, []))
            else:
                self._encode_field(item, prep, checks, sections[-1][1], frames, length_of)
        for line in prep:
            src(line)
        for group in _group_checks(checks, LINE_LENGTH - 4 * src.level - 4):
            src(f"if {group}:")
            src("    raise _rt.Invalid")
        head = _merge(sections[0][1], self.structs)
        if len(sections) == 1 and len(head) == 1 and head[0][1] is not None:
            first = "first"
            _emit(src, "first = ", head[0], "")
        else:
            src("p = [")
            src.indent()
            for operand in head:
                _emit(src, "", operand, ",")
            src.dedent()
            src("]")
            for cond, items in sections[1:]:
                operands = _merge(items, self.structs)
                if not operands:
                    continue
                if cond is not None:
                    src(f"if {cond}:")
                    src.indent()
                for operand in operands:
                    _emit(src, "p.append(", operand, ")")
                if cond is not None:
                    src.dedent()
            first = 'b"".join(p)'
        src.wrapped("return [", [first, *frames], "]")
        src.dedent()
        src("except _rt.ENCODE_FAILURES as exc:")
        src(f"    raise _rt.encode_failure(m, _SPEC_{const}, exc) from None")
        src.dedent()
        src()
        src()

    @staticmethod
    def _nonempty(fld: Field) -> str:
        if fld.type == "bits":
            parts = [f"m.{b.ident}" for b in fld.bits if not b.derived and b.value is None]
            return " or ".join(parts) or "False"
        if fld.type in ("number",):
            return f"m.{fld.ident} != {_default(fld)}"
        if fld.type == "uuid":
            return f"m.{fld.ident} != _NIL_UUID"
        if fld.type == "octets" and fld.length_ref is None:
            return f"any(m.{fld.ident})"
        return f"len(m.{fld.ident}) > 0"

    def _encode_field(
        self,
        fld: Field,
        prep: list[str],
        checks: list[str],
        items: list[_Item],
        frames: list[str],
        length_of: dict[str, str],
    ) -> None:
        ident, order = fld.ident, fld.byteorder
        attr = f"m.{ident}"
        if fld.type == "number":
            if fld.derived:
                expr = length_of[ident]
            elif fld.value is not None:
                checks.append(f"{attr} != {int(fld.value, 0)}")
                expr = attr
            else:
                expr = attr
            if fld.size == VARLEN:
                items.append(_Item("bytes", f"_rt.enc_varlen({expr}, {lit(order)})"))
            else:
                size = int(fld.size or 1)
                items.append(
                    _Item("struct", expr, _STRUCT_CHAR[size], order if size > 1 else None)
                )
        elif fld.type == "bits":
            total = int(fld.size or 1) * 8
            shift = total
            parts: list[str] = []
            for bit in fld.bits:
                shift -= bit.width
                if bit.derived:
                    source = bit.ident  # flag computed in prep (a bool)
                else:
                    source = f"m.{bit.ident}"
                    if bit.value is not None:
                        checks.append(f"{source} != {bit.value}")
                    else:
                        # nonzero when negative or too wide; also rejects 2 for a bool bit
                        checks.append(f"{source} >> {bit.width}")
                parts.append(f"{source} << {shift}" if shift else source)
            size = int(fld.size or 1)
            prep.extend(_assign(f"b_{ident}", parts, " | ", LINE_LENGTH - 8))
            items.append(
                _Item("struct", f"b_{ident}", _STRUCT_CHAR[size], order if size > 1 else None)
            )
        elif fld.type in ("string", "longstr"):
            prep.append(f"v_{ident} = {attr}.encode()")
            if fld.value is not None:
                checks.append(f"{attr} != {lit(fld.value)}")
            if fld.length_ref is None:
                char = "B" if fld.type == "string" else "I"
                items.append(
                    _Item("struct", f"len(v_{ident})", char, "big" if char == "I" else None)
                )
            items.append(_Item("bytes", f"v_{ident}"))
        elif fld.type == "chunk":
            items.append(_Item("struct", f"len({attr})", "I", "big"))
            items.append(_Item("bytes", attr))
        elif fld.type == "octets":
            if fld.length_ref is None:
                checks.append(f"len({attr}) != {int(fld.size or 0)}")
                items.append(_Item("bytes", attr))
            else:
                prep.append(f"v_{ident} = {attr}")
                items.append(_Item("bytes", f"v_{ident}"))
        elif fld.type == "uuid":
            items.append(_Item("bytes", f"{attr}.bytes"))
        elif fld.type == "strings":
            items.append(_Item("bytes", f"_rt.enc_strings({attr})"))
        elif fld.type == "hash":
            items.append(_Item("bytes", f"_rt.enc_hash({attr})"))
        elif fld.type == "headers":
            prep.append(f"v_{ident} = _rt.enc_headers({attr})")
            items.append(_Item("bytes", f"v_{ident}"))
        elif fld.type == "frame":
            frames.append(f"_rt.frame_out({attr})")
        elif fld.type == "msg":
            frames.append(f"*_rt.frames_out({attr})")
        else:  # pragma: no cover - the loader rejects unknown types
            raise AssertionError(fld.type)

    # -- decoders ----------------------------------------------------------

    def _decoder(self, src: _Src, msg: Message) -> None:
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
                    for attr in _attrs_of(fld):
                        src(f"{attr.ident} = {_plain_default(attr.default)}")
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
                ctx.add(ident, _STRUCT_CHAR[size], size, fld.byteorder if size > 1 else None)
            if fld.value is not None:
                ctx.after(
                    f"if {ident} != {int(fld.value, 0)}:",
                    f'    raise DecodeError(f"{what} must be {int(fld.value, 0)}, '
                    f'not {{{ident}}}")',
                )
        elif fld.type == "bits":
            size = int(fld.size or 1)
            raw = f"bits_{ident}"
            ctx.add(raw, _STRUCT_CHAR[size], size, fld.byteorder if size > 1 else None)
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

    # -- module API ----------------------------------------------------------

    def _api(self, src: _Src) -> None:
        p = self.proto
        src("_ENCODERS: dict[type, Any] = {")
        for msg in p.messages:
            src(f"    {msg.class_name}: _encode_{msg.ident},")
        src("}")
        src()
        src()
        src("def encode(msg: Message) -> list[bytes]:")
        src('    """Encode a message into ZeroMQ frames (raises EncodeError if invalid)."""')
        src("    encoder = _ENCODERS.get(type(msg))")
        src("    if encoder is None:")
        src('        raise EncodeError(f"not a {MODEL_NAME} message: {msg!r}")')
        src("    return encoder(msg)")
        src()
        src()
        literals = [m for m in p.messages if m.literal is not None]
        general = [m for m in p.messages if m.literal is None]
        if self.classic:
            src("_DECODERS: dict[int, Any] = {")
            for msg in p.messages:
                src(f"    {msg.id}: _decode_{msg.ident},")
            src("}")
            src()
            src()
        elif literals:
            src("_LITERALS: dict[bytes, Any] = {")
            for msg in literals:
                src(f"    {lit(msg.literal)}: {msg.class_name},")
            src("}")
            sizes = sorted({len(m.literal or b"") for m in literals})
            src(f"_LITERAL_SIZES = frozenset({{{', '.join(str(s) for s in sizes)}}})")
            src()
            src()
        src("def decode(frames: Any) -> Message:")
        src('    """Decode ZeroMQ frames (bytes-like) into a message.')
        src()
        src("    Raises DecodeError, and nothing else, on malformed input.")
        src('    """')
        src("    if not frames:")
        src('        raise DecodeError("no frames", signature_ok=False)')
        src("    try:")
        src("        buf = _rt.frame_bytes(frames[0])")
        src("    except TypeError:")
        src('        raise DecodeError("not bytes-like", signature_ok=False) from None')
        src.indent()
        if self.classic:
            sig = p.signature_bytes
            src(f"if len(buf) < 3 or buf[0] != {sig[0]} or buf[1] != {sig[1]}:")
            src('    raise DecodeError("bad signature", signature_ok=False)')
            src("decoder = _DECODERS.get(buf[2])")
            src("if decoder is None:")
            src('    raise DecodeError(f"unknown message id {buf[2]}", message_id=buf[2])')
            src("try:")
            src("    return decoder(buf, frames)")
            src("except DecodeError as exc:")
            src("    exc.message_id = buf[2]")
            src("    raise")
            src("except _rt.DECODE_FAILURES as exc:")
            src('    reason = f"malformed message {buf[2]}: {exc}"')
            src("    raise DecodeError(reason, message_id=buf[2]) from None")
        else:
            if literals:
                src("if len(buf) in _LITERAL_SIZES:")
                src("    literal = _LITERALS.get(buf)")
                src("    if literal is not None:")
                src("        if len(frames) != 1:")
                src('            raise DecodeError("unexpected extra frames")')
                src("        return literal()")
            if general:
                src("try:")
                src(f"    return _decode_{general[0].ident}(buf, frames)")
                src("except DecodeError:")
                src("    raise")
                src("except _rt.DECODE_FAILURES as exc:")
                src('    raise DecodeError(f"malformed frame: {exc}") from None')
            else:
                src('raise DecodeError("not a known literal message")')
        src.dedent()
        src()


def _isort_key(name: str) -> tuple[int, str]:
    """Order of ``__all__`` entries: CONSTANTS, then Classes, then functions."""
    if name.isupper():
        return (0, name)
    return (1 if name[:1].isupper() else 2, name)


def _assign(target: str, operands: list[str], op: str, width: int) -> list[str]:
    """``target = a op b op c`` laid out the way ``ruff format`` lays it out."""
    one = f"{target} = {op.join(operands)}"
    if len(one) <= width:
        return [one]
    if len(op.join(operands)) + 4 <= width:
        return [f"{target} = (", f"    {op.join(operands)}", ")"]
    sym = op.strip()
    return (
        [f"{target} = (", f"    {operands[0]}"] + [f"    {sym} {o}" for o in operands[1:]] + [")"]
    )


def _group_checks(checks: list[str], width: int) -> list[str]:
    """Join checks with ``or`` into as few lines as fit in ``width``."""
    groups: list[str] = []
    for check in checks:
        if groups and len(groups[-1]) + 4 + len(check) + 4 <= width:
            groups[-1] += f" or {check}"
        else:
            groups.append(check)
    return groups


def _plain_default(default: str) -> str:
    if default.startswith("field(default_factory="):
        return default[len("field(default_factory=") : -1] + "()"
    return default


def _attrs_of(fld: Field) -> list[Attr]:
    if fld.derived:
        return []
    if fld.type == "bits":
        out = []
        for bit in fld.bits:
            if bit.derived:
                continue
            pytype = "bool" if bit.width == 1 and bit.value is None else "int"
            default = _bit_default(bit, pytype)
            out.append(Attr(bit.ident, pytype, default, "", ("bit", bit.width, bit.value)))
        return out
    return [Attr(fld.ident, _pytype(fld), _default(fld), "", ("", None, None))]


class _DecodeCtx:
    """Tracks the read position and batches fixed-size fields into one struct."""

    def __init__(self, src: _Src, start: int, cname: str, structs: _Structs) -> None:
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
            fmt = _ORDER_PREFIX[self.run_order or "big"] + "".join(c for _, c in self.run)
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
