"""Encoders validate and name the offending field."""

from __future__ import annotations

import uuid

import pytest

from broker import tmqp
from filemq import fmq_msg
from tests.zproto.support import MODELS_DIR, codec
from zproto.errors import EncodeError


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        (fmq_msg.Icanhaz(path="x" * 256), "path"),
        (fmq_msg.Icanhaz(path="é" * 128), "path"),  # 256 octets of UTF-8
        (fmq_msg.Nom(credit=-1), "credit"),
        (fmq_msg.Nom(credit=1 << 64), "credit"),
        (fmq_msg.Nom(credit="5"), "credit"),  # type: ignore[arg-type]
        (fmq_msg.Cheezburger(operation=256), "operation"),
        (fmq_msg.Cheezburger(chunk="text"), "chunk"),  # type: ignore[arg-type]
        (fmq_msg.Cheezburger(headers={"k" * 256: "v"}), "headers"),
        (fmq_msg.Cheezburger(headers={"k": 5}), "headers"),  # type: ignore[dict-item]
        (fmq_msg.Ohai(version=3), "version"),
        (fmq_msg.Ohai(protocol="FILEMQX"), "protocol"),
        (fmq_msg.Srsly(reason="\ud800"), "reason"),  # lone surrogate: not UTF-8
        (tmqp.Frame(message_type=64), "message_type"),
        (tmqp.Frame(ttl=32), "ttl"),
        (tmqp.Frame(first_acquirer=2), "first_acquirer"),  # type: ignore[arg-type]
        (tmqp.Frame(message_id="i" * 256), "message_id"),
        (tmqp.Frame(content_type=65536), "content_type"),
        (tmqp.Frame(headers=(("a:b", "c"),)), "headers"),
        (tmqp.Frame(headers=(("a", "c\r\n"),)), "headers"),
        (tmqp.Frame(headers=(("k", "v" * 70000),)), "headers"),
        (tmqp.Frame(payload=None), "payload"),  # type: ignore[arg-type]
    ],
)
def test_invalid_message_names_the_field(msg: object, field: str) -> None:
    with pytest.raises(EncodeError) as info:
        msg.encode()  # type: ignore[attr-defined]
    assert f".{field}" in str(info.value)


def test_encode_rejects_foreign_objects() -> None:
    with pytest.raises(EncodeError):
        fmq_msg.encode(tmqp.Frame())  # type: ignore[arg-type]


def test_classic_binary_types() -> None:
    _proto, module = codec(MODELS_DIR / "c_tools_example.xml", None)
    good = module.Binary(
        flags=b"abcd",
        public_key=b"k",
        identifier=uuid.uuid4(),
        address=b"addr",
        content=[b"one", b"two"],
    )
    frames = module.encode(good)
    assert frames[1:] == [b"addr", b"one", b"two"]
    assert module.decode(frames) == good
    with pytest.raises(EncodeError, match="flags"):
        module.Binary(flags=b"abc").encode()
    with pytest.raises(EncodeError, match="identifier"):
        module.Binary(flags=b"abcd", identifier="not-a-uuid").encode()
    with pytest.raises(EncodeError, match="address"):
        module.Binary(flags=b"abcd", address=5).encode()
    with pytest.raises(EncodeError, match="content"):
        module.Binary(flags=b"abcd", content=b"not a list").encode()


@pytest.mark.parametrize("bad", [-1, 3.5, object()])
def test_a_list_field_holding_a_non_iterable_is_an_encode_error(bad: object) -> None:
    """The validator itself met the bad value (``for v in -1``) and raised TypeError."""
    _proto, module = codec(MODELS_DIR / "c_tools_example.xml", None)
    for msg, field in (
        (module.Structures(aliases=bad), "aliases"),  # strings
        (module.Binary(content=bad), "content"),  # msg
    ):
        with pytest.raises(EncodeError, match=field):
            module.encode(msg)
