"""Emit ``peek_<field>(data)``: a leading string field of a binary frame, read on its own.

A protocol answering a frame that failed to decode still wants what it can read of it
(TMQP echoes the message id in its error reply).  A peek function reads only the octets
in front of its field: the fixed-size fields, ``varlen`` numbers and earlier
length-prefixed strings it has to step over, and the length fields it needs.  It never
raises: a frame too short for the field, or a field that is not UTF-8, gives None.

Peekable fields are the ``string`` fields of a binary model's general message that no
optional section, header block or other variable structure precedes.  Classic models
have no peek functions (their layout depends on the message id).
"""

from __future__ import annotations

from zproto.model import VARLEN, Field, Message, Optional
from zproto.pysource import ORDER_PREFIX, STRUCT_CHAR, Source, StructNames, lit

__all__ = ["PeekWriter", "peekable"]

#: Field types a peek can step over (their size is known from what precedes them).
_STEP = {"number", "bits", "octets", "string"}


def peekable(msg: Message) -> list[Field]:
    """The string fields of ``msg`` a peek function can read, in wire order."""
    out: list[Field] = []
    for item in msg.items:
        if isinstance(item, Optional) or item.type not in _STEP:
            break
        if item.type == "octets" and item.length_ref is None and item.size is None:
            break
        if item.type == "string":
            out.append(item)
    return out


class PeekWriter:
    """Writes one ``peek_<field>`` function per peekable field of a binary message."""

    def __init__(self, structs: StructNames) -> None:
        self.structs = structs

    def write(self, src: Source, msg: Message) -> list[str]:
        """Emit the peek functions of ``msg``; return their names."""
        names = []
        for target in peekable(msg):
            self._write(src, msg, target)
            names.append(f"peek_{target.ident}")
        return names

    def _write(self, src: Source, msg: Message, target: Field) -> None:
        before: list[Field] = []
        for item in msg.items:
            assert isinstance(item, Field)  # peekable() stopped before any section
            if item is target:
                break
            before.append(item)
        needed = {f.length_ref for f in (*before, target) if f.length_ref is not None}
        src(f"def peek_{target.ident}(data: Any) -> str | None:")
        src.indent()
        src(f'"""``{target.ident}`` of a {msg.class_name}, read even when the frame does not')
        src("decode as a whole: None when the frame is too short for it or the field is")
        src('not UTF-8."""')
        src("try:")
        src.indent()
        src("buf = data if type(data) is bytes else _rt.frame_bytes(data)")
        pos = "0"  # expression of the current offset
        offset = 0  # constant added to pos
        for fld in before:
            here = pos if not offset else (str(offset) if pos == "0" else f"{pos} + {offset}")
            if fld.type == "number" and fld.size == VARLEN:
                value = f"f_{fld.ident}" if fld.ident in needed else "_"
                src(f"{value}, pos = _rt.dec_varlen(buf, {here}, {lit(fld.byteorder)})")
                pos, offset = "pos", 0
            elif fld.type in ("number", "bits") or (
                fld.type == "octets" and fld.length_ref is None
            ):
                size = int(fld.size or 0)
                if fld.ident in needed and size == 1:
                    src(f"f_{fld.ident} = buf[{here}]")
                elif fld.ident in needed:
                    char = STRUCT_CHAR[size]
                    fmt = ORDER_PREFIX[fld.byteorder if size > 1 else "big"] + char
                    src(f"(f_{fld.ident},) = {self.structs.name(fmt)}.unpack_from(buf, {here})")
                offset += size
            else:  # a string (or octets) sized by an earlier field: step over it
                src(f"pos = {here} + {self._length(fld, here)}")
                pos, offset = "pos", 0
        start = pos if not offset else (str(offset) if pos == "0" else f"{pos} + {offset}")
        if target.length_ref is not None:
            src(f"end = {start} + f_{target.length_ref}")
            body = start
        else:
            src(f"end = {start} + 1 + buf[{start}]")
            body = f"{start} + 1"
        src("if end > len(buf):")
        src("    return None")
        simple = body.isidentifier() or body.isdigit()
        sliced = f"buf[{body}:end]" if simple else f"buf[{body} : end]"
        src(f"return {sliced}.decode()")
        src.dedent()
        src("except _rt.PEEK_FAILURES:")
        src("    return None")
        src.dedent()
        src()
        src()

    @staticmethod
    def _length(fld: Field, here: str) -> str:
        if fld.length_ref is not None:
            return f"f_{fld.length_ref}"
        return f"1 + buf[{here}]"  # a 1-octet-length string
