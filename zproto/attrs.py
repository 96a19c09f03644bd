"""The dataclass view of a message: its attributes, types and defaults.

Derived fields (lengths, flag bits) are computed by the codec and are not
attributes; ``bits`` fields contribute one attribute per named bit group.
"""

from __future__ import annotations

from dataclasses import dataclass

from zproto.model import VARLEN, Bit, Field, Message
from zproto.pysource import lit


def python_type(fld: Field) -> str:
    if fld.lazy:  # decoded as a ``zproto.runtime.EncodedHash``; any mapping is encoded
        return "Mapping[str, str]"
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


def default_source(fld: Field) -> str:
    """Source text of the dataclass default of a field."""
    fixed = fld.value if fld.value is not None else fld.default
    if fixed is not None:
        return repr(int(fixed, 0)) if fld.type == "number" else lit(fixed)
    if fld.type == "octets":
        return lit(bytes(int(fld.size or 0))) if fld.length_ref is None else 'b""'
    return {
        "number": "0",
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
    limits = length_limits(msg)
    out: list[Attr] = []
    for fld in msg.fields:
        if fld.derived:
            continue
        if fld.type == "bits":
            for bit in fld.bits:
                if bit.derived:
                    continue
                pytype = "bool" if bit.width == 1 and bit.value is None else "int"
                default = bit_default(bit, pytype)
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
            Attr(
                fld.ident,
                python_type(fld),
                default_source(fld),
                fld.description,
                (kind, limit, const),
            )
        )
    return out


def twin_name(msg: Message) -> str:
    """The slotted class a message's fields live in (``_NomSlots`` for ``Nom``): a
    leading underscore, so never the class of another message."""
    return f"_{msg.class_name}Slots"


def bit_default(bit: Bit, pytype: str) -> str:
    fixed = bit.value if bit.value is not None else bit.default
    if pytype == "bool":
        return "True" if fixed else "False"
    return repr(fixed or 0)


def length_limits(msg: Message) -> dict[str, int]:
    """Largest length each length-referencing field can have."""
    by_ident = {f.ident: f for f in msg.fields}
    out: dict[str, int] = {}
    for fld in msg.fields:
        if fld.length_ref is not None:
            ref = by_ident[fld.length_ref]
            size = 8 if ref.size == VARLEN else int(ref.size or 1)
            out[fld.ident] = (1 << (8 * size)) - 1
    return out


def plain_default(default: str) -> str:
    """A ``field(default_factory=X)`` default as the expression ``X()``."""
    if default.startswith("field(default_factory="):
        return default[len("field(default_factory=") : -1] + "()"
    return default


def attrs_of(fld: Field) -> list[Attr]:
    """The attributes one field contributes (none when derived)."""
    if fld.derived:
        return []
    if fld.type == "bits":
        out = []
        for bit in fld.bits:
            if bit.derived:
                continue
            pytype = "bool" if bit.width == 1 and bit.value is None else "int"
            default = bit_default(bit, pytype)
            out.append(Attr(bit.ident, pytype, default, "", ("bit", bit.width, bit.value)))
        return out
    return [Attr(fld.ident, python_type(fld), default_source(fld), "", ("", None, None))]
