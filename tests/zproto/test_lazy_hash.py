"""``lazy = "1"`` on the last hash field of a message: decoded as an ``EncodedHash`` (its
octets as received, entries read when first used), so a receiver can compare a big hash
with the one it expects without a dict of every entry (a FILEMQ server answering a
mirror that has everything: ``filemq.uptodate``)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from filemq import fmq_msg, fmq_msg_czmq
from zproto.errors import DecodeError, ModelError
from zproto.model import load
from zproto.runtime import EncodedHash, enc_hash

CACHE = {f"dir{i % 100:03d}/file{i:06d}.dat": f"{i * 7919:040x}" for i in range(20_000)}


def _frame(path: str, options: dict[str, str], cache_octets: bytes, czmq: bool = False) -> bytes:
    """An ICANHAZ built by hand from spec 35 (signature, id 5, string path -- a longstr on
    the reference implementation's wire --, hash options, then the cache octets as given):
    not through the codec under test."""
    raw = path.encode()
    size = len(raw).to_bytes(4, "big") if czmq else bytes([len(raw)])
    return b"\xaa\xa3\x05" + size + raw + enc_hash(options) + cache_octets


@pytest.mark.parametrize("codec", [fmq_msg, fmq_msg_czmq])
def test_the_cache_is_kept_as_its_wire_octets_and_reads_as_the_entries(codec: object) -> None:
    octets = enc_hash(CACHE)
    czmq = codec is fmq_msg_czmq
    msg = codec.decode([_frame("/", {"RESYNC": "1"}, octets, czmq)])  # type: ignore[attr-defined]
    assert isinstance(msg.cache, EncodedHash)
    assert msg.cache.octets == octets and len(msg.cache) == 20_000
    assert msg.cache == CACHE and dict(msg.cache) == CACHE
    assert CACHE == msg.cache  # noqa: SIM300 (dict.__eq__ first: the reflected comparison)
    assert msg.cache["dir007/file000007.dat"] == f"{7 * 7919:040x}"
    assert msg.options == {"RESYNC": "1"}
    again = codec.encode(msg)  # type: ignore[attr-defined]
    assert again == [_frame("/", {"RESYNC": "1"}, octets, czmq)]  # as it came, not re-made


def test_decoding_a_big_cache_makes_no_entry() -> None:
    """Decoded, a 20,000-entry cache (a 1.3 MiB frame) became ~5 MiB of str and dict; kept
    encoded it costs one copy of its octets until something reads an entry."""
    frame = _frame("/", {}, enc_hash(CACHE))
    tracemalloc.start()
    try:
        msg = fmq_msg.decode([frame])
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.2 * len(frame)
    assert msg.cache == CACHE


def test_a_malformed_entry_is_a_decode_error_from_decode() -> None:
    """``decode`` walks a lazy field's entries (no dict made): a key or value that is not
    UTF-8, a length running past the frame or octets after the last entry are a
    ``DecodeError`` there, as for every other field (they were found only when the
    entries were first read: a receiver that never read them answered a malformed
    command as a good one)."""
    bad_key = b"\x00\x00\x00\x01" + b"\x02\xff\xfe" + b"\x00\x00\x00\x01x"
    bad_value = b"\x00\x00\x00\x01" + b"\x01a" + b"\x00\x00\x00\x02\xc3("
    truncated = b"\x00\x00\x00\x02" + b"\x01a" + b"\x00\x00\x00\x09xy" + b"\x00" * 5
    key_cut = b"\x00\x00\x00\x02" + b"\x01a\x00\x00\x00\x01x" + b"\x09abc"
    trailing = enc_hash({"a": "1"}) + b"\x01"
    short = enc_hash({"a": "1", "b": "2"})[:-1]
    for octets, reason in (
        (bad_key, "malformed"),
        (bad_value, "malformed"),
        (truncated, "past the end"),
        (key_cut, "past the end"),
        (trailing, "trailing"),
        (short, "past the end"),
    ):
        for codec, czmq in ((fmq_msg, False), (fmq_msg_czmq, True)):
            with pytest.raises(DecodeError, match=reason):
                codec.decode([_frame("/", {}, octets, czmq)])
    with pytest.raises(DecodeError, match="more than 2000000"):  # (limit=: before any read)
        fmq_msg.decode([_frame("/", {}, (2_000_001).to_bytes(4, "big") + b"\0" * 5)])
    with pytest.raises(DecodeError, match="past the end"):  # a count the octets cannot hold
        fmq_msg.decode([_frame("/", {}, (3).to_bytes(4, "big") + b"\0" * 14)])


def test_entries_that_are_not_ascii_are_walked_and_read() -> None:
    """Non-ASCII names, a key of 200 octets (its length octet is not ASCII) and a value
    longer than 127 octets take the walk that decodes each key and value: they pass."""
    cache = {"caf\u00e9/\u00fcber.txt": "ab" * 20, "k" * 200: "v", "long": "x" * 300, "": ""}
    msg = fmq_msg.decode([_frame("/", {}, enc_hash(cache))])
    assert isinstance(msg.cache, EncodedHash)
    assert dict(msg.cache) == cache and len(msg.cache) == 4
    empty = fmq_msg.decode([_frame("/", {}, enc_hash({}))])
    assert dict(empty.cache) == {}


def _model(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "m.xml"
    path.write_text(f'<class name = "m" signature = "1">\n{body}\n</class>\n', encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('<message name = "a"><field name = "s" type = "string" lazy = "1"/></message>',
         "lazy= applies to hash fields"),
        ('<message name = "a"><field name = "h" type = "hash" lazy = "1"/>'
         '<field name = "n" type = "number"/></message>', "must be the last field"),
        ('<message name = "a"><field name = "h" type = "hash" lazy = "yes"/></message>',
         "lazy= is 0 or 1"),
    ],
)  # fmt: skip
def test_a_lazy_field_that_cannot_be_kept_encoded_is_a_model_error(
    tmp_path: Path, body: str, message: str
) -> None:
    with pytest.raises(ModelError, match=message):
        load(_model(tmp_path, body))
