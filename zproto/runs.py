"""``runs = "1"``: frames lying back to back in one buffer, their ends given.

A binary model with ``runs = "1"`` gets ``decode_run(buf, at, ends)`` (TMQP: a fan-out
run, ``broker.fanout``, whose table gives each delivery's end).  A frame in its simplest
shape (``zproto.shape``) is checked whole where it lies, with no call per field: its
lengths must add up to its end, and its string fields must be ASCII (one join and one
``isascii`` for the whole run, ``runtime.ascii_regions``; a run with other strings is
decoded frame by frame by ``decode``, which checks their UTF-8; when every octet of
the run is ASCII, one ``isascii`` of it is the whole check).  It is then made
with its octets fields (TMQP: the payload) sliced and every other field not decoded yet:
the twin class's slot ``_encoded`` holds the run's buffer and where the frame starts,
and the frame is given the lazy class (``_FrameLazy`` for ``Frame``: a subclass with the
same slots) whose ``__getattr__`` (hidden from type checkers, which keep checking every
field) decodes that frame's waiting fields the first time one of them is read.  A frame
refers to no other frame (no reference cycle: a run dropped unread is freed at once, by
reference counting, not by the cyclic collector).  It then becomes a plain message:
the message class itself has no ``__getattr__`` (CPython would route every attribute
read of every message through it, and 3.11 would not specialize them to slot reads:
about 4 times slower).  Threads may share a frame (no lock: a lock cost more than the
decode): its fields are stored under the waking class (``_FrameWaking``: the twin's
slots, plain stores, the same ``__getattr__``), then ``_encoded`` cleared, then the
message class given.  A thread that reads a field not stored yet reaches the hook and
decodes the frame too (the same values); one that finds ``_encoded`` cleared finds
every field stored and gives the message class; one whose stores meet the message
class (another thread finished first: ``FrozenInstanceError``) stops there.  The lazy class decodes
first what reads the fields as a whole (equality, hash, repr, pickle and copy), so they
give what a decoded message gives.  What a caller never reads is never decoded; a frame
not read yet keeps its run's buffer alive (the run's octets, as long as the frame is
held).  Frames of other shapes go through ``decode``.
"""

from __future__ import annotations

import re

from zproto.attrs import attributes, attrs_of, plain_default, twin_name
from zproto.decoder import bit_values, bits_key, decode_or_none, unpack_bits
from zproto.model import Field, Message, to_const_name
from zproto.pysource import LINE_LENGTH, Source, StructNames, group_checks
from zproto.shape import Plan

__all__ = ["ENCODED", "RunWriter", "lazy_name", "lazy_strings", "waking_name"]

#: The twin slot holding a lazily made frame's octets up to its last string field.
ENCODED = "_encoded"


def lazy_strings(plan: Plan | None) -> list[Field]:
    """The string fields of the simplest shape (``decode_run`` makes its frames lazily
    when there are some: the rest of a frame costs little to decode)."""
    return [] if plan is None else [f for f in plan.tail if f.type == "string"]


def lazy_name(msg: Message) -> str:
    """The lazy class of a message (``_FrameLazy`` for ``Frame``)."""
    return f"_{msg.class_name}Lazy"


#: The whole-value methods a frame not decoded yet decodes itself for: (arguments after
#: ``self``, result type, the call once it is a plain message).
_WHOLE_VALUE = {
    "__eq__": (", other: object", "bool", "self == other"),
    "__hash__": ("", "int", "hash(self)"),
    "__repr__": ("", "str", "repr(self)"),
    "__reduce__": ("", "tuple[Any, ...]", "self.__reduce__()"),
}


def waking_name(msg: Message) -> str:
    """The class of a lazy frame while one thread decodes it (``_FrameWaking``)."""
    return f"_{msg.class_name}Waking"


