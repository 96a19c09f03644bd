"""The generated fast paths give exactly what the general paths give, errors included.

For every model (the project's and the test models) the codec is generated twice: as
committed (fast paths in) and with ``fast=False`` (general encoders/decoders only).
Both must produce the same octets for every message, the keyword encoders
(``encode_<message>(...)``) the same as ``encode(Class(...))``, and both decoders the
same message or the same ``DecodeError`` for valid, damaged and random input.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import tmqp
from tests.zproto.support import (
    ALL_MODELS,
    CPU_BOUND,
    codec,
    fields_of,
    general_codec,
    message_strategy,
    value_id,
)
from zproto.decoder import BASES_LIMIT
from zproto.errors import DecodeError, EncodeError
from zproto.model import Protocol
from zproto.runtime import EncodedHash

pytestmark = CPU_BOUND

CODECS: list[tuple[Protocol, types.ModuleType, types.ModuleType]] = []
for _model, _module in ALL_MODELS:
    _proto, _fast = codec(_model, _module)
    CODECS.append((_proto, _fast, general_codec(_model)))
IDS = [proto.name for proto, _, _ in CODECS]
MESSAGES = [
    pytest.param(proto, msg, fast, general, id=f"{proto.name}.{msg.class_name}")
    for proto, fast, general in CODECS
    for msg in proto.messages
]

#: Values that are wrong for some field type or other.
BAD_VALUES = [
    -1,
    256,
    1 << 64,
    1.0,
    True,
    None,
    "x",
    "é" * 200,
    "\ud800",
    b"x",
    b"\x00" * 300,
    bytearray(b"ab"),
    [],
    ["a"],
    [b"a"],
    {},
    {"k": "v"},
    {"k": 1},
    (("k", "v"),),
    (("bad:key", "v"),),
    (("k", "v\r\n"),),
    object(),
]


def _encoded(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args, **kwargs)
    except EncodeError as exc:
        return "error", str(exc)


def _decoded(module: types.ModuleType, frames: Any) -> tuple[Any, ...]:
    try:
        msg = module.decode(frames)
    except DecodeError as exc:
        return "error", exc.reason, exc.signature_ok, exc.message_id
    try:  # a lazy hash's entries are read here: a malformed one fails then (DIALECT.md)
        fields = [
            (name, value.decoded() if isinstance(value, EncodedHash) else value)
            for name, value in fields_of(msg).items()
        ]
    except DecodeError as exc:
        return "error when read", exc.reason
    return type(msg).__name__, fields


def _general_decoded(module: types.ModuleType, frames: Any) -> tuple[Any, ...]:
    """The general decoder of a module: ``_decode`` when it has fast paths."""
    general = getattr(module, "_decode", module.decode)
    shim = types.SimpleNamespace(decode=general)
    return _decoded(shim, frames)  # type: ignore[arg-type]


def _same_everywhere(frames: list[bytes], fast: types.ModuleType, general: Any) -> None:
    outcome = _decoded(fast, frames)
    assert outcome == _decoded(general, frames)
    assert outcome == _general_decoded(fast, frames)


@pytest.mark.parametrize(("proto", "msg", "fast", "general"), MESSAGES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_and_general_paths_agree_on_valid_messages(proto, msg, fast, general, data) -> None:  # type: ignore[no-untyped-def]
    value = data.draw(message_strategy(msg, getattr(fast, msg.class_name)))
    fields = fields_of(value)
    frames = fast.encode(value)
    assert frames == general.encode(getattr(general, msg.class_name)(**fields))
    assert getattr(fast, f"encode_{msg.ident}")(**fields) == frames
    assert getattr(general, f"encode_{msg.ident}")(**fields) == frames
    assert fast.decode(frames) == value
    _same_everywhere(frames, fast, general)
    # zmq hands out memoryviews and Frames: any bytes-like is decoded the same
    views = [memoryview(f) for f in frames]
    assert fast.decode(views) == value
    assert fast.decode(tuple(frames)) == value


@pytest.mark.parametrize(("proto", "msg", "fast", "general"), MESSAGES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_and_general_paths_agree_on_invalid_messages(proto, msg, fast, general, data) -> None:  # type: ignore[no-untyped-def]
    value = data.draw(message_strategy(msg, getattr(fast, msg.class_name)))
    fields = fields_of(value)
    if not fields:
        return
    name = data.draw(st.sampled_from(sorted(fields)))
    fields[name] = data.draw(st.sampled_from(BAD_VALUES))
    outcome = _encoded(fast.encode, getattr(fast, msg.class_name)(**fields))
    assert outcome == _encoded(general.encode, getattr(general, msg.class_name)(**fields))
    assert outcome == _encoded(getattr(fast, f"encode_{msg.ident}"), **fields)
    if outcome[0] == "ok":  # some wrong-looking values are fine (True for a number)
        _same_everywhere(outcome[1], fast, general)


@pytest.mark.parametrize(("proto", "fast", "general"), CODECS, ids=IDS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_and_general_decoders_agree_on_damaged_input(proto, fast, general, data) -> None:  # type: ignore[no-untyped-def]
    msg = data.draw(st.sampled_from(proto.messages))
    value = data.draw(message_strategy(msg, getattr(fast, msg.class_name)))
    frames = list(fast.encode(value))
    raw = bytearray(frames[0])
    for _ in range(data.draw(st.integers(1, 3))):
        action = data.draw(st.sampled_from(["flip", "cut", "grow", "insert"]))
        if action == "flip" and raw:
            pos = data.draw(st.integers(0, len(raw) - 1))
            raw[pos] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del raw[data.draw(st.integers(0, len(raw))) :]
        elif action == "grow":
            raw += data.draw(st.binary(min_size=1, max_size=4))
        else:
            pos = data.draw(st.integers(0, len(raw)))
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=3))
    frames[0] = bytes(raw)
    if data.draw(st.booleans()):
        frames.append(data.draw(st.binary(max_size=4)))
    _same_everywhere(frames, fast, general)


@pytest.mark.parametrize(("proto", "fast", "general"), CODECS, ids=IDS)
@settings(max_examples=200, deadline=None)
@given(frames=st.lists(st.binary(max_size=48), min_size=0, max_size=3))
def test_fast_and_general_decoders_agree_on_random_octets(proto, fast, general, frames) -> None:  # type: ignore[no-untyped-def]
    _same_everywhere(frames, fast, general)


@pytest.mark.parametrize(("proto", "msg", "fast", "general"), MESSAGES)
def test_every_truncation_is_a_decode_error(proto, msg, fast, general) -> None:  # type: ignore[no-untyped-def]
    """Cut the encoding of the model's test message at every octet."""
    value = getattr(fast, msg.class_name)()
    frames = fast.encode(value)
    for cut in range(len(frames[0])):
        damaged = [frames[0][:cut], *frames[1:]]
        outcome = _decoded(fast, damaged)
        assert outcome == _decoded(general, damaged)
        if outcome[0] != "error":  # a shorter frame may still be another valid message
            assert outcome[0] != msg.class_name or cut == len(frames[0])


