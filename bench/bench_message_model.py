"""Object models for generated zproto messages: cost of making one, of reading fields,
and the API each keeps.

    python bench/bench_message_model.py [--quick]

Issue 9 asks the generated codec (encode+decode) to reach half the speed of plain
struct code for a FILEMQ NOM (2 fields) and a TMQP frame (12 fields).  A decoder ends by
making a message object; this compares ways a generated message class could be made,
each for the two messages (classes built here the way the generator would emit them):

- make: what a decoder does with the values it unpacked (today: the "slots twin": a
  plain slotted class is made, filled and given the frozen dataclass as its class; TMQP:
  the flag fields come from a cached tuple; before: the frozen dataclass got its fields
  as one ``__dict__``);
- kw: ``Nom(credit=..., sequence=...)``;
- read: the fields a receiver reads (NOM: both; TMQP: message_type, pending_ack,
  target, payload);
- projected: the codec ratio of bench_codec.py if only the object changed: today's
  encode+decode, measured in this run, minus today's make plus this model's make,
  against the struct baseline of the same run (issue 9's target: 0.50; the footer
  also gives the ratio with an object that costs nothing to make);
- API: which parts of what generated messages offer today the model keeps.

Times are ns per operation, best of five rounds, in CPU time of this process (the
machine is shared); the cost of calling an empty function is subtracted.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import pickle
import struct
import time
import weakref
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass
from typing import Any

from bench_codec import gen_nom, gen_tmqp, rates, raw_nom, raw_tmqp

from broker import tmqp

_clock = time.process_time

NOM = ("Nom", ("credit", "sequence"), (0, 0))
FRAME = (
    "Frame",
    tuple(f.name for f in dataclasses.fields(tmqp.Frame)),
    tuple(f.default for f in dataclasses.fields(tmqp.Frame)),
)
#: The TMQP frame of bench_codec.py, as the decoder has it: its 12 values.
FRAME_VALUES: tuple[Any, ...] = (False, False, 17, False, True, 16, 1, "m-000042")
FRAME_VALUES += ("producer-1", "orders", (), b"x" * 100)


Fields = tuple[str, ...]
Defaults = tuple[Any, ...]
#: A model builds a message class and the function a decoder would call to make one.
Model = tuple[type, Callable[..., Any]]


def _exec(source: str, names: dict[str, Any]) -> dict[str, Any]:
    namespace = dict(names)
    exec(compile(source, "<model>", "exec"), namespace)
    return namespace


def _params(fields: Fields) -> str:
    return ", ".join(f"{f}=_d{i}" for i, f in enumerate(fields))


def _defaults(defaults: Defaults) -> dict[str, Any]:
    return {f"_d{i}": d for i, d in enumerate(defaults)}


def _frozen_dataclass(
    name: str,
    fields: Fields,
    defaults: Defaults,
    bases: tuple[type, ...],
    ns: dict[str, Any],
    **options: Any,
) -> type:
    """A frozen dataclass ``name`` over ``bases`` whose fields have these defaults."""
    body = dict(ns, __annotations__=dict.fromkeys(fields, "Any"), __module__=__name__)
    body.update(zip(fields, defaults, strict=True))
    cls: type = dataclass(frozen=True, init=False, **options)(type(name, bases, body))
    return cls


# ---------------------------------------------------------------------------
# model "dict": the generated classes before the slots twin (frozen dataclass, fields in
# __dict__)


class _DictBase:
    __slots__ = ("__dict__",)


_set_state = vars(_DictBase)["__dict__"].__set__


def dict_model(name: str, fields: Fields, defaults: Defaults) -> Model:
    items = ", ".join(f"{f!r}: {f}" for f in fields)
    src = f"def __init__(self, {_params(fields)}):\n    _set_state(self, {{{items}}})\n"
    ns = _exec(src, {"_set_state": _set_state, **_defaults(defaults)})
    cls = _frozen_dataclass(name, fields, defaults, (_DictBase,), {"__init__": ns["__init__"]})
    if name == "Nom":  # the NOM decoder: one dict display
        src = f"def make({', '.join(fields)}):\n    m = _new(C)\n    _set_state(m, {{{items}}})\n"
        src += "    return m\n"
    else:  # the TMQP fast decoder: a cached dict of the flag fields, copied
        src = "def make(" + ", ".join(fields) + "):\n    state = _base.copy()\n"
        for f in fields[6:11]:
            src += f"    state[{f!r}] = {f}\n"
        src += "    m = _new(C)\n    _set_state(m, state)\n    return m\n"
    base = dict(zip(fields, FRAME_VALUES, strict=False))
    ns = _exec(src, {"_new": object.__new__, "_set_state": _set_state, "C": cls, "_base": base})
    return cls, ns["make"]


# ---------------------------------------------------------------------------
# model "slots + __set__": frozen dataclass(slots=True), filled through each slot
# descriptor's own __set__ (frozen __setattr__ is not involved)


def slots_model(name: str, fields: Fields, defaults: Defaults) -> Model:
    cls = _frozen_dataclass(name, fields, defaults, (), {}, slots=True, weakref_slot=True)
    setters = {f"_s_{f}": vars(cls)[f].__set__ for f in fields}
    src = f"def make({', '.join(fields)}):\n    m = _new(C)\n"
    src += "".join(f"    _s_{f}(m, {f})\n" for f in fields) + "    return m\n"
    src += f"def __init__(self, {_params(fields)}):\n"
    src += "".join(f"    _s_{f}(self, {f})\n" for f in fields)
    ns = _exec(src, {"_new": object.__new__, "C": cls, **setters, **_defaults(defaults)})
    cls.__init__ = ns["__init__"]  # type: ignore[misc]
    return cls, ns["make"]


def slots_init_model(name: str, fields: Fields, defaults: Defaults) -> Model:
    """The plain ``@dataclass(frozen=True, slots=True)``: its __init__ uses object.__setattr__."""
    body = dict(__annotations__=dict.fromkeys(fields, "Any"), __module__=__name__)
    body.update(zip(fields, defaults, strict=True))
    cls: type = dataclass(frozen=True, slots=True, weakref_slot=True)(type(name, (), body))
    return cls, cls


# ---------------------------------------------------------------------------
# model "slots twin" (today's generated classes): the slots live on a plain mutable class;
# the decoder makes one by calling it, fills it with ordinary ``m.f = v`` (specialised slot
# stores) and then sets ``m.__class__`` to the frozen dataclass, which adds no slots of
# its own.


def twin_model(name: str, fields: Fields, defaults: Defaults) -> Model:
    fill = type(f"_{name}Fill", (), {"__slots__": (*fields, "__weakref__")})
    src = f"def make({', '.join(fields)}):\n    m = _Fill()\n"
    src += "".join(f"    m.{f} = {f}\n" for f in fields) + "    m.__class__ = C\n    return m\n"
    src += f"def __new__(cls, {_params(fields)}):\n    m = _Fill()\n"
    src += "".join(f"    m.{f} = {f}\n" for f in fields) + "    m.__class__ = cls\n    return m\n"
    src += "def __reduce__(self):\n"
    src += f"    return type(self), ({''.join(f'self.{f}, ' for f in fields)})\n"
    ns = _exec(src, {"_Fill": fill, **_defaults(defaults)})
    extra = {"__slots__": (), "__new__": ns["__new__"], "__reduce__": ns["__reduce__"]}
    cls = _frozen_dataclass(name, fields, defaults, (fill,), extra)
    for f in fields:  # the class defaults would hide the slots
        delattr(cls, f)
    ns["C"] = cls
    return cls, ns["make"]


# ---------------------------------------------------------------------------
# model "tuple": a tuple subclass with C getters (collections.namedtuple's shape),
# made a frozen dataclass, equal only to its own class


try:
    from collections import _tuplegetter  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - other interpreters
    from operator import itemgetter

    def _tuplegetter(index: int, doc: str) -> Any:
        return property(itemgetter(index), doc=doc)


def _values(self: tuple[Any, ...]) -> tuple[Any, ...]:
    """``__getnewargs__`` of the tuple model: the fields are the arguments."""
    return tuple(self)


def tuple_model(name: str, fields: Fields, defaults: Defaults) -> Model:
    src = f"def __new__(cls, {_params(fields)}):\n"
    src += f"    return _tuple_new(cls, ({''.join(f'{f}, ' for f in fields)}))\n"
    src += f"def make({', '.join(fields)}):\n"
    src += f"    return _tuple_new(C, ({''.join(f'{f}, ' for f in fields)}))\n"
    src += "def __eq__(self, other):\n"
    src += "    if other.__class__ is not self.__class__:\n        return NotImplemented\n"
    src += "    return _tuple_eq(self, other)\n"
    ns = _exec(
        src, {"_tuple_new": tuple.__new__, "_tuple_eq": tuple.__eq__, **_defaults(defaults)}
    )
    body = {
        "__slots__": (),
        "__new__": ns["__new__"],
        "__eq__": ns["__eq__"],
        "__hash__": tuple.__hash__,
        "__getnewargs__": _values,
        "__bool__": lambda self: True,
    }
    cls = _frozen_dataclass(name, fields, defaults, (tuple,), body, eq=False)
    for i, f in enumerate(fields):  # the class defaults make way for the getters
        setattr(cls, f, _tuplegetter(i, f))
    ns["C"] = cls
    return cls, ns["make"]


# ---------------------------------------------------------------------------
# model "one slot": the values as one tuple in one slot, fields as properties


class _OneSlot:
    __slots__ = ("__weakref__", "_v")


def one_slot_model(name: str, fields: Fields, defaults: Defaults) -> Model:
    src = f"def make({', '.join(fields)}):\n    m = _new(C)\n"
    src += f"    _set_v(m, ({''.join(f'{f}, ' for f in fields)}))\n    return m\n"
    src += f"def __init__(self, {_params(fields)}):\n"
    src += f"    _set_v(self, ({''.join(f'{f}, ' for f in fields)}))\n"
    src += "".join(f"def _get_{f}(self):\n    return self._v[{i}]\n" for i, f in enumerate(fields))
    names = {"_new": object.__new__, "_set_v": vars(_OneSlot)["_v"].__set__}
    ns = _exec(src, {**names, **_defaults(defaults)})
    cls = _frozen_dataclass(name, fields, defaults, (_OneSlot,), {"__slots__": ()})
    cls.__init__ = ns["__init__"]  # type: ignore[misc]
    for f in fields:
        setattr(cls, f, property(ns[f"_get_{f}"]))
    ns["C"] = cls
    return cls, ns["make"]


# ---------------------------------------------------------------------------
# floor: a plain mutable slotted class with an ``__init__`` (not immutable)


def mutable_model(name: str, fields: Fields, defaults: Defaults) -> Model:
    src = f"def __init__(self, {_params(fields)}):\n"
    src += "".join(f"    self.{f} = {f}\n" for f in fields)
    ns = _exec(src, _defaults(defaults))
    cls = type(name, (), {"__slots__": (*fields, "__weakref__"), "__init__": ns["__init__"]})
    return cls, cls


MODELS: list[tuple[str, Callable[[str, Fields, Defaults], Model]]] = [
    ("slots twin (today)", twin_model),
    ("dict (before)", dict_model),
    ("slots + __set__", slots_model),
    ("slots, dataclass __init__", slots_init_model),
    ("tuple subclass", tuple_model),
    ("one slot + properties", one_slot_model),
    ("mutable slots (floor)", mutable_model),
]


# ---------------------------------------------------------------------------
# timing and API checks


def _calibrate(fn: Callable[[], object], seconds: float) -> int:
    n = 1
    while True:
        start = _clock()
        for _ in range(n):
            fn()
        if _clock() - start > seconds / 10:
            return n
        n *= 2


def _ns(fn: Callable[[], object], seconds: float) -> float:
    """ns per call of fn: best of 5 rounds."""
    n = _calibrate(fn, seconds)
    best = float("inf")
    for _ in range(5):
        start = _clock()
        for _ in range(n):
            fn()
        best = min(best, (_clock() - start) / n)
    return best * 1e9


def _api(nom_cls: type, frame_cls: type) -> str:
    """The parts of today's message API a model keeps (a letter each; '-' where not)."""
    for cls in (nom_cls, frame_cls):  # pickle finds a class by its module and name
        globals()[cls.__qualname__] = cls
    nom = nom_cls(credit=5, sequence=1)
    frame = frame_cls(message_type=17, target="orders", payload=b"x")
    other = _frozen_dataclass("Other", NOM[1], NOM[2], (), {}, eq=True)
    other.__init__ = lambda self, credit=0, sequence=0: _set_fields(self, credit, sequence)  # type: ignore[misc]

    def frozen() -> bool:
        try:
            nom.credit = 9
        except FrozenInstanceError:
            return nom.credit == 5
        return False

    checks = [
        ("F", frozen),
        ("K", lambda: nom_cls().credit == 0 and frame.ttl == 16 and frame.source == ""),
        ("D", lambda: [f.name for f in dataclasses.fields(nom)] == list(NOM[1])),
        (
            "r",
            lambda: (
                dataclasses.replace(frame, ttl=3)
                == frame_cls(message_type=17, ttl=3, target="orders", payload=b"x")
            ),
        ),
        ("E", lambda: nom == nom_cls(5, 1) and nom != nom_cls(5, 2) and nom != other(5, 1)),
        ("H", lambda: hash(nom) == hash(nom_cls(5, 1))),
        ("R", lambda: repr(nom) == "Nom(credit=5, sequence=1)"),
        ("C", lambda: copy.copy(frame) == frame and copy.deepcopy(frame) == frame),
        ("P", lambda: pickle.loads(pickle.dumps(frame)) == frame),
        ("W", lambda: weakref.ref(frame)() is frame),
        ("V", lambda: vars(nom) == {"credit": 5, "sequence": 1}),
        ("T", lambda: bool(nom_cls()) and not isinstance(nom, tuple)),
    ]
    out = []
    for letter, check in checks:
        try:
            out.append(letter if check() else "-")
        except Exception:
            out.append("-")
    return "".join(out)


