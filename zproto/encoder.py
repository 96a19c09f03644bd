"""Emit the encoders of one message: a fast path plus a validator on failure.

Each message gets two encoders built from one template:

* ``_encode_<message>(m)`` encodes a message object (what ``encode()`` calls);
* ``encode_<message>(field=..., ...)`` encodes the same message from its field values
  without building the object (the hot path of a sender; same signature and defaults
  as the class, same octets and the same ``EncodeError`` as ``encode(Class(...))``).

A message whose only frame ends with a ``chunk`` (outside any optional section) also
gets ``encode_<message>_head(<chunk>_size, field=..., ...) -> bytes``: the frame's octets
before the chunk's content, its 4-octet length saying ``<chunk>_size``.  The head and
``<chunk>_size`` octets of content are the frame ``encode`` makes: a sender reads a
file chunk straight into a buffer behind the head and sends that buffer, the chunk
never copied into a joined frame.

A ``<sender>`` gets ``encode_<sender>_sender(fixed fields)``: the template's
preparations and checks that read only the fixed fields run once there, the rest in the
``encode(varying fields)`` it gives (same octets and errors as ``encode_<message>``).

Fixed-size fields merge into one ``struct`` pack per run; strings are encoded once up
front (their lengths feed length fields); an optional section is prepared and appended
only when its flag is set; a one-octet variable length is a table look-up.  Any
exception on the fast path hands the message to ``zproto.runtime.encode_failure``,
which names the offending field.

Local names: every name the template makes up starts with ``_`` followed by a letter,
which no field identifier can (``to_ident`` only makes ``_<digit>...``), so a field may
be called ``p``, ``first`` or ``exc``.  Field values of the keyword encoder are its
parameters: one that shadows a builtin the template calls makes the keyword encoder
build the object and encode that instead (correct, only slower).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from zproto.attrs import Attr, attributes, default_source, plain_default
from zproto.model import VARLEN, Field, Message, Optional, Protocol, Sender, to_const_name
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
from zproto.shape import Plan, plan_fast

#: Builtins the encoder template calls: a parameter with one of these names would hide it.
_BUILTINS_USED = frozenset({"len", "bool", "any"})


@dataclass
class _Item:
    """One piece of a message's first frame while encoding."""

    kind: str  # "struct" | "bytes"
    expr: str
    char: str = ""
    order: str | None = None  # None: byte order irrelevant (one octet)
    into: str | None = None  # appends itself to the buffer ``_b`` (no copy of its own)


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


@dataclass
class _Section:
    """The items of the frame guarded by one flag (None: always present).

    ``late`` lines run after ``prep``: variable lengths of fields prepared there.
    """

    flag: str | None
    prep: list[str]
    items: list[_Item]
    late: list[str]


def head_chunk(msg: Message) -> Field | None:
    """The chunk field that ends ``msg``'s only frame (outside any optional section),
    when ``msg`` gets a head encoder: None when it has none (see the module text)."""
    if msg.literal is not None or not msg.items:
        return None
    last = msg.items[-1]
    if isinstance(last, Optional) or last.type != "chunk":
        return None
    if any(fld.type in ("frame", "msg") for fld in msg.fields):
        return None
    idents = {attr.ident for attr in attributes(msg)}
    if f"{last.ident}_size" in idents or idents & _BUILTINS_USED:
        return None  # (a field holds that name, or hides a builtin: no head encoder)
    return last


@dataclass
class _Hoisted:
    """A sender's preparations and checks that read only its fixed fields (and earlier
    such preparations): done once, by the function that makes its encoder."""

    lines: list[str]
    checks: list[str]

    def take(
        self, fixed: frozenset[str], attrs: list[Attr], lines: list[str], checks: list[str]
    ) -> tuple[list[str], list[str], list[str]]:
        """Move what reads only ``fixed`` here; the preparations and the checks left
        (a preparation made of several lines, or anything that does not parse alone,
        stays)."""
        local = {a.ident for a in attrs}
        assigned: list[set[str]] = []
        for line in lines:
            tree = _parse(line, "exec")
            targets = set() if tree is None else _names(tree, ast.Store)
            assigned.append(targets)
            local |= targets
        known = set(fixed)
        kept: list[str] = []
        for line, targets in zip(lines, assigned, strict=True):
            tree = _parse(line, "exec")
            if tree is not None and targets and (_names(tree, ast.Load) & local) <= known:
                self.lines.append(line)
                known |= targets
            else:
                kept.append(line)
        left: list[str] = []
        for check in checks:
            tree = _parse(check, "eval")
            if tree is not None and (_names(tree, ast.Load) & local) <= known:
                self.checks.append(check)
            else:
                left.append(check)
        return kept, [], left


