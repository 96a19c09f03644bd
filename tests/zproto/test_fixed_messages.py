"""Classic messages whose fields all have a fixed size (FILEMQ's NOM) are decoded with one
``struct`` covering the whole frame, signature and id included, after one size check;
``decode()`` dispatches on the id first and sorts out why it refused frames afterwards.

Both shortcuts must keep the errors a peer's garbage gets: the same precedence (no
frames, not bytes-like, bad signature, unknown id) and a clear reason for a frame of the
wrong size.
"""

from __future__ import annotations

import re
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filemq import fmq_msg
from tests.zproto.support import ALL_MODELS, codec, value_id
from zproto.codegen import PythonGenerator
from zproto.decoder import fixed_size
from zproto.errors import DecodeError
from zproto.model import Message, Protocol
from zproto.runtime import frame_bytes

CLASSIC: list[tuple[Protocol, types.ModuleType]] = [
    (proto, module)
    for proto, module in (codec(model, name) for model, name in ALL_MODELS)
    if proto.dialect == "classic"
]
FIXED = [
    pytest.param(proto, module, msg, id=f"{proto.name}.{msg.class_name}")
    for proto, module in CLASSIC
    for msg in proto.messages
    if fixed_size(msg) is not None
]
CLASSIC_IDS = [proto.name for proto, _ in CLASSIC]


def _outcome(module: types.ModuleType, frames: Any) -> tuple[Any, ...]:
    try:
        msg = module.decode(frames)
    except DecodeError as exc:
        return "error", exc.reason, exc.signature_ok, exc.message_id
    return "ok", type(msg).__name__


def test_the_project_and_test_models_have_fixed_messages() -> None:
    """The tests below are not vacuous: NOM and the test models' fixed messages exist."""
    names = {param.id for param in FIXED}
    assert "fmq_msg.Nom" in names and "fmq_msg_czmq.Nom" in names
    assert len(names) >= 4


@pytest.mark.parametrize(("proto", "module", "msg"), FIXED)
def test_a_fixed_message_is_one_struct_over_the_whole_frame(
    proto: Protocol, module: types.ModuleType, msg: Message
) -> None:
    source = PythonGenerator(proto, "model.xml").generate()
    body = re.search(rf"\ndef _decode_{msg.ident}\(.*?\n\n\n", source, re.S)
    assert body is not None
    text = body.group(0)
    assert f"if len(buf) != {fixed_size(msg)}:" in text
    assert ".unpack(buf)" in text and "unpack_from" not in text
    value = getattr(module, msg.class_name)()
    frames = module.encode(value)
    assert len(frames[0]) == fixed_size(msg)
    assert module.decode(frames) == value
    assert module.decode([memoryview(frames[0])]) == value
    assert module.decode((bytearray(frames[0]),)) == value


@pytest.mark.parametrize(("proto", "module", "msg"), FIXED)
def test_a_fixed_message_of_the_wrong_size_is_a_clear_decode_error(
    proto: Protocol, module: types.ModuleType, msg: Message
) -> None:
    frame = module.encode(getattr(module, msg.class_name)())[0]
    size = len(frame)
    for cut in range(3, size):
        with pytest.raises(DecodeError) as info:
            module.decode([frame[:cut]])
        assert info.value.signature_ok and info.value.message_id == msg.id
        assert info.value.reason == f"{msg.class_name}: truncated ({cut} of {size} octets)"
    for extra in (b"\x00", b"\xff" * 3, frame):
        with pytest.raises(DecodeError) as info:
            module.decode([frame + extra])
        assert info.value.signature_ok and info.value.message_id == msg.id
        assert info.value.reason.startswith(f"{msg.class_name}: trailing octets")
    for frames in ([frame, b""], [frame, frame, b"x"]):
        with pytest.raises(DecodeError) as info:
            module.decode(frames)
        assert info.value.reason == f"{msg.class_name}: expected 1 frame(s)"
        assert info.value.message_id == msg.id


def test_nom_errors_name_what_is_wrong() -> None:
    frame = fmq_msg.encode_nom(credit=1, sequence=2)[0]
    with pytest.raises(DecodeError, match=r"^Nom: truncated \(18 of 19 octets\)$"):
        fmq_msg.decode([frame[:-1]])
    with pytest.raises(DecodeError, match=r"^Nom: trailing octets after the last field"):
        fmq_msg.decode([frame + b"\x00"])


def _refusal(proto: Protocol, frames: Any) -> tuple[Any, ...] | None:
    """What decode() must say before any message decoder runs, in this order (None when a
    message decoder has the word)."""
    if not frames:
        return "error", "no frames", False, None
    try:
        buf = frame_bytes(frames[0])
    except (TypeError, LookupError):
        return "error", "not bytes-like", False, None
    if len(buf) < 3 or buf[:2] != proto.signature_bytes:
        return "error", "bad signature", False, None
    if buf[2] not in {msg.id for msg in proto.messages}:
        return "error", f"unknown message id {buf[2]}", True, buf[2]
    return None


@pytest.mark.parametrize(("proto", "module"), CLASSIC, ids=CLASSIC_IDS)
@pytest.mark.parametrize(
    "frames",
    [
        None,
        [],
        (),
        [None],
        [object()],
        ["text"],
        [5],
        {1: b"x"},
        [b""],
        [b"\xaa"],
        [b"\xaa\xa3"],
        [b"\xab\xa3\x01"],
        [b"\xaa\xa3\xfe"],
        [memoryview(b"\xaa\xa3\xfe")],
        [bytearray(b"\x00\x00\x00")],
    ],
    ids=value_id,
)
def test_refused_frames_get_the_error_they_always_got(
    proto: Protocol, module: types.ModuleType, frames: Any
) -> None:
    expected = _refusal(proto, frames)
    assert expected is not None
    assert _outcome(module, frames) == expected


@pytest.mark.parametrize(("proto", "module"), CLASSIC, ids=CLASSIC_IDS)
@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(
        st.one_of(
            st.binary(max_size=24),
            st.binary(max_size=24).map(lambda b: b"\xaa\xa3" + b),
            st.binary(max_size=24).map(bytearray),
            st.none(),
            st.integers(),
        ),
        max_size=3,
    )
)
def test_dispatch_keeps_the_order_of_its_checks(
    proto: Protocol, module: types.ModuleType, frames: list[Any]
) -> None:
    expected = _refusal(proto, frames)
    outcome = _outcome(module, frames)
    if expected is not None:
        assert outcome == expected
    elif outcome[0] == "error":  # the message's own decoder refused it
        assert outcome[2] is True and outcome[3] == frame_bytes(frames[0])[2]
