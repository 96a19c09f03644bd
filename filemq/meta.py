"""What a mirror keeps besides file contents, as it travels in FILEMQ's reserved fields.

Spec 35 reserves CHEEZBURGER's ``headers`` dictionary and lets ICANHAZ carry
``options``: everything here lives in them, so the wire stays RFC 35 and a peer
that knows none of it (the reference C implementation, an older zerohub) ignores
it.  Pure functions and values; no I/O.

**Headers** (on a CREATE's last chunk, beside ``sha1``/``size``/``mtime_ns``):

* ``mode``: permission bits of the server's file or folder, octal (``644``,
  ``4755``; at most ``7777``).  Sent to every client (a header is free to ignore).
* ``kind``: ``file`` (the default when absent), ``dir`` or ``symlink``.  Folders
  and links are sent only to clients that ask for them (option ``META``): an older
  client would write them as empty files.  Their CREATE is one empty chunk.
* ``target``: a link's target, always relative and canonical -- zero or more
  leading ``..`` then plain names (``../../a/b``), climbing no higher than the
  subscription path.  The server rewrites what the link says into the shortest
  such path to where it resolves; it never sends a link that leads out of its
  mount or subscription, dangles or loops: that one comes with ``skip`` (the
  reason) and no target, so the mirror can say which link it did not get.
* ``touch=1``: the client has this content already (the ``sha1`` names it): set
  only mode and mtime.
* On a DELETE, ``kind`` says what is gone; a server that sends it mirrors folders
  itself, so the client does not remove the folders a delete leaves empty.

**ICANHAZ options** (from the client):

* ``META``: the permission bits the mirror applies, octal (``777``, or ``7777``
  with ``--special-bits``).  Present: the client takes folders, links, touches,
  and describes its copies in ``ATTRS``.
* ``LINKS``: ``skip`` (default), ``links`` (make them links) or ``copy`` (send the
  content of a link to a file instead).
* ``FILTER``: the mirror's include/exclude patterns (``filemq.filters``).
* ``ATTRS``: one line per entry DEST holds under the ICANHAZ path, names relative
  to it (or absolute under it) as cache keys are: ``name<TAB>f<TAB>mode<TAB>mtime_ns``
  for a file (its SHA-1 stays in the spec's cache), ``name<TAB>d<TAB>mode`` for a
  folder, ``name<TAB>l<TAB>target`` for a link; modes in octal without leading
  zeros.  The server compares the text after the name with what it would make;
  a line it cannot read matches nothing (that entry is sent again).

The mirror applies ``mode & mask`` to files; folders get ``mode & mask | 0o700``
(the owner can always write into them, so a folder published read-only never stops
the mirror from updating what is inside).  What the server compares against a
client's ``ATTRS`` is what that client would have made (``local_mode``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from operator import methodcaller

from filemq.paths import UnsafePathError

__all__ = [
    "DIR_OWNER_BITS",
    "HEADER_KIND",
    "HEADER_MODE",
    "HEADER_SKIP",
    "HEADER_TARGET",
    "HEADER_TOUCH",
    "OPTION_ATTRS",
    "OPTION_FILTER",
    "OPTION_LINKS",
    "OPTION_META",
    "PERMISSION_BITS",
    "SPECIAL_BITS",
    "EntryMeta",
    "Kind",
    "LinkPolicy",
    "MetaError",
    "attr_dir",
    "attr_file",
    "attr_kind",
    "attr_link",
    "canonical_target",
    "check_link_target",
    "decode_attrs",
    "format_mode",
    "local_mode",
    "parse_entry",
    "parse_mask",
    "parse_mode",
]

HEADER_KIND = "kind"
HEADER_MODE = "mode"
HEADER_TARGET = "target"
HEADER_TOUCH = "touch"
HEADER_SKIP = "skip"
OPTION_META = "META"
OPTION_LINKS = "LINKS"
OPTION_FILTER = "FILTER"
OPTION_ATTRS = "ATTRS"

#: rwx for user, group, others: what a mirror applies by default.
PERMISSION_BITS = 0o777
#: setuid, setgid, sticky: stripped on the mirror unless asked for (``--special-bits``).
SPECIAL_BITS = 0o7000
#: Always set on a mirrored folder (the mirror must be able to write into it).
DIR_OWNER_BITS = 0o700
_MAX_TARGET = 4095  # octets of a link target (PATH_MAX - 1)
_MAX_MTIME = (1 << 63) - 1


class MetaError(UnsafePathError):
    """A header or option describing an entry cannot be used (a broken or hostile peer)."""


class Kind(Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


class LinkPolicy(Enum):
    """What a mirror does with a symbolic link under what it mirrors."""

    SKIP = "skip"  # not mirrored; one warning line per link
    LINKS = "links"  # made a link in DEST (the server sends only links that stay inside)
    COPY = "copy"  # the content of the file it leads to (inside the mount) arrives instead


@dataclass(frozen=True, slots=True)
class EntryMeta:
    """What the headers of a CREATE say beyond the content (checked, see ``parse_entry``)."""

    kind: Kind = Kind.FILE
    mode: int | None = None  # permission bits as the server has them (0..0o7777)
    mtime_ns: int | None = None
    target: str = ""  # links: a target checked by check_link_target
    touch: bool = False  # files: the content is the one the client has; set mode/mtime
    skip: str = ""  # links the server does not offer: why


#: Permission bits -> their ``mode`` header text (at most 4,096 entries: every file
#: sent formats its mode, and a tree holds a handful of distinct ones).
_MODE_TEXT: dict[int, str] = {}
#: ``mode`` header texts already checked -> their bits (at most ``_MAX_MODE_TEXTS``: the
#: text comes from the wire, so a hostile server cannot grow it without end).
_MODE_BITS: dict[str, int] = {}
_MAX_MODE_TEXTS = 4096


def format_mode(mode: int) -> str:
    bits = mode & 0o7777
    text = _MODE_TEXT.get(bits)
    if text is None:
        text = _MODE_TEXT[bits] = format(bits, "o")
    return text


def _parse_mode(text: str) -> int:
    mode = _MODE_BITS.get(text)
    if mode is not None:
        return mode
    if not (1 <= len(text) <= 6 and all(c in "01234567" for c in text)):
        raise MetaError(f"mode {text[:20]!r} is not octal permission bits")
    mode = int(text, 8)
    if mode > 0o7777:
        raise MetaError(f"mode {text!r} has bits beyond 7777")
    if len(_MODE_BITS) < _MAX_MODE_TEXTS:
        _MODE_BITS[text] = mode
    return mode


def _parse_mtime(text: str) -> int:
    digits = text[1:] if text.startswith("-") else text
    if not (1 <= len(digits) <= 19 and digits.isascii() and digits.isdigit()):
        raise MetaError(f"mtime_ns {text[:30]!r} is not a number of nanoseconds")
    value = int(text)
    if abs(value) > _MAX_MTIME:
        raise MetaError(f"mtime_ns {text[:30]!r} out of range")
    return value


def parse_mode(text: str) -> int:
    """A ``mode`` header: permission bits (0..0o7777); ``MetaError`` when it is not."""
    return _parse_mode(text)


def parse_mask(text: str) -> int:
    """The ``META`` option: which permission bits the mirror applies (777 or 7777)."""
    mask = _parse_mode(text)
    if mask & PERMISSION_BITS != PERMISSION_BITS:
        raise MetaError(f"META {text!r}: the mask must keep the rwx bits")
    return mask


def local_mode(mode: int, mask: int, kind: Kind) -> int:
    """The permission bits a mirror with ``mask`` gives an entry published with ``mode``."""
    bits = mode & mask
    return bits | DIR_OWNER_BITS if kind is Kind.DIR else bits


def check_link_target(link: Sequence[str], target: str) -> str:
    """``target`` if a link at relative ``link`` parts may say it, else ``MetaError``.

    Accepted: relative, canonical (``..`` only as leading components, then plain
    names), climbing at most to the root the link is under.  Where every folder
    is a real one and every link obeys the same rule (what a mirror makes), such
    a link cannot lead out of the root, whatever other links it passes through.
    """
    if not target:
        raise MetaError("empty link target")
    if len(target.encode("utf-8", "surrogatepass")) > _MAX_TARGET:
        raise MetaError("link target too long")
    if target.startswith("/"):
        raise MetaError(f"link target {target[:100]!r} is absolute")
    if any(ord(c) < 0x20 or c in "\x7f\\" for c in target):
        raise MetaError(f"link target {target[:100]!r}: control character or backslash")
    parts = target.split("/")
    up = 0
    while up < len(parts) and parts[up] == "..":
        up += 1
    if any(p in ("", ".", "..") for p in parts[up:]):
        raise MetaError(f"link target {target[:100]!r} is not canonical ('.', '..' or '//')")
    if up > len(link) - 1:
        raise MetaError(f"link target {target[:100]!r} climbs above the root")
    return target


def canonical_target(link: Sequence[str], resolved: Sequence[str]) -> str:
    """The canonical relative target from the link at ``link`` to ``resolved`` (both
    parts under the same root); ``MetaError`` when there is none (the root itself from
    the root's own level)."""
    parent = list(link[:-1])
    common = 0
    while common < min(len(parent), len(resolved)) and parent[common] == resolved[common]:
        common += 1
    up, rest = len(parent) - common, list(resolved[common:])
    if not rest and not up:  # the link's own folder: say it by its name from one level up
        if not parent:
            raise MetaError(f"{'/'.join(link)!r} leads to the root itself")
        up, rest = 1, [parent[-1]]
    return "/".join([".."] * up + rest)


_KINDS = {kind.value: kind for kind in Kind}


def parse_entry(headers: Mapping[str, str], link: Sequence[str]) -> EntryMeta:
    """The checked ``EntryMeta`` of a CREATE's last chunk at ``link`` parts; ``MetaError``
    for a header that cannot be true (unknown kind, bad mode or mtime, a link target
    that would lead out of DEST)."""
    kind_text = headers.get(HEADER_KIND)
    kind = Kind.FILE if kind_text is None else _KINDS.get(kind_text)  # (no Enum call)
    if kind is None:
        raise MetaError(f"unknown kind {(kind_text or '')[:30]!r}")
    mode_text = headers.get(HEADER_MODE)
    # (a mode text checked before, and an mtime of 1-18 digits -- always in range --
    # are taken here: one call fewer each per file; anything else is checked in full)
    mode = None if mode_text is None else _MODE_BITS.get(mode_text)
    if mode is None and mode_text is not None:
        mode = _parse_mode(mode_text)
    mtime_text = headers.get("mtime_ns")
    if mtime_text is None:
        mtime = None
    elif len(mtime_text) <= 18 and mtime_text.isdigit() and mtime_text.isascii():
        mtime = int(mtime_text)
    else:
        mtime = _parse_mtime(mtime_text)
    target = ""
    skip = ""
    if kind is Kind.SYMLINK:
        skip = headers.get(HEADER_SKIP, "")[:200]
        if not skip:
            target = check_link_target(link, headers.get(HEADER_TARGET, ""))
    touch = headers.get(HEADER_TOUCH) == "1"
    if touch and kind is not Kind.FILE:
        raise MetaError(f"touch of a {kind.value}")
    return EntryMeta(kind, mode, mtime, target, touch, skip)


def attr_file(mode: int, mtime_ns: int) -> str:
    """What an ``ATTRS`` line says after the name (and a tab) for a file."""
    return f"f\t{mode & 0o7777:o}\t{mtime_ns}"


def attr_dir(mode: int) -> str:
    return f"d\t{mode & 0o7777:o}"


def attr_link(target: str) -> str:
    return f"l\t{target}"


def attr_kind(attr: str) -> Kind | None:
    """The kind an ``ATTRS`` value names (None: a line that names none)."""
    return _ATTR_KINDS.get(attr[:2])


_ATTR_KINDS = {"f\t": Kind.FILE, "d\t": Kind.DIR, "l\t": Kind.SYMLINK}


def decode_attrs(text: str) -> dict[str, str]:
    """``ATTRS`` lines as {relative name: what follows the name}, compared as text with
    ``attr_file``/``attr_dir``/``attr_link`` of what the server has: a line that
    says anything else (malformed, another spelling) matches nothing, so that entry
    is sent again.  (One split per line: ~0.5 us each.)"""
    if not text:
        return {}
    pairs = list(map(_SPLIT_NAME, text.split("\n")))  # (C-level passes: ~2x faster)
    if set(map(len, pairs)) == {2}:
        return dict(pairs)
    return dict(pair for pair in pairs if len(pair) == 2)


_SPLIT_NAME = methodcaller("split", "\t", 1)
