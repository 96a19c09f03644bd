"""The simplest shape of a binary message, which the generated fast paths handle.

A binary frame (``dialect = "binary"``) is simplest when every optional section is
absent and every variable-length number takes its one-octet form.  The frame is then a
fixed head, read or written with one precompiled ``struct``, followed by strings and
octets whose lengths the head holds: one length check covers them all.  Frames of any
other shape go through the general encoder/decoder, which also has the last word on
every error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zproto.model import VARLEN, Field, Message, Optional
from zproto.pysource import ORDER_PREFIX, STRUCT_CHAR

__all__ = ["Plan", "plan_fast"]

#: The first octet of a variable-length number in its three-octet form (``runtime.dec_varlen``).
VARLEN_TWO_OCTETS = 253


@dataclass
class Plan:
    """How a binary message looks when every optional section is absent and every
    variable-length number takes its one-octet form: a fixed head read with one
    ``struct``, then fields whose lengths the head gives."""

    head: list[tuple[str, str, str | None]]  # (target, struct char, byte order)
    head_size: int
    short_lengths: list[int]  # offsets of variable-length numbers (one octet: < 253)
    clear_flags: list[tuple[str, int]]  # (raw bits variable, mask) that must be 0
    constants: list[tuple[str, int]]  # (expression over raw bits or a field, value)
    bits: list[Field]  # bits fields of the head, in order
    tail: list[Field]  # string/octets fields sized by head numbers
    absent: list[Field]  # fields of the absent optional sections
    #: (decoders: ``plan_fast(keyed=True)``) the local holding the head's bits fields read
    #: as one number (the key of the remembered base states), None: each field on its own
    key: str | None = None
    #: where each bits field lies in ``key`` (a shift per field of ``bits``, in order)
    key_shifts: list[int] = field(default_factory=list)

    def format(self) -> str:
        """The ``struct`` format of the head."""
        order = next((o for _, _, o in self.head if o is not None), "big")
        return ORDER_PREFIX[order] + "".join(c for _, c, _ in self.head)


def plan_fast(msg: Message, wide: bool = False, keyed: bool = False) -> Plan | None:
    """The simplest-shape layout of ``msg``, or None when it has none worth a decoder.

    Eligible: a binary message of one frame whose optional sections are guarded by flags
    of the fixed head, whose variable-length numbers sit in the fixed head, and whose
    other fields are strings/octets sized by numbers of the head.

    ``wide``: the same shape with every variable-length number in its three-octet form
    (the octet 253, then two octets of the message's byte order: 253 to 65,535, e.g. a
    4 KiB payload's length) instead of its one-octet form.

    ``keyed`` (a decoder's plan): the head's leading bits fields read as one number
    (:func:`merge_bits`): the key of the remembered base states comes out of the
    ``struct`` made, with no arithmetic and no int made per frame.
    """
    if msg.literal is not None or not msg.fields:
        return None
    plan = Plan([], 0, [], [], [], [], [], [])
    flag_of: dict[str, tuple[str, int]] = {}  # bit ident -> (raw bits variable, mask)
    in_head = True
    simplified = False
    for item in msg.items:
        if isinstance(item, Optional):
            if item.flag not in flag_of:
                return None
            plan.clear_flags.append(flag_of[item.flag])
            plan.absent.extend(item.fields)
            simplified = True
            continue
        fld = item
        if fld.type == "number" and fld.size == VARLEN:
            if not in_head:
                return None
            if wide:  # (checked as a constant, like a bit field's fixed value)
                if any(o not in (None, fld.byteorder) for _, _, o in plan.head):
                    return None  # one struct reads the head: one byte order
                plan.head.append((f"w_{fld.ident}", "B", None))
                plan.constants.append((f"w_{fld.ident}", VARLEN_TWO_OCTETS))
                plan.head.append((f"f_{fld.ident}", "H", fld.byteorder))
                plan.head_size += 3
            else:
                plan.short_lengths.append(plan.head_size)
                plan.head.append((f"f_{fld.ident}", "B", None))
                plan.head_size += 1
            simplified = True
        elif fld.type in ("number", "bits"):
            if not in_head:
                return None
            size = int(fld.size or 1)
            order = fld.byteorder if size > 1 else None
            if order is not None and any(o not in (None, order) for _, _, o in plan.head):
                return None  # one struct reads the head: one byte order
            target = f"bits_{fld.ident}" if fld.type == "bits" else f"f_{fld.ident}"
            plan.head.append((target, STRUCT_CHAR[size], order))
            plan.head_size += size
            if fld.type == "bits":
                plan.bits.append(fld)
                shift = size * 8
                for bit in fld.bits:
                    shift -= bit.width
                    mask = ((1 << bit.width) - 1) << shift
                    flag_of[bit.ident] = (target, mask)
                    if bit.value is not None:
                        plan.constants.append((f"{target} & {mask}", bit.value << shift))
            elif fld.value is not None:
                plan.constants.append((target, int(fld.value, 0)))
        elif fld.type in ("string", "octets") and fld.length_ref is not None:
            if fld.value is not None:
                return None
            in_head = False
            plan.tail.append(fld)
        else:
            return None
    if not simplified or not plan.tail:
        return None
    if keyed:
        merge_bits(plan)
    return plan


#: The ``struct`` character of an unsigned number of 2, 4 or 8 octets.
_MERGED_CHAR = {2: "H", 4: "I", 8: "Q"}

#: The local a decoder reads the merged bits fields into (no field's local: those are
#: ``bits_<field>``, ``f_<field>``, ``e_<field>``, ``w_<field>``).
MERGED_KEY = "k_bits"


def merge_bits(plan: Plan) -> None:
    """Read the head's bits fields as one number when they open the head, one octet
    each, 2, 4 or 8 of them: one head entry ``MERGED_KEY`` in the head's byte order
    instead of one per field, its checks (flags that must be clear, fixed bit values)
    rewritten over it, and ``key``/``key_shifts`` set.  Any other plan is left as it is
    (each field its own local; the key made from them, the first most significant)."""
    count = len(plan.bits)
    lead = [target for target, _, _ in plan.head[:count]]
    if count not in _MERGED_CHAR or lead != [f"bits_{f.ident}" for f in plan.bits]:
        return
    if any(int(f.size or 1) != 1 for f in plan.bits):
        return
    order = next((o for _, _, o in plan.head if o is not None), "big")
    shifts = [8 * (k if order == "little" else count - 1 - k) for k in range(count)]
    shift_of = dict(zip(lead, shifts, strict=True))
    plan.head[:count] = [(MERGED_KEY, _MERGED_CHAR[count], order)]
    plan.clear_flags = [(MERGED_KEY, mask << shift_of[raw]) for raw, mask in plan.clear_flags]
    constants = []
    for expr, value in plan.constants:
        raw, _, mask = expr.partition(" & ")
        if raw in shift_of:
            s = shift_of[raw]
            constants.append((f"{MERGED_KEY} & {int(mask) << s}", value << s))
        else:
            constants.append((expr, value))
    plan.constants = constants
    plan.key = MERGED_KEY
    plan.key_shifts = shifts