def _set_fields(obj: Any, credit: int, sequence: int) -> None:
    object.__setattr__(obj, "credit", credit)
    object.__setattr__(obj, "sequence", sequence)


_API_LEGEND = (
    "F frozen (FrozenInstanceError), K keywords with defaults, D dataclasses.fields, "
    "r dataclasses.replace,\nE == only with its own class, H hash, R repr, C copy/deepcopy, "
    "P pickle, W weakref, V vars(),\nT always true and not a tuple (no len/iter/index)."
)


@dataclass
class _Run:
    """What every row is measured against (same run)."""

    seconds: float  # per timing round / 10
    call: float  # ns to call an empty function, subtracted from every cell
    floor: dict[str, float]  # ns of the struct baseline, per message
    today: dict[str, float]  # ns of today's encode+decode, per message
    made: dict[str, float] = dataclasses.field(default_factory=dict)  # today's make

    def cells(self, key: str, make: Callable[[], object], kw: Callable[[], object],
              read: Callable[[], object]) -> str:  # fmt: skip
        """One message's cells: make, kw, read (ns) and the projected codec ratio."""
        cost = _ns(make, self.seconds) - self.call
        self.made.setdefault(key, cost)  # the first model measured is today's
        projected = self.floor[key] / (self.today[key] - self.made[key] + cost)
        kw_ns = _ns(kw, self.seconds) - self.call
        read_ns = _ns(read, self.seconds) - self.call
        return f"{cost:>8.0f} {kw_ns:>5.0f} {read_ns:>5.0f} {projected:>6.2f}"