def _keyword_params(attrs: list[Attr]) -> tuple[list[str], list[str]]:
    """Keyword parameters with the class's defaults for ``attrs``, and the fields whose
    default is made fresh per call (their parameter defaults to None)."""
    params: list[str] = []
    fresh: list[str] = []
    for attr in attrs:
        if attr.default.startswith("field(default_factory="):
            params.append(f"{attr.ident}: {attr.pytype} | None = None")
            fresh.append(attr.ident)
        else:
            params.append(f"{attr.ident}: {attr.pytype} = {attr.default}")
    return params, fresh


def _fill_fresh(src: Source, attrs: list[Attr], fresh: list[str]) -> None:
    """Statements giving each ``fresh`` parameter left None its class default."""
    for ident in fresh:
        default = next(a.default for a in attrs if a.ident == ident)
        src(f"if {ident} is None:")
        src(f"    {ident} = {plain_default(default)}")


def _parse(text: str, mode: str) -> ast.AST | None:
    try:
        return ast.parse(text, mode=mode)
    except SyntaxError:
        return None


def _names(tree: ast.AST, ctx: type[ast.expr_context]) -> set[str]:
    """The names ``tree`` stores (``ast.Store``) or reads (``ast.Load``)."""
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


class EncoderWriter:
    """Writes ``_encode_<message>`` and ``encode_<message>`` into a generated module."""

    def __init__(self, proto: Protocol, structs: StructNames, *, fast: bool = True) -> None:
        self.proto = proto
        self.structs = structs
        self.classic = proto.dialect == "classic"
        self.fast = fast
        #: modules-level helpers the generated code needs (name -> definition)
        self.helpers: dict[str, str] = {}
        #: while writing a head encoder: the chunk field left out (its size a parameter)
        self.head_of: Field | None = None

    # -- the two entry points ----------------------------------------------

    def write(self, src: Source, msg: Message) -> None:
        """``_encode_<message>(m)``: encode a message object."""
        src(f"def _encode_{msg.ident}(m: {msg.class_name}) -> list[bytes]:")
        src.indent()
        self._body(src, msg, lambda ident: f"m.{ident}", "m")
        src.dedent()
        src()
        src()

    def write_head(self, src: Source, msg: Message) -> None:
        """``encode_<message>_head(<chunk>_size, ...)``: the frame before the chunk's
        content (only for a message ``head_chunk`` accepts)."""
        chunk = head_chunk(msg)
        if chunk is None:
            return
        size = f"{chunk.ident}_size"
        attrs = [a for a in attributes(msg) if a.ident != chunk.ident]
        params, fresh = _keyword_params(attrs)
        params.insert(0, f"{size}: int")
        src.wrapped(f"def encode_{msg.ident}_head(", params, ") -> bytes:")
        src.indent()
        src(f'"""The frame of ``encode({msg.class_name}(...))`` before the content of its')
        src(f"{size} octets of ``{chunk.ident}`` (the frame is this head + that content).")
        src('"""')
        # the object the validator names a bad field in (its chunk empty: the size is
        # checked here, the content is the caller's)
        values = [a.ident if a.ident != chunk.ident else 'b""' for a in attributes(msg)]
        build = f"{msg.class_name}({', '.join(values)})"
        src(f"if {size} >> 32:  # (negative, or more than the 4-octet length holds)")
        text = f'f"{msg.class_name}.{chunk.ident}: size {{{size}}} is out of range"'
        one = f"    raise EncodeError({text})"
        if len(one) + 4 * src.level <= LINE_LENGTH:
            src(one)
        else:
            src("    raise EncodeError(")
            src(f"        {text}")
            src("    )")
        _fill_fresh(src, attrs, fresh)
        self.head_of = chunk
        try:
            self._body(src, msg, lambda ident: ident, build)
        finally:
            self.head_of = None
        src.dedent()
        src()
        src()

    def write_fields(self, src: Source, msg: Message) -> None:
        """``encode_<message>(...)``: encode from field values, no object built."""
        attrs = attributes(msg)
        params, fresh = _keyword_params(attrs)
        if params:
            src.wrapped(f"def encode_{msg.ident}(", params, ") -> list[bytes]:")
        else:
            src(f"def encode_{msg.ident}() -> list[bytes]:")
        src.indent()
        src(f'"""``encode({msg.class_name}(...))`` without building the message."""')
        build = f"{msg.class_name}({', '.join(a.ident for a in attrs)})"
        if any(a.ident in _BUILTINS_USED for a in attrs):
            one = f"return _encode_{msg.ident}({build})"
            if len(one) + 4 * src.level <= LINE_LENGTH:
                src(one)
            else:
                src(f"return _encode_{msg.ident}(")
                src.indent()
                src.wrapped(f"{msg.class_name}(", [a.ident for a in attrs], ")")
                src.dedent()
                src(")")
        else:
            _fill_fresh(src, attrs, fresh)
            self._body(src, msg, lambda ident: ident, build)
        src.dedent()
        src()
        src()

    def write_sender(self, src: Source, msg: Message, sender: Sender) -> None:
        """``encode_<sender>_sender(fixed fields...)``: checks the fields that stay the
        same once and gives ``encode(varying fields...)`` (positional, in the sender's
        order), whose frames are those of ``encode_<message>`` with all the fields."""
        attrs = attributes(msg)
        by_ident = {a.ident: a for a in attrs}
        varying = [by_ident[ident] for ident in sender.fields]
        fixed = [a for a in attrs if a.ident not in sender.fields]
        if any(a.ident in _BUILTINS_USED for a in attrs):
            raise ValueError(f"sender {sender.name}: a field shadows a builtin the encoder calls")
        params, fresh = _keyword_params(fixed)
        kinds = ", ".join(a.pytype for a in varying)
        gives = f") -> Callable[[{kinds}], list[bytes]]:"
        src.wrapped(f"def encode_{sender.ident}_sender(", ["*", *params] if params else [], gives)
        src.indent()
        text = sender.description or f"The encoder of a sender of {msg.class_name} frames."
        lines = text.splitlines()
        src('"""' + lines[0])
        for line in lines[1:]:
            src(line)
        src()
        src(f"``encode({', '.join(a.ident for a in varying)})`` gives the frames of")
        src(f"``encode_{msg.ident}(...)`` with these fields and those, and raises its errors;")
        src("the fields given here are checked once, where they can be alone (an")
        src("``EncodeError`` here names the bad one).")
        src('"""')
        _fill_fresh(src, fixed, fresh)
        body = Source(level=src.level + 1)
        build = f"{msg.class_name}({', '.join(a.ident for a in attrs)})"
        self._body(body, msg, lambda ident: ident, build, frozenset(a.ident for a in fixed))
        hoisted = self.hoisted
        if hoisted.lines or hoisted.checks:
            # the object the validator names a bad fixed field in: the varying at defaults
            probe = [a.ident if a in fixed else plain_default(a.default) for a in attrs]
            src("try:")
            src.indent()
            for line in hoisted.lines:
                src(line)
            for group in group_checks(hoisted.checks, LINE_LENGTH - 4 * src.level - 4):
                src(f"if {group}:")
                src("    raise _rt.Invalid")
            src.dedent()
            src("except _rt.ENCODE_FAILURES as _exc:")
            src.indent()
            src("raise _rt.encode_failure(")
            src.indent()
            src.wrapped(f"{msg.class_name}(", probe, "),")
            src(f"_SPEC_{to_const_name(msg.name)},")
            src("_exc,")
            src.dedent()
            src(") from None")
            src.dedent()
        src()
        args = [f"{a.ident}: {a.pytype}" for a in varying]
        src.wrapped("def encode(", args, ") -> list[bytes]:")
        src.lines.extend(body.lines)
        src()
        src("return encode")
        src.dedent()
        src()
        src()

    # -- the shared template -----------------------------------------------

    def _body(
        self,
        src: Source,
        msg: Message,
        value: Callable[[str], str],
        obj: str,
        fixed: frozenset[str] | None = None,
    ) -> None:
        """Statements encoding ``msg`` whose field ``x`` is the expression ``value(x)``;
        ``obj`` is the message object handed to the validator on failure.  ``fixed``
        (a sender's fields that do not change): the preparations and checks that read
        nothing else are left out and kept in ``self.hoisted`` (see ``write_sender``)."""
        const = to_const_name(msg.name)
        if msg.literal is not None:
            src(f"return [{lit(msg.literal)}]")
            return
        if not msg.fields:
            src(f"return [{lit(self.proto.signature_bytes + bytes((msg.id or 0,)))}]")
            return
        self.value = value
        self.varlens = 0
        self.flags: list[str] = []  # optional sections' flags
        self.short: list[str] = []  # "the variable length takes one octet" conditions
        self.wide: list[str] = []  # "... takes three octets" (253, then two) conditions
        self.head_expr: dict[str, str] = {}  # fast head target -> value to pack
        src("try:")
        src.indent()
        prep: list[str] = []
        checks: list[str] = []
        late: list[str] = []
        sections = [_Section(None, prep, [], late)]
        frames: list[str] = []
        if self.classic:
            sig = self.proto.signature_bytes
            for octet in (sig[0], sig[1], msg.id or 0):
                sections[0].items.append(_Item("struct", f"0x{octet:02X}", "B"))
        length_of: dict[str, str] = {}  # derived length field -> expression
        for fld in msg.fields:
            if fld.length_ref is not None:
                length_of[fld.length_ref] = f"len(_v_{fld.ident})"
        for item in msg.items:  # flags first: the bit fields holding them come earlier
            if isinstance(item, Optional):
                present = [f for f in item.fields if not f.derived]
                test = " or ".join(self._nonempty(f) for f in present)
                if len(present) != 1 or present[0].type == "bits":
                    test = f"bool({test})"  # a single comparison is a bool already
                prep.append(f"_f_{item.flag} = {test}")
        for item in msg.items:
            if isinstance(item, Optional):
                section = _Section(f"_f_{item.flag}", [], [], [])
                self.flags.append(section.flag or "")
                sections.append(section)
                for fld in item.fields:
                    self._field(fld, section, checks, frames, length_of)
                sections.append(_Section(None, prep, [], late))
            else:
                self._field(item, sections[-1], checks, frames, length_of)
        self.hoisted = _Hoisted([], [])
        if fixed is not None:
            prep, late, checks = self.hoisted.take(fixed, attributes(msg), prep + late, checks)
        for line in prep + late:
            src(line)
        for group in group_checks(checks, LINE_LENGTH - 4 * src.level - 4):
            src(f"if {group}:")
            src("    raise _rt.Invalid")
        # a hash appends itself to one buffer; not beside a chunk (join() sizes the
        # frame once: a growing buffer would move a big chunk as it grows)
        grow = any(item.into for section in sections for item in section.items)
        grow = grow and not any(fld.type == "chunk" for fld in msg.fields)
        fast = self.fast and not self.classic and not grow and self.head_of is None
        plan = plan_fast(msg) if fast else None
        if plan is not None:
            self._simplest(src, plan)
            # and with every variable length in its three-octet form (a 4 KiB payload)
            wide = plan_fast(msg, wide=True) if self.wide else None
            if wide is not None:
                self._simplest(src, wide, self.wide)
        head = _merge(sections[0].items, self.structs)
        if grow:
            first = self._grow(src, sections)
        elif len(sections) == 1 and len(head) == 1 and head[0][1] is not None:
            first = "_first"
            _emit(src, "_first = ", head[0], "")
        else:
            src("_p = [")
            src.indent()
            for operand in head:
                _emit(src, "", operand, ",")
            src.dedent()
            src("]")
            for section in sections[1:]:
                operands = _merge(section.items, self.structs)
                if not operands:
                    continue
                if section.flag is not None:
                    src(f"if {section.flag}:")
                    src.indent()
                if section.flag is not None:
                    for line in section.prep + section.late:
                        src(line)
                for operand in operands:
                    _emit(src, "_p.append(", operand, ")")
                if section.flag is not None:
                    src.dedent()
            first = 'b"".join(_p)'
        if self.head_of is not None:
            src(f"return {first}")
        else:
            src.wrapped("return [", [first, *frames], "]")
        src.dedent()
        src("except _rt.ENCODE_FAILURES as _exc:")
        src.indent()
        args = [obj, f"_SPEC_{const}", "_exc"]
        one = f"raise _rt.encode_failure({', '.join(args)}) from None"
        if len(one) + 4 * src.level <= LINE_LENGTH:
            src(one)
        else:
            src("raise _rt.encode_failure(")
            src.indent()
            callee, _, rest = obj.partition("(")
            if "(" in obj and len(obj) + 1 + 4 * src.level > LINE_LENGTH:
                src.wrapped(callee + "(", rest[:-1].split(", "), "),")
            else:
                src(obj + ",")
            src(f"_SPEC_{const},")
            src("_exc,")
            src.dedent()
            src(") from None")
        src.dedent()

    def _grow(self, src: Source, sections: list[_Section]) -> str:
        """The frame built in one growing buffer ``_b`` (a message with a hash field:
        the field appends itself, so a big hash is never held twice); returns the
        frame's expression."""
        src("_b = bytearray()")
        for section in sections:
            if not section.items:
                continue
            if section.flag is not None:
                src(f"if {section.flag}:")
                src.indent()
                for line in section.prep + section.late:
                    src(line)
            run: list[_Item] = []  # pieces merged and appended before the next hash
            for item in section.items:
                if item.into is None:
                    run.append(item)
                    continue
                for operand in _merge(run, self.structs):
                    _emit(src, "_b += ", operand, "")
                run = []
                src(item.into)
            for operand in _merge(run, self.structs):
                _emit(src, "_b += ", operand, "")
            if section.flag is not None:
                src.dedent()
        return "_rt.frame_of(_b)"

    def _simplest(self, src: Source, plan: Plan, lengths: list[str] | None = None) -> None:
        """The message in its simplest shape (no optional section, one-octet variable
        lengths, or the three-octet ones: ``lengths`` their conditions, ``plan`` from
        ``plan_fast(wide=True)``): one ``struct`` for the head, as the fast decoder
        reads it."""
        tests = [f"not {flag}" for flag in self.flags]
        tests += self.short if lengths is None else lengths
        wide = lengths is not None  # (its length markers are the plan's constants)
        fixed = {target: str(value) for target, value in plan.constants if wide}
        args = [fixed.get(target) or self.head_expr[target] for target, _, _ in plan.head]
        name = self.structs.name(plan.format())
        parts = [f"{name}.pack(__ARGS__)"] + [f"_v_{f.ident}" for f in plan.tail]
        src(f"if {' and '.join(tests)}:")
        src.indent()
        one = f'return [b"".join(({", ".join(parts)}))]'.replace("__ARGS__", ", ".join(args))
        if len(one) + 4 * src.level <= LINE_LENGTH:
            src(one)
        else:
            src("return [")
            src.indent()
            src('b"".join(')
            src.indent()
            src("(")
            src.indent()
            src.wrapped(f"{name}.pack(", args, "),")
            for part in parts[1:]:
                src(f"{part},")
            src.dedent()
            src(")")
            src.dedent()
            src(")")
            src.dedent()
            src("]")
        src.dedent()

    def _nonempty(self, fld: Field) -> str:
        """A condition true when an optional field holds something to send."""
        attr = self.value(fld.ident)
        if fld.type == "bits":
            parts = [self.value(b.ident) for b in fld.bits if not b.derived and b.value is None]
            return " or ".join(parts) or "False"
        if fld.type in ("number",):
            return f"{attr} != {default_source(fld)}"
        if fld.type == "uuid":
            return f"{attr} != _NIL_UUID"
        if fld.type == "octets" and fld.length_ref is None:
            return f"any({attr})"
        return f"len({attr}) > 0"

    def _varlen(self, section: _Section, expr: str, order: str, derived: bool) -> str:
        """One octet below 253 (a table look-up), else the runtime's long forms.

        The value is computed once, after the fields it may measure were prepared.
        """
        self.helpers["_OCTET"] = "_rt.OCTET"
        name = f"_n{self.varlens}"
        self.varlens += 1
        section.late.append(f"{name} = {expr}")
        low = f"{name} < 253" if derived else f"0 <= {name} < 253"
        self.short.append(low)
        self.wide.append(f"253 <= {name} < 65536")
        return f"_OCTET[{name}] if {low} else _rt.enc_varlen({name}, {lit(order)})"

    def _field(
        self,
        fld: Field,
        section: _Section,
        checks: list[str],
        frames: list[str],
        length_of: dict[str, str],
    ) -> None:
        prep, items = section.prep, section.items
        ident, order = fld.ident, fld.byteorder
        attr = self.value(ident)
        if fld.type == "number":
            if fld.derived:
                expr = length_of[ident]
            elif fld.value is not None:
                checks.append(f"{attr} != {int(fld.value, 0)}")
                expr = attr
            else:
                expr = attr
            if fld.size == VARLEN:
                items.append(_Item("bytes", self._varlen(section, expr, order, fld.derived)))
                self.head_expr[f"f_{ident}"] = f"_n{self.varlens - 1}"
            else:
                self.head_expr[f"f_{ident}"] = expr
                size = int(fld.size or 1)
                items.append(_Item("struct", expr, STRUCT_CHAR[size], order if size > 1 else None))
        elif fld.type == "bits":
            total = int(fld.size or 1) * 8
            shift = total
            parts: list[str] = []
            by_width: dict[int, list[str]] = {}
            for bit in fld.bits:
                shift -= bit.width
                if bit.derived:
                    source = f"_f_{bit.ident}"  # flag computed in prep (a bool)
                else:
                    source = self.value(bit.ident)
                    if bit.value is not None:
                        checks.append(f"{source} != {bit.value}")
                    else:
                        by_width.setdefault(bit.width, []).append(source)
                parts.append(f"{source} << {shift}" if shift else source)
            # nonzero when a value is negative or too wide (also rejects 2 for a bool bit)
            for width, sources in by_width.items():
                joined = sources[0] if len(sources) == 1 else f"({' | '.join(sources)})"
                checks.append(f"{joined} >> {width}")
            size = int(fld.size or 1)
            self.head_expr[f"bits_{ident}"] = f"_b_{ident}"
            prep.extend(assign(f"_b_{ident}", parts, " | ", LINE_LENGTH - 8))
            items.append(
                _Item("struct", f"_b_{ident}", STRUCT_CHAR[size], order if size > 1 else None)
            )
        elif fld.type in ("string", "longstr"):
            prep.append(f"_v_{ident} = {attr}.encode()")
            if fld.value is not None:
                checks.append(f"{attr} != {lit(fld.value)}")
            if fld.length_ref is None:
                char = "B" if fld.type == "string" else "I"
                items.append(
                    _Item("struct", f"len(_v_{ident})", char, "big" if char == "I" else None)
                )
            items.append(_Item("bytes", f"_v_{ident}"))
        elif fld.type == "chunk" and fld is self.head_of:  # the head ends with its length
            items.append(_Item("struct", f"{ident}_size", "I", "big"))
        elif fld.type == "chunk":
            items.append(_Item("struct", f"len({attr})", "I", "big"))
            items.append(_Item("bytes", attr))
        elif fld.type == "octets":
            if fld.length_ref is None:
                checks.append(f"len({attr}) != {int(fld.size or 0)}")
                items.append(_Item("bytes", attr))
            else:
                prep.append(f"_v_{ident} = {attr}")
                items.append(_Item("bytes", f"_v_{ident}"))
        elif fld.type == "uuid":
            items.append(_Item("bytes", f"{attr}.bytes"))
        elif fld.type == "strings":
            items.append(_Item("bytes", f"_rt.enc_strings({attr})"))
        elif fld.type == "hash":
            into = f"_rt.enc_hash_into(_b, {attr})"
            items.append(_Item("bytes", f"_rt.enc_hash({attr})", into=into))
        elif fld.type == "headers":
            prep.append(f"_v_{ident} = _rt.enc_headers({attr})")
            items.append(_Item("bytes", f"_v_{ident}"))
        elif fld.type == "frame":
            frames.append(f"_rt.frame_out({attr})")
        elif fld.type == "msg":
            frames.append(f"*_rt.frames_out({attr})")
        else:  # pragma: no cover - the loader rejects unknown types
            raise AssertionError(fld.type)