class RunWriter:
    """Writes ``decode_run`` (and the lazy string decoder its frames use)."""

    def __init__(self, structs: StructNames) -> None:
        self.structs = structs

    @staticmethod
    def lazy_class(src: Source, msg: Message) -> None:
        """The lazy class: the message's slots (no slot of its own) and a ``__getattr__``
        that decodes a lazy frame's fields on first read (only missing attributes reach
        it), the message's whole-value methods after decoding (the frame is then a plain
        message), and a constructor that makes a plain message."""
        cname, lazy = msg.class_name, lazy_name(msg)
        src(f"class {lazy}({cname}):")
        src.indent()
        src(f'"""A {cname} ``decode_run`` made, its fields waiting: the first read of one')
        src(f'decodes its run, whose frames become plain {cname}s (``zproto.runs``)."""')
        src()
        src("__slots__ = ()")
        src()
        src("if not TYPE_CHECKING:  # (hidden from type checkers: every field stays checked)")
        src.indent()
        src()
        src(f"def __new__(cls, *args: Any, **kwargs: Any) -> {cname}:")
        src(f'    """A plain {cname} (``dataclasses.replace`` of a lazy frame)."""')
        src(f"    return {cname}(*args, **kwargs)")
        RunWriter._hooks(src, msg)
        src.dedent()
        src.dedent()
        src()
        src()
        waking = waking_name(msg)
        src(f"class {waking}({twin_name(msg)}):")
        src.indent()
        src(f'"""A {cname} ``decode_run`` made while one thread decodes it (its fields stored')
        src("plainly): a field not stored yet reaches the hook, which decodes it too")
        src('(``zproto.runs``)."""')
        src()
        src("__slots__ = ()")
        src()
        src("if not TYPE_CHECKING:  # (the lazy class's hooks)")
        src.indent()
        for method in ("__getattr__", *_WHOLE_VALUE):
            src(f"{method} = {lazy}.{method}")
        src.dedent()
        src.dedent()
        src()
        src()

    @staticmethod
    def _hooks(src: Source, msg: Message) -> None:
        """``__getattr__`` and the whole-value methods of a frame not decoded yet: each
        decodes it (or waits while another thread does) first."""
        src()
        src("def __getattr__(self, name: str) -> Any:")
        src('    """A field of a frame ``decode_run`` made: decoded when first read."""')
        src(f"    return _lazy_{msg.ident}(self, name)")
        for method, (args, result, call) in _WHOLE_VALUE.items():
            src()
            src(f"def {method}(self{args}) -> {result}:")
            src(f"    _wake_{msg.ident}(self)")
            src(f"    return {call}")

    def write(self, src: Source, msg: Message, plan: Plan | None, literal_size: int) -> None:
        self._general(src, msg)
        if plan is None:
            src("decode_run = _decode_run")
            src()
            src()
            return
        strings = lazy_strings(plan)
        if strings:
            self._lazy(src, msg, plan)
        self._fast(src, msg, plan, literal_size, strings)

    @staticmethod
    def _doc(src: Source, msg: Message) -> None:
        cname = msg.class_name
        src('"""The frames lying back to back in ``buf`` from ``at``, the i-th ending at')
        src("``ends[i]``: (those that decode, in order; the indexes of the others, in order).")
        src()
        src(f"A frame is what ``decode((buf[start:end],))`` gives when that is a {cname};")
        src("one that does not decode, or decodes to another message, is refused, and so")
        src("is every frame from one whose end is before its start or past ``buf`` (the")
        src("rest of the run cannot be found).  Frames in their simplest shape are checked")
        src("here (lengths; string fields UTF-8) and keep every field but their octets")
        src("fields encoded until one is read (``zproto.runs``); ``lazy`` False: every")
        src("frame decoded by ``decode``.  Never raises.")
        src('"""')

    def _general(self, src: Source, msg: Message) -> None:
        cname = msg.class_name
        src.wrapped(
            "def _decode_run(",
            ["buf: bytes", "at: int", "ends: Sequence[int]", "lazy: bool = True"],
            f") -> tuple[list[{cname}], list[int]]:",
        )
        src.indent()
        src('"""``decode_run`` without its fast path: every frame through ``decode``')
        src('(``lazy`` or not)."""')
        src(f"out: list[{cname}] = []")
        src("bad: list[int] = []")
        src("total = len(buf)")
        src("p = at")
        src("for i, end in enumerate(ends):")
        src.indent()
        self._misplaced(src)
        self._by_decode(src, msg, "m")
        src("p = end")
        src.dedent()
        src.end_def("return out, bad")

    @staticmethod
    def _misplaced(src: Source) -> None:
        src("if not p <= end <= total:")
        src("    bad += range(i, len(ends))")
        src("    break")

    @staticmethod
    def _by_decode(src: Source, msg: Message, name: str) -> None:
        decode_or_none(src, name, "buf[p:end]")
        src(f"if type({name}) is {msg.class_name}:")
        src(f"    out.append({name})")
        src("else:")
        src("    bad.append(i)")

    def _lazy(self, src: Source, msg: Message, plan: Plan) -> None:
        """``_lazy_<message>(m, name)``: the waiting fields of ``m`` decoded from its
        run's buffer (checked by ``decode_run``), then ``name``."""
        cname, const = msg.class_name, to_const_name(msg.name)
        eager = {f.ident for f in plan.tail if f.type != "string"}
        lazy = [a.ident for a in attributes(msg) if a.ident not in eager]
        src.wrapped(f"_LAZY_{const}_NAMES = (", [f'"{n}"' for n in lazy], ")")
        src(f"_LAZY_{const} = frozenset(_LAZY_{const}_NAMES)")
        src("_set_slot = object.__setattr__")
        src()
        src()
        src(f"def _lazy_{msg.ident}(m: Any, name: str) -> Any:")
        src(f'    """``name`` of a {cname} that ``decode_run`` made: its waiting fields')
        src('    decoded (checked there), once; else AttributeError."""')
        src(f"    if name not in _LAZY_{const}:")
        missing = 'f"{type(m).__name__!r} object has no attribute {name!r}"'
        src(f"        raise AttributeError({missing})")
        src(f"    _wake_{msg.ident}(m)")
        src("    return getattr(m, name)")
        src()
        src()
        src(f"def _wake_{msg.ident}(m: Any) -> None:")
        src.indent()
        src('"""The waiting fields of ``m`` decoded where it lies in its run\'s buffer (checked')
        src(f'by ``decode_run``); it becomes a plain {cname}.  Threads: ``zproto.runs``."""')
        src(f"encoded = m.{ENCODED}")
        src("if encoded is None:  # (another thread stored every field: only the class left)")
        src(f'    _set_slot(m, "__class__", {cname})')
        src("    return")
        src("(buf, p) = encoded")
        body = Source(level=src.level)
        body("try:")
        body.indent()
        waking = waking_name(msg)
        body(f'_set_slot(m, "__class__", {waking})  # (plain stores: the frozen class refuses)')
        self._fill(body, msg, plan, self._values(plan), "m", lazy=set(lazy))
        body(f"m.{ENCODED} = None")
        body(f"m.__class__ = {cname}")
        body.dedent()
        body("except FrozenInstanceError:  # (another thread finished it first: all stored)")
        body("    return")
        self._head(src, plan, body)
        src.dedent()
        src()
        src()
        src(f"def waiting_fields(m: {cname}) -> bool:")
        src(f'    """Whether ``m`` (a {cname} ``decode_run`` made) has fields not decoded yet."""')
        src(f'    return getattr(m, "{ENCODED}", None) is not None')
        src()
        src()

    def _head(self, src: Source, plan: Plan, body: Source) -> None:
        """Unpack the head at ``p`` and the ends ``e_<field>`` of the tail, as much of
        them as ``body`` (written after them, at the same level) uses."""
        text = "\n".join(body.lines)
        ends = []
        position = f"p + {plan.head_size}"
        for fld in plan.tail:
            ends.append((f"e_{fld.ident}", f"{position} + f_{fld.length_ref}"))
            position = f"e_{fld.ident}"
        while ends and not re.search(rf"\b{ends[-1][0]}\b", text):
            ends.pop()  # (ends nothing after them needs)
        text += "\n".join(expr for _, expr in ends)
        used = [t if re.search(rf"\b{t}\b", text) else "_" for t, _, _ in plan.head]
        src.unpack(used, f"{self.structs.name(plan.format())}.unpack_from(buf, p)")
        for name, expr in ends:
            src(f"{name} = {expr}")
        src.lines += body.lines

    @staticmethod
    def _values(plan: Plan) -> dict[str, str]:
        """The bits values of the head (expressions over ``bits_<field>``)."""
        values: dict[str, str] = {}
        for fld in plan.bits:
            values.update(bit_values(fld, f"bits_{fld.ident}"))
        return values

    @staticmethod
    def _fill(
        src: Source, msg: Message, plan: Plan, values: dict[str, str], m: str, lazy: set[str]
    ) -> None:
        """Store the fields named in ``lazy`` into the twin ``m`` (the head unpacked)."""
        if values and lazy & set(values):
            const = to_const_name(msg.name)
            key = plan.key  # (the head's bits read as one number, or each on its own)
            if key is None:
                key = "key"
                src(f"key = {bits_key(plan)}")
            src("try:")
            src(f"    bits = _BASES_{const}[{key}]")
            src("except KeyError:")
            src(f"    bits = _base_{msg.ident}({key})")
            unpack_bits(src, [f"{m}.{name}" for name in values])
        absent = {a.ident for f in plan.absent for a in attrs_of(f)}
        starts: dict[str, str] = {}
        position = f"p + {plan.head_size}"
        for fld in plan.tail:
            starts[fld.ident] = position
            position = f"e_{fld.ident}"
        for attr in attributes(msg):
            name = attr.ident
            if name in values or name not in lazy:
                continue
            if name in absent:
                src(f"{m}.{name} = {plain_default(attr.default)}")
            elif name in starts:
                start = starts[name]
                part = f"buf[{start} : e_{name}]" if " " in start else f"buf[{start}:e_{name}]"
                field = next(f for f in plan.tail if f.ident == name)
                src(
                    f"{m}.{name} = {part}.decode()"
                    if field.type == "string"
                    else f"{m}.{name} = {part}"
                )
            else:  # a number of the head
                src(f"{m}.{name} = f_{name}")

    def _fast(
        self, src: Source, msg: Message, plan: Plan, literal_size: int, strings: list[Field]
    ) -> None:
        cname, twin = msg.class_name, twin_name(msg)
        src.wrapped(
            "def decode_run(",
            ["buf: bytes", "at: int", "ends: Sequence[int]", "lazy: bool = True"],
            f") -> tuple[list[{cname}], list[int]]:",
        )
        src.indent()
        self._doc(src, msg)
        if strings:
            src("if not lazy:")
            src("    return _decode_run(buf, at, ends)")
        src("count = len(ends)")
        src("out: list[Any] = [None] * count")
        src("bad: list[int] = []")
        if strings:
            src("# their string fields, checked at the end; none when every octet from ``at``")
            src("# on is ASCII (one C call: the strings of every frame are in there)")
            src("bounds: list[int] = []")
            src("checks = not buf[at:].isascii()")
        src("k = 0")
        src("total = len(buf)")
        src("p = at")
        src("for i, end in enumerate(ends):")
        src.indent()
        self._misplaced(src)
        src("size = end - p")
        src("m: Any = None")
        src("while True:  # (once: a frame of another shape breaks out to ``decode``)")
        src.indent()
        tests = [f"size < {max(plan.head_size, literal_size + 1)}"]
        tests += [f"buf[p + {offset}] > 252" for offset in plan.short_lengths]
        src(f"if {' or '.join(tests)}:")
        src("    break")
        values = self._values(plan)
        outer, src = src, Source(level=src.level)
        checks = [f"{raw} & {mask}" for raw, mask in plan.clear_flags]
        checks += [f"{expr} != {value}" for expr, value in plan.constants]
        checks.append(f"e_{plan.tail[-1].ident} != end")
        for group in group_checks(checks, LINE_LENGTH - 4 * src.level - 4):
            src(f"if {group}:")
            src("    break")
        eager = {f.ident for f in plan.tail if f.type != "string"}
        if strings:
            starts = {}
            position = f"p + {plan.head_size}"
            for fld in plan.tail:
                starts[fld.ident] = position
                position = f"e_{fld.ident}"
            # (one region: the strings and what lies between them, ASCII or decoded)
            src("if checks:")
            src(f"    bounds += ({starts[strings[0].ident]}, e_{strings[-1].ident})")
            src(f"m = {twin}()")
            self._fill(src, msg, plan, values, "m", lazy=eager)
            src(f"m.{ENCODED} = (buf, p)  # (the buffer and where it starts: no cycle)")
        else:
            src(f"m = {twin}()")
            self._fill(src, msg, plan, values, "m", lazy={a.ident for a in attributes(msg)})
        src(f"m.__class__ = {lazy_name(msg) if strings else cname}")
        src("break")
        self._head(outer, plan, src)
        src = outer
        src.dedent()
        src("if m is None:")
        src.indent()
        decode_or_none(src, "m", "buf[p:end]")
        src(f"if type(m) is not {cname}:")
        src("    bad.append(i)")
        src("    m = None")
        src.dedent()
        src("if m is not None:")
        src("    out[k] = m")
        src("    k += 1")
        src("p = end")
        src.dedent()
        if strings:
            src("if bounds and not _rt.ascii_regions(buf, bounds):")
            src("    return _decode_run(buf, at, ends)  # (each frame by decode: UTF-8 checked)")
        src("del out[k:]")
        src("return out, bad")
        src.dedent()
        src()
        src()