def _model_row(run: _Run, label: str, build: Callable[[str, Fields, Defaults], Model]) -> str:
    nom_cls, make_nom = build(*NOM)
    frame_cls, make_frame = build(*FRAME)
    nom = make_nom(5, 1)
    frame = make_frame(*FRAME_VALUES)
    assert (nom.credit, nom.sequence) == (5, 1)
    assert tuple(getattr(frame, f) for f in FRAME[1]) == FRAME_VALUES
    nom_cells = run.cells(
        "nom",
        lambda: make_nom(1 << 20, 42),
        lambda: nom_cls(credit=1, sequence=2),
        lambda: (nom.credit, nom.sequence),
    )
    frame_cells = run.cells(
        "tmqp",
        lambda: make_frame(*FRAME_VALUES),
        lambda: frame_cls(message_type=17, target="t"),
        lambda: (frame.message_type, frame.pending_ack, frame.target, frame.payload),
    )
    return f"{label:<26} {nom_cells}  {frame_cells}  {_api(nom_cls, frame_cls)}"


# ---------------------------------------------------------------------------
# the leanest NOM codec a generator could emit (one dispatch each way, no checks
# beyond the size), with the "slots twin" object: how near 0.50 NOM can get at all


_NOM_WIRE = struct.Struct(">BBBQQ")
_NOM_BODY = struct.Struct(">QQ")


