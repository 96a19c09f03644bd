"""Helpers for zproto tests: load generated codecs and build hypothesis strategies
from a model, so every message of every model is exercised the same way."""

from __future__ import annotations

import importlib
import re
import types
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from zproto.attrs import attributes
from zproto.codegen import PythonGenerator
from zproto.generate import render
from zproto.model import VARLEN, Field, Message, Protocol, load
from zproto.selftest import load_module

#: For the CPU-bound modules (Hypothesis, hundreds of examples a test: 3-27 s each at
#: load 15): 120 s, the suite's timeout (a hang detector), was reached by
#: test_mutated_valid_messages[zre_msg] and [c_tools_example] under pytest-xdist -n 2 at
#: load 20-50.  A hang is still caught, at 10 min.
CPU_BOUND = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = Path(__file__).resolve().parent / "models"


def value_id(value: object) -> str:
    """A parametrize id from a value's repr, without memory addresses (``<object object
    at 0x7f..>``): pytest-xdist's workers must collect the same test ids."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


#: (model path, importable module name or None for test-only models)
PROJECT_MODELS = [
    (ROOT / "filemq" / "fmq_msg.xml", "filemq.fmq_msg"),
    (ROOT / "filemq" / "fmq_msg_czmq.xml", "filemq.fmq_msg_czmq"),
    (ROOT / "broker" / "tmqp.xml", "broker.tmqp"),
]
#: test-only models, generated in memory
TEST_MODELS = [
    (MODELS_DIR / name, None)
    for name in (
        "c_tools_example.xml",
        "gossip_like.xml",
        "zgossip_msg.xml",
        "zre_msg.xml",
        "mlm_proto.xml",
        "binary_shapes.xml",
        "binary_plain.xml",
        "name_clash.xml",
        "name_clash_binary.xml",
        "binary_keyed.xml",
    )
]
ALL_MODELS = [*PROJECT_MODELS, *TEST_MODELS]


def general_codec(model: Path) -> types.ModuleType:
    """The model's codec without its fast paths: the general encoders/decoders only."""
    proto = load(model)
    source = PythonGenerator(proto, model.name, fast=False).generate()
    return load_module(source, f"_test_general_{proto.name}")


def codec(model: Path, module_name: str | None) -> tuple[Protocol, types.ModuleType]:
    """The model and its codec: the committed module, or one generated in memory."""
    proto = load(model)
    if module_name is not None:
        return proto, importlib.import_module(module_name)
    _proto, outputs = render(model)
    source = next(text for path, text in outputs.items() if path.suffix == ".py")
    return proto, load_module(source, f"_test_codec_{proto.name}")


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


def _utf8_max(limit: int) -> st.SearchStrategy[str]:
    """Strings whose UTF-8 encoding fits in ``limit`` octets, including exactly full ones."""
    full = st.integers(0, min(limit, 300)).map(lambda n: "x" * n)
    some = _text.filter(lambda s: len(s.encode()) <= limit)
    return st.one_of(some, full) if limit < 300 else st.one_of(some, full, st.just("é" * 150))


def _header_pairs() -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    key = st.text(
        st.characters(
            codec="utf-8", exclude_categories=("Cs", "Zs", "Cc"), exclude_characters=":"
        ),
        min_size=1,
        max_size=12,
    ).filter(lambda k: k == k.strip())
    value = st.text(
        st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=20
    ).filter(lambda v: v == v.strip())
    return st.lists(st.tuples(key, value), max_size=4).map(tuple)


def field_strategy(fld: Field, limit: int | None) -> st.SearchStrategy[Any]:
    if fld.value is not None:
        return st.just(int(fld.value, 0) if fld.type == "number" else fld.value)
    if fld.type == "number":
        size = 8 if fld.size == VARLEN else int(fld.size or 1)
        top = (1 << (8 * size)) - 1
        return st.one_of(st.just(0), st.just(top), st.integers(0, top))
    if fld.type in ("string", "longstr"):
        return _utf8_max(limit if limit is not None else 0xFFFFFFFF)
    if fld.type == "octets":
        if fld.length_ref is None:
            return st.binary(min_size=int(fld.size or 0), max_size=int(fld.size or 0))
        return st.binary(max_size=300)
    if fld.type in ("chunk", "frame"):
        return st.one_of(st.binary(max_size=64), st.just(b"\x00" * 70000))
    if fld.type == "strings":
        return st.lists(_text, max_size=5)
    if fld.type == "hash":
        return st.dictionaries(_utf8_max(255), _text, max_size=5)
    if fld.type == "uuid":
        return st.uuids()
    if fld.type == "msg":
        return st.lists(st.binary(max_size=20), max_size=3)
    if fld.type == "headers":
        return _header_pairs()
    raise AssertionError(fld.type)


def message_strategy(msg: Message, cls: type) -> st.SearchStrategy[Any]:
    """Instances of a generated message class with values that must round-trip."""
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    by_ident = {f.ident: f for f in msg.fields}
    for attr in attributes(msg):
        kind, limit, const = attr.spec
        if kind == "bit":
            if const is not None:
                kwargs[attr.ident] = st.just(const)
            elif limit == 1:
                kwargs[attr.ident] = st.booleans()
            else:
                kwargs[attr.ident] = st.integers(0, (1 << int(limit or 1)) - 1)
            continue
        fld = by_ident[attr.ident]
        kwargs[attr.ident] = field_strategy(fld, limit)
    return st.builds(cls, **kwargs)


def sample_uuid() -> uuid.UUID:
    return uuid.UUID("3a60e685-0a1e-4cc1-5f3b-fd4b42bc6b3e")


def fields_of(msg: Any) -> dict[str, Any]:
    """A generated message's fields by name, in order (its instances have no __dict__;
    ``__match_args__`` names them, dataclass or plain class)."""
    return {name: getattr(msg, name) for name in msg.__match_args__}


def _tmqp_frame(
    mt: int, ack: bool, ttl: int, ct: int, ids: list[str], headers: Any, payload: bytes
) -> bytes:
    from broker import tmqp

    frame = tmqp.Frame(message_type=mt, pending_ack=ack, ttl=ttl, content_type=ct,
                       message_id=ids[0], source=ids[1], target=ids[2], headers=headers,
                       payload=payload)  # fmt: skip
    return tmqp.encode(frame)[0]


def tmqp_frames() -> st.SearchStrategy[bytes]:
    """Encoded TMQP frames (any type, flags and ids, with or without a header block) and
    PINGs: the entries of a batch, the deliveries of a fan-out run."""
    frame = st.builds(
        _tmqp_frame,
        st.integers(0, 63),
        st.booleans(),
        st.integers(0, 31),
        st.integers(0, 65535),
        st.lists(st.text(max_size=6), min_size=3, max_size=3),
        st.sampled_from([(), (("k", "v"),)]),
        st.binary(max_size=300),
    )
    return st.one_of(frame, st.just(bytes.fromhex("89FF000000000000")))


def string_model(tmp_path: Path, head: str) -> Path:
    """A model file: ``head`` (the ``<class>`` element's opening and what comes before
    the message), then message ``m``: a one-octet number ``n``, the length of string ``a``."""
    path = tmp_path / "t.xml"
    path.write_text(f'{head}<message name="m">'
                    '<field name="n" type="number" size="1"/>'
                    '<field name="a" type="string" length="n"/></message></class>')  # fmt: skip
    return path
