"""Encoding a big ``hash`` field (a mirror's 100,000-file ICANHAZ cache) must not hold
several times the message in memory: the client's peak RSS during a resync was set by it."""

from __future__ import annotations

import tracemalloc

import pytest

from filemq import fmq_msg
from zproto import runtime
from zproto.errors import DecodeError


def test_encoding_a_big_hash_peaks_near_its_own_size() -> None:
    cache = {f"dir{i % 100:03d}/file{i:06d}.dat": f"{i * 7919:040x}" for i in range(20_000)}
    tracemalloc.start()
    try:
        encoded = runtime.enc_hash(cache)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the result, a growing buffer of the same size, and small change; not ~8x
    assert peak < 3 * len(encoded)
    decoded, end = runtime.dec_hash(encoded, 0, "cache")
    assert decoded == cache and end == len(encoded)


def test_a_message_with_a_big_hash_is_encoded_in_one_buffer() -> None:
    """The ICANHAZ frame is the hash's own buffer: the hash was encoded into a bytes
    of its own and then joined into the frame (two copies at once: ~2.1x)."""
    cache = {f"dir{i % 100:03d}/file{i:06d}.dat": f"{i * 7919:040x}" for i in range(20_000)}
    msg = fmq_msg.Icanhaz("dir", {"x": "y"}, cache)
    tracemalloc.start()
    try:
        frames = fmq_msg.encode(msg)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * len(frames[0])  # the frame and the growth of its buffer
    assert fmq_msg.decode(frames) == msg
    assert fmq_msg.encode_icanhaz("dir", {"x": "y"}, cache) == frames


def test_a_big_value_is_not_copied_whole_while_encoded() -> None:
    """A mirror's ATTRS option (a line per file: ~5 MiB at 100,000 files) went into the
    buffer through a whole encoded copy of itself (~2x the value at once)."""
    value = "".join(f"dir{i % 100:03d}/file{i:06d}.dat\tf\t644\t{i}\n" for i in range(60_000))
    options = {"ATTRS": value, "é": "ü" * 70_000}  # (a big value that is not ASCII too)
    tracemalloc.start()
    try:
        frames = fmq_msg.encode_icanhaz("", options, {})
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * len(frames[0])
    assert fmq_msg.decode(frames) == fmq_msg.Icanhaz("", options, {})


def test_a_hash_or_strings_past_its_limit_is_refused_before_any_entry() -> None:
    """``limit=`` (a count checked before decoding): at the limit decoded, past it a
    DecodeError naming the field."""
    three = runtime.enc_hash({"a": "1", "b": "2", "c": "3"})
    assert runtime.dec_hash(three, 0, "m.h", 3) == ({"a": "1", "b": "2", "c": "3"}, len(three))
    with pytest.raises(DecodeError, match=r"m\.h: 3 entries, more than 2"):
        runtime.dec_hash(three, 0, "m.h", 2)
    words = runtime.enc_strings(["x", "y"])
    assert runtime.dec_strings(words, 0, "m.s", 2) == (["x", "y"], len(words))
    with pytest.raises(DecodeError, match="more than 1"):
        runtime.dec_strings(words, 0, "m.s", 1)
