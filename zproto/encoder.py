"""Emit the encoder of one message: a fast path plus a validator on failure.

Fixed-size fields merge into one ``struct`` pack per run; strings are encoded
once up front (their lengths feed length fields); optional sections are appended
when their flag is set.  Any exception on the fast path hands the message to
``zproto.runtime.encode_failure``, which names the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass

from zproto.attrs import default_source
from zproto.model import VARLEN, Field, Message, Optional, Protocol, to_const_name
from zproto.pysource import (
    LINE_LENGTH,
    ORDER_PREFIX,
    STRUCT_CHAR,
    Source,
    StructNames,
    assign,
    group_checks,
    lit,
)


@dataclass
class _Item:
    """One piece of a message's first frame while encoding."""

    kind: str  # "struct" | "bytes"
    expr: str
    char: str = ""
    order: str | None = None  # None: byte order irrelevant (one octet)


#: A join() operand: (callee, arguments) for a struct pack, (expression, None) else.
_Operand = tuple[str, list[str] | None]


def _merge(items: list[_Item], structs: StructNames) -> list[_Operand]:
    """Turn items into join() operands, merging runs of struct items."""
    out: list[_Operand] = []
    run: list[_Item] = []
    run_order: str | None = None

    def flush() -> None:
        nonlocal run, run_order
        if run:
            fmt = ORDER_PREFIX[run_order or "big"] + "".join(i.char for i in run)
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


def _emit(src: Source, before: str, operand: _Operand, after: str) -> None:
    expr, args = operand
    if args is None:
        src(before + expr + after)
    else:
        src.wrapped(before + expr + "(", args, ")" + after)


class EncoderWriter:
    """Writes ``_encode_<message>`` functions into a module being generated."""

    def __init__(self, proto: Protocol, structs: StructNames) -> None:
        self.proto = proto
        self.structs = structs
        self.classic = proto.dialect == "classic"

    def write(self, src: Source, msg: Message) -> None:
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
        for group in group_checks(checks, LINE_LENGTH - 4 * src.level - 4):
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
            return f"m.{fld.ident} != {default_source(fld)}"
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
                items.append(_Item("struct", expr, STRUCT_CHAR[size], order if size > 1 else None))
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
            prep.extend(assign(f"b_{ident}", parts, " | ", LINE_LENGTH - 8))
            items.append(
                _Item("struct", f"b_{ident}", STRUCT_CHAR[size], order if size > 1 else None)
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
