"""``<record>``: frames decoded straight into the tuple type a receiver keeps.

A binary model's ``<record name = "R" fields = "a, b, c" wire = "1">`` gives the module
``decode_R_records(datas, cls, wire_key)``: for each whole frame in ``datas`` that
``decode`` makes the general message, ``tuple.__new__(cls, (a, b, c, (wire_key, frame)))``
(the fields in the order named, then, with ``wire = "1"``, the frame's octets beside the
receiver's key); the indexes of the other frames are refused.  No message object is made
on the way: a frame in its simplest shape (``zproto.shape``) is checked and its fields
taken where they lie, inline, with no call per frame or per field (so is one in that shape
but for its variable-length numbers in their three-octet form); any other frame goes
through ``decode`` (which has the last word on every error) and its message's fields are
copied.  It never raises.

What it is for: a receiver that keeps its own immutable form of a message (TMQP: the
broker's ``broker.message.Message``, a named tuple) and gets many frames at once (a
ZeroMQ socket drained of a producer's pushes) pays one generated decode per frame and
nothing else.
"""

from __future__ import annotations

from zproto.decoder import FastDecoderWriter, bit_values, decode_or_none, unpack_bits
from zproto.model import Message, Record
from zproto.pysource import Source, StructNames
from zproto.shape import Plan, plan_fast

__all__ = ["RecordWriter", "function_name"]


def function_name(record: Record) -> str:
    """The generated function of a record (``decode_message_records``)."""
    return f"decode_{record.ident}_records"


class RecordWriter:
    """Writes ``decode_<record>_records`` (after ``decode``, whose tables it shares)."""

    def __init__(self, structs: StructNames) -> None:
        self.structs = structs

    def write(
        self, src: Source, msg: Message, plan: Plan | None, literal_size: int, record: Record
    ) -> None:
        cname = msg.class_name
        name = function_name(record)
        params = ["datas: Sequence[Any]", "cls: type[_R]"]
        if record.wire:
            params.append("wire_key: object")
        src.wrapped(f"def {name}(", params, ") -> tuple[list[_R], list[int]]:")
        src.indent()
        self._doc(src, msg, record)
        src("out: list[Any] = []")
        src("bad: list[int] = []")
        src("new = tuple.__new__")
        src("for buf in datas:  # (a frame's index: the frames before it, taken or refused)")
        src.indent()
        src("r: Any = None")
        if plan is not None:
            self._fast(src, msg, plan, literal_size, record)
            wide = plan_fast(msg, wide=True, keyed=True)
            if wide is not None:  # (its lengths in their three-octet form: 4 KiB payloads)
                src("if r is None:")
                src.indent()
                self._fast(src, msg, wide, literal_size, record)
                src.dedent()
        src("if r is None:")
        src.indent()
        decode_or_none(src, "m", "buf")
        src(f"if type(m) is not {cname}:")
        src("    bad.append(len(out) + len(bad))")
        src("    continue")
        self._make(src, record, [f"m.{f}" for f in record.fields], "decoded")
        src.dedent()
        src("out.append(r)")
        src.dedent()
        src.end_def("return out, bad")

    @staticmethod
    def _doc(src: Source, msg: Message, record: Record) -> None:
        cname = msg.class_name
        src(f'"""Each whole frame of ``datas`` that ``decode`` makes a {cname}, as ``cls``')
        src("built from the tuple of its fields")
        for line in _wrapped_names(record.fields, 88 - 4 * src.level):
            src(line)
        if record.wire:
            src("then ``(wire_key, the frame as given)``;")
        src("in order, and the indexes of the other frames (refused exactly as ``decode``")
        src("refuses them, or not a " + cname + ").  No message is made for a frame in its")
        src("simplest shape.  Never raises.")
        if record.description:
            src()
            for line in record.description.replace('"""', "'''").splitlines():
                src(line)
        src('"""')

    def _fast(
        self, src: Source, msg: Message, plan: Plan, literal_size: int, record: Record
    ) -> None:
        """The simplest shape inline: ``r`` made, else ``r`` stays None (``decode``)."""
        src("while True:  # (once: a frame of another shape breaks out to ``decode``)")
        src.indent()
        src("if type(buf) is not bytes:")
        src("    break")
        src("size = len(buf)")
        fields = FastDecoderWriter(self.structs).checked_fields(
            src, msg, plan, literal_size, None, "break"
        )
        values: dict[str, str] = {}
        for fld in plan.bits:
            values.update(bit_values(fld, f"bits_{fld.ident}"))
        wanted = set(record.fields)
        if values and wanted & set(values):
            FastDecoderWriter.remembered_bits(src, msg, plan, "state")
            unpack_bits(src, [f"f_{n}" if n in wanted else "_" for n in values])
        exprs = dict(fields)  # (the bits' fields are the locals unpacked above)
        self._make(src, record, [exprs.get(f, f"f_{f}") for f in record.fields], "fields")
        src("break")
        src.dedent()

    @staticmethod
    def _make(src: Source, record: Record, exprs: list[str], name: str) -> None:
        """``r``: the record of ``exprs`` (its fields), through the tuple ``name``."""
        items = list(exprs)
        if record.wire:
            items.append("(wire_key, buf)")
        src.wrapped(f"{name} = (", items, ")")
        src(f"r = new(cls, {name})")


def _wrapped_names(names: tuple[str, ...], width: int) -> list[str]:
    """``(a, b, ...)`` of the record's fields in doc lines at most ``width`` long."""
    lines = ["("]
    for n, name in enumerate(names):
        part = f"``{name}``" + (", " if n < len(names) - 1 else ")")
        if len(lines[-1]) + len(part) > width:
            lines[-1] = lines[-1].rstrip()
            lines.append("")
        lines[-1] += part
    return lines
