"""``runtime.utf8_regions``: many regions of a buffer checked as UTF-8 at once.

The oracle is the obvious check, each region decoded alone; the vectors are built by
hand around the one case the joined check must not miss: a character split between two
regions (each region alone is not UTF-8, the joined octets are).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from zproto.runtime import ascii_regions, utf8_regions


def _alone(buf: bytes, bounds: list[int]) -> bool:
    try:
        for i in range(0, len(bounds), 2):
            buf[bounds[i] : bounds[i + 1]].decode()
    except UnicodeDecodeError:
        return False
    return True


E_ACUTE = "é".encode()  # C3 A9
EURO = "€".encode()  # E2 82 AC


def test_ascii_regions_among_binary_octets() -> None:
    buf = b"\xff\xfeabc\x00\x80def\xfe"
    assert utf8_regions(buf, [2, 5, 7, 10])
    assert utf8_regions(buf, [])
    assert utf8_regions(buf, [3, 3, 0, 0])  # empty regions are UTF-8


def test_whole_multi_octet_characters() -> None:
    buf = b"\x01" + E_ACUTE + b"\x02" + EURO + b"x"
    assert utf8_regions(buf, [1, 3, 4, 8])


def test_a_character_split_between_two_regions_is_refused() -> None:
    """Joined, ``C3 | A9`` is "é"; alone neither half is UTF-8."""
    buf = b"ab" + E_ACUTE + b"cd"
    assert not utf8_regions(buf, [0, 3, 3, 6])
    assert not utf8_regions(buf, [3, 6])  # a region starting at a continuation octet
    assert not utf8_regions(buf, [0, 3])  # a lead octet without its continuation


def test_a_split_hidden_by_an_empty_region_is_refused() -> None:
    buf = b"a" + EURO + b"b"
    assert not utf8_regions(buf, [0, 2, 2, 2, 2, 5])


def test_invalid_octets_are_refused() -> None:
    assert not utf8_regions(b"ab\xffcd", [0, 5])
    assert not utf8_regions(b"ab\xed\xa0\x80", [0, 5])  # an encoded surrogate
    assert not utf8_regions(b"\xc0\xaf", [0, 2])  # an overlong form


_PIECES = st.one_of(
    st.binary(max_size=6),
    st.text(max_size=4).map(lambda t: t.encode()),
    st.sampled_from([E_ACUTE, EURO, E_ACUTE[:1], EURO[1:], b"\x80", b"\xc3"]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_PIECES, max_size=12), st.data())
def test_agrees_with_decoding_each_region_alone(pieces: list[bytes], data: st.DataObject) -> None:
    """Regions cut anywhere in a buffer of text and garbage (adjacent or not)."""
    buf = b"".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(buf)), max_size=10)))
    bounds = cuts[: len(cuts) // 2 * 2]
    assert utf8_regions(buf, bounds) == _alone(buf, bounds)


def test_ascii_regions_are_ascii_whatever_lies_between() -> None:
    buf = b"ab\xffcd" + E_ACUTE
    assert ascii_regions(buf, [0, 2, 3, 5])
    assert not ascii_regions(buf, [0, 3])
    assert not ascii_regions(buf, [3, 7])  # UTF-8, not ASCII
    assert ascii_regions(buf, [])