def lean_nom_codec() -> tuple[Callable[[Any], list[bytes]], Callable[[Any], Any], Any]:
    """encode, decode and a message of the leanest NOM codec."""
    cls, _ = twin_model(*NOM)
    fill = cls.__mro__[1]  # the twin's slots, made inline
    pack, unpack = _NOM_WIRE.pack, _NOM_BODY.unpack_from

    def encode_nom(m: Any) -> list[bytes]:
        return [pack(0xAA, 0xA3, 7, m.credit, m.sequence)]

    def decode_nom(buf: bytes) -> Any:
        if len(buf) != _NOM_WIRE.size:
            raise ValueError("size")
        credit, sequence = unpack(buf, 3)
        m: Any = fill()
        m.credit = credit
        m.sequence = sequence
        m.__class__ = cls
        return m

    encoders = {cls: encode_nom}
    decoders = {b"\xaa\xa3\x07": decode_nom}

    def encode(msg: Any) -> list[bytes]:
        return encoders[type(msg)](msg)

    def decode(frames: Any) -> Any:
        buf = frames[0]
        if len(frames) == 1 and type(buf) is bytes:
            decoder = decoders.get(buf[:3])
            if decoder is not None:
                return decoder(buf)
        raise ValueError("not a NOM")

    return encode, decode, cls(credit=1 << 20, sequence=42)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short timing rounds")
    args = parser.parse_args()
    seconds = 0.05 if args.quick else 0.3

    def empty() -> None:
        pass

    gen_nom_rate, raw_nom_rate = rates(gen_nom, raw_nom, seconds)
    gen_tmqp_rate, raw_tmqp_rate = rates(gen_tmqp, raw_tmqp, seconds)
    run = _Run(
        seconds,
        call=_ns(empty, seconds),
        floor={"nom": 1e9 / raw_nom_rate, "tmqp": 1e9 / raw_tmqp_rate},
        today={"nom": 1e9 / gen_nom_rate, "tmqp": 1e9 / gen_tmqp_rate},
    )
    print(
        f"{'model':<26} {'NOM make':>8} {'kw':>5} {'read':>5} {'proj.':>6}"
        f"  {'TMQP make':>8} {'kw':>5} {'read':>5} {'proj.':>6}  API"
    )
    for label, build in MODELS:
        print(_model_row(run, label, build))
    floor, today = run.floor, run.today
    encode, decode, nom = lean_nom_codec()
    assert decode(encode(nom)) == nom
    lean_rate, lean_raw_rate = rates(lambda: decode(encode(nom)), raw_nom, seconds)

    def free(key: str) -> float:
        return floor[key] / (today[key] - run.made[key])

    print(
        f"\nns per operation (calling an empty function, {run.call:.0f} ns, subtracted).  "
        f"Today's encode+decode: NOM {today['nom']:.0f} ns, TMQP {today['tmqp']:.0f} ns;\n"
        f"struct baseline: NOM {floor['nom']:.0f} ns, TMQP {floor['tmqp']:.0f} ns "
        f"(ratios now {floor['nom'] / today['nom']:.2f} and {floor['tmqp'] / today['tmqp']:.2f}; "
        f"with an object that costs nothing to make: {free('nom'):.2f} and {free('tmqp'):.2f})."
        f"\nThe leanest NOM codec (one dispatch each way) with the slots twin object: "
        f"{1e9 / lean_rate:.0f} ns, ratio {lean_rate / lean_raw_rate:.2f}."
        f"\nAPI: {_API_LEGEND}"
    )


if __name__ == "__main__":
    main()