@pytest.mark.parametrize(("proto", "fast", "general"), CODECS, ids=IDS)
@pytest.mark.parametrize(
    "frames",
    [None, 5, "text", b"raw", {}, {0: b"x"}, {1: b"x"}, [None], [1], [object()], [[b"x"]], ()],
    ids=value_id,
)
def test_anything_that_is_not_frames_is_a_decode_error(proto, fast, general, frames) -> None:  # type: ignore[no-untyped-def]
    for module in (fast, general):
        with pytest.raises(DecodeError):
            module.decode(frames)


def test_plain_frames_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TMQP frame without headers and with a short payload never reaches the general
    decoder; one with headers does."""
    frame = tmqp.Frame(
        message_type=0x11, content_type=7, message_id="m1", target="ch", payload=b"x" * 100
    )
    plain = tmqp.encode(frame)
    with_headers = tmqp.encode(frame.replace(headers=(("k", "v"),)))

    def refuse(frames: Any) -> Any:
        raise AssertionError("general decoder called")

    monkeypatch.setattr(tmqp, "_decode", refuse)
    assert tmqp.decode(plain) == frame
    assert tmqp.decode((plain[0],)) == frame
    with pytest.raises(AssertionError, match="general decoder"):
        tmqp.decode(with_headers)
    with pytest.raises(AssertionError, match="general decoder"):  # a literal: never fast
        tmqp.decode(tmqp.encode(tmqp.Ping()))


def test_remembered_base_states_are_bounded() -> None:
    """Every value of the two flag octets decodes as the general decoder says, and at most
    BASES_LIMIT of them are remembered."""
    general = general_codec(next(m for m, name in ALL_MODELS if name == "broker.tmqp"))
    for flags in range(256):
        for options in range(0, 256, 3):
            data = bytes((flags, options, 1, 0, 2, 5, 0, 3)) + b"aZZxyz"
            _same_everywhere([data], tmqp, general)
    assert 0 < len(tmqp._BASES_FRAME) <= BASES_LIMIT


def test_remembered_base_states_are_never_shared_mutably() -> None:
    """An absent optional section with a dict field: each message gets its own dict."""
    _proto, fast, _general = next(c for c in CODECS if c[0].name == "binary_shapes")
    data = fast.encode(fast.Record(marker=1, name="n", body=b"b"))
    first, second = fast.decode(data), fast.decode(data)
    assert first == second and first.props == {} and first.props is not second.props
    first.props["changed"] = "yes"
    assert fast.decode(data).props == {}


def test_keyword_encoders_check_like_the_classes() -> None:
    with pytest.raises(EncodeError, match=r"Frame\.message_type .* out of range"):
        tmqp.encode_frame(message_type=64)
    with pytest.raises(EncodeError, match=r"Frame\.target .* 255"):
        tmqp.encode_frame(target="t" * 256)
    with pytest.raises(TypeError):  # not a field
        tmqp.encode_frame(colour="red")  # type: ignore[call-arg]
    assert tmqp.encode_ping() == tmqp.encode(tmqp.Ping())
    # the mutable defaults are fresh, as in the class
    from filemq import fmq_msg

    assert fmq_msg.encode_icanhaz(path="/p") == fmq_msg.encode(fmq_msg.Icanhaz(path="/p"))
    assert fmq_msg.encode_icanhaz(path="/p", options=None) == fmq_msg.encode_icanhaz(path="/p")
