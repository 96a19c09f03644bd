"""``<sender>`` on a binary model: ``encode_<sender>_sender(fixed fields)`` checks the fields
that stay the same once and gives ``encode(varying fields)``, whose frames are exactly
``encode_<message>(...)``'s with all the fields -- errors included (``EncodeError`` naming
the field, from the maker for a bad fixed field, from ``encode`` for a bad varying one).
TMQP's sender ``frame`` (content type, message id, target, payload vary) is what the
clients push with.  Checked against frames built by hand from the spec and against
``encode_frame`` and the general codec (``fast=False``) over generated field values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import tmqp
from tests.zproto.support import CPU_BOUND, general_codec, string_model
from zproto.errors import EncodeError
from zproto.model import ModelError, load

GENERAL = general_codec(Path(tmqp.__file__).with_suffix(".xml"))
pytestmark = CPU_BOUND


def test_a_push_is_the_octets_of_the_spec() -> None:
    """QUEUE (17) with high priority (0x40), ttl 16 and no flag in the options octet; the
    three string lengths; content type 7 little-endian; the payload's one-octet length;
    the strings; the payload (built by hand, not by the codec)."""
    encode = tmqp.encode_frame_sender(high_priority=True, message_type=17, source="src")
    want = bytes([0x40 | 17, 16, 2, 3, 6, 7, 0, 5]) + b"m1" + b"src" + b"orders" + b"hello"
    assert encode(7, "m1", "orders", b"hello") == [want]


def _fixed() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "first_acquirer": st.booleans(),
            "high_priority": st.booleans(),
            "message_type": st.integers(0, 63),
            "pending_response": st.booleans(),
            "pending_ack": st.booleans(),
            "ttl": st.integers(0, 31),
            "source": st.text(max_size=8),
            "headers": st.sampled_from([(), (("k", "v"),), (("a", "1"), ("a", "2"))]),
        }
    )


@settings(max_examples=300, deadline=None)
@given(
    _fixed(),
    st.integers(0, 65535),
    st.text(max_size=12),
    st.text(max_size=12),
    st.binary(max_size=400),
)
def test_every_frame_is_encode_frames(
    fixed: dict[str, Any], content_type: int, mid: str, target: str, payload: bytes
) -> None:
    """Valid fields of every shape (headers or none, payload lengths on both sides of the
    one-octet form, non-ASCII strings): the octets of the fast and the general encoder."""
    encode = tmqp.encode_frame_sender(**fixed)
    fields = dict(fixed, content_type=content_type, message_id=mid, target=target)
    want = tmqp.encode_frame(**fields, payload=payload)
    assert encode(content_type, mid, target, payload) == want
    assert GENERAL.encode_frame(**fields, payload=payload) == want


@pytest.mark.parametrize(
    ("fixed", "field"),
    [
        ({"message_type": 64}, "message_type"),
        ({"ttl": 32}, "ttl"),
        ({"ttl": -1}, "ttl"),
        ({"high_priority": 2}, "high_priority"),
        ({"source": 5}, "source"),
    ],
)
def test_a_bad_fixed_field_is_refused_by_the_maker(fixed: dict[str, Any], field: str) -> None:
    with pytest.raises(EncodeError, match=field) as made:
        tmqp.encode_frame_sender(**fixed)
    with pytest.raises(EncodeError) as general:
        tmqp.encode_frame(**fixed)
    assert str(made.value) == str(general.value)


def test_a_fixed_string_too_long_for_its_length_is_refused_by_each_encode() -> None:
    """(Its length octet is packed with the frame's head: the maker cannot tell.)"""
    encode = tmqp.encode_frame_sender(source="x" * 256)
    with pytest.raises(EncodeError, match="source") as fast:
        encode(1, "m", "t", b"")
    with pytest.raises(EncodeError) as general:
        tmqp.encode_frame(source="x" * 256, content_type=1, message_id="m", target="t")
    assert str(fast.value) == str(general.value)


@pytest.mark.parametrize(
    "varying",
    [
        (65536, "m", "t", b""),
        (-1, "m", "t", b""),
        (1, "m" * 256, "t", b""),
        (1, b"m", "t", b""),
        (1, "m", None, b""),
        (1, "m", "t", "text"),
        (1, "m", "t" * 300, b"x" * 300),
    ],
)
def test_a_bad_varying_field_is_the_error_encode_frame_raises(varying: tuple[Any, ...]) -> None:
    encode = tmqp.encode_frame_sender(message_type=17, source="me", headers=(("k", "v"),))
    names = ("content_type", "message_id", "target", "payload")
    with pytest.raises(EncodeError) as fast:
        encode(*varying)
    with pytest.raises(EncodeError) as general:
        tmqp.encode_frame(message_type=17, source="me", headers=(("k", "v"),),
                          **dict(zip(names, varying, strict=True)))  # fmt: skip
    assert str(fast.value) == str(general.value)


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ('<class name="t"><sender name="s" fields="a"/>', "binary"),
        ('<class name="t" dialect="binary"><sender name="s" fields="nope"/>', "not a field"),
        ('<class name="t" dialect="binary"><sender name="s" fields="n"/>', "not a field"),
        ('<class name="t" dialect="binary"><sender name="s" fields="a, a"/>', "twice"),
        ('<class name="t" dialect="binary"><sender name="s" fields=""/>', "no field"),
        ('<class name="t" dialect="binary"><sender fields="a"/>', "name"),
        (
            '<class name="t" dialect="binary"><sender name="s" fields="a"/>'
            '<sender name="s" fields="a"/>',
            "two senders",
        ),
    ],
)
def test_a_sender_names_fields_of_the_binary_message(
    tmp_path: Path, model: str, match: str
) -> None:
    with pytest.raises(ModelError, match=match):
        load(string_model(tmp_path, model))
