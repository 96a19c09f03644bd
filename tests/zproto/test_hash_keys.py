"""A small ``hash`` field's keys are encoded once and kept (``zproto.runtime._HASH_KEYS``:
a FILEMQ server sends ``sha1``, ``size``, ``mtime_ns``, ``mode`` with every file); a big
one (a mirror's cache of names) is encoded as it comes.  Both paths give the same octets
for the same entries, whatever the keys (non-ASCII, 255 octets, a big value), the table
never grows past its bound, and a key too long fails alike on both."""

from __future__ import annotations

import random

import pytest

from zproto import runtime
from zproto.errors import EncodeError

_KEYS = ["sha1", "size", "mtime_ns", "mode", "ключ", "k" * 255, "", "a b", "\u00e9\u00e8"]


def _random_hash(rng: random.Random, count: int) -> dict[str, str]:
    out: dict[str, str] = {}
    while len(out) < count:
        key = rng.choice(_KEYS) if rng.random() < 0.5 else f"key{rng.randrange(10**6)}"
        size = rng.choice([0, 1, 40, 300, runtime._BIG_VALUE + rng.randrange(3)])
        out[key] = rng.choice("ab\u00e9") * size
    return out


def _big_hash_bytes(small: dict[str, str]) -> bytes:
    """``small``'s entries as a hash too big to be keyed encodes them (after its count)."""
    filler = {f"\x00filler{i}": "x" for i in range(runtime._KEYED_HASH + 1)}
    big = runtime.enc_hash({**small, **filler})
    tail = runtime.enc_hash(filler)[4:]
    assert big.endswith(tail)
    return big[4 : len(big) - len(tail)]


@pytest.mark.parametrize("seed", range(20))
def test_keyed_and_plain_encodings_give_the_same_octets(seed: int) -> None:
    rng = random.Random(seed)
    small = _random_hash(rng, rng.randrange(runtime._KEYED_HASH + 1))
    first = runtime.enc_hash(small)  # (keys perhaps new: encoded, then kept)
    again = runtime.enc_hash(small)  # (keys kept: looked up)
    assert first == again
    assert first[4:] == _big_hash_bytes(small)
    decoded, end = runtime.dec_hash(first, 0, "headers")
    assert decoded == small and end == len(first)


def test_the_table_of_keys_stays_within_its_bound() -> None:
    for i in range(3 * runtime._HASH_KEYS_KEPT):
        encoded = runtime.enc_hash({f"name{i}": "v"})
        assert runtime.dec_hash(encoded, 0, "h")[0] == {f"name{i}": "v"}
    assert len(runtime._HASH_KEYS) <= runtime._HASH_KEYS_KEPT


def test_a_key_too_long_fails_on_both_paths_and_is_not_kept() -> None:
    key = "k" * 256
    with pytest.raises(EncodeError, match="longer than 255 octets"):
        runtime.enc_hash({key: "v"})
    assert key not in runtime._HASH_KEYS
    many = {f"f{i}": "v" for i in range(runtime._KEYED_HASH + 1)}
    with pytest.raises(EncodeError, match="longer than 255 octets"):
        runtime.enc_hash({**many, key: "v"})
