"""Safe names: virtual paths on the wire and file paths under a local root.

Two kinds of names cross the FILEMQ wire:

* **virtual paths** (subscription paths, mount points, CHEEZBURGER filenames as
  this server sends them): absolute POSIX-style strings such as ``/docs/a.txt``.
* **relative names** under a local root (the client's DEST, a published
  directory): ``a/b.txt``.

The pure functions here (``virtual_path``, ``relative_parts``, ``under_prefix``)
decide whether a string is acceptable at all.  A relative name is refused when
it is empty, absolute, holds a NUL or any other control character, a
backslash, a drive letter (``C:``), or an empty, ``.`` or ``..`` component.

``safe_target`` and ``make_parents`` touch the file system: they refuse a path
whose parent components are symbolic links or not directories, so a write never
lands outside the root even when the root holds links planted beforehand, and
they check the resolved parent really is inside the resolved root.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Collection
from pathlib import Path

from filemq.engine import FilemqError

__all__ = [
    "UnsafePathError",
    "all_relative_safe",
    "make_parents",
    "relative_parts",
    "safe_target",
    "under_prefix",
    "virtual_path",
]


class UnsafePathError(FilemqError, ValueError):
    """A name would escape its root or is not a plain relative file name."""


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _check_chars(name: str) -> None:
    if "\\" in name:
        raise UnsafePathError(f"{name!r}: backslash in name")
    if _CONTROL.search(name):
        raise UnsafePathError(f"{name!r}: NUL or control character in name")


# Anything wrong with a relative name: control chars, backslash, '.'/'..'/empty parts, '/' ends
_SUSPECT = re.compile(r"[\x00-\x1f\x7f\\]|(?:^|/)\.{0,2}(?:/|$)|^/|^[A-Za-z]:")
# A virtual path that may need normalising or refusing: control chars, backslash, '//',
# '.' or '..' components, a trailing '/' (the root included)
_SUSPECT_VIRTUAL = re.compile(r"[\x00-\x1f\x7f\\]|//|/\.{1,2}(?:/|$)|/$")
# all_relative_safe: what _SUSPECT looks for, as fast scans of '\n'-joined names
_BAD_CHARS = re.compile(r"[\x00-\x09\x0b-\x1f\x7f\\]")
_BAD_COMPONENTS = (
    *("//", "/./", "/../"),  # empty, '.', '..' inside
    *("\n\n", "\n/", "/\n"),  # empty name, absolute, trailing '/'
    *("\n./", "\n../", "/.\n", "/..\n", "\n.\n", "\n..\n"),  # '.', '..' first or last
)


def relative_parts(name: str) -> tuple[str, ...]:
    """Components of a relative file name, or ``UnsafePathError``."""
    if name and _SUSPECT.search(name) is None and name.isascii():
        return tuple(name.split("/"))  # fast path: nothing that needs a closer look
    if not name:
        raise UnsafePathError("empty file name")
    _check_chars(name)
    if name.startswith("/"):
        raise UnsafePathError(f"{name!r}: absolute name where a relative one is needed")
    parts = tuple(name.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafePathError(f"{name!r}: empty, '.' or '..' component")
    if len(parts[0]) >= 2 and parts[0][1] == ":" and parts[0][0].isalpha():
        raise UnsafePathError(f"{name!r}: drive-letter name")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePathError(f"{name!r}: not valid UTF-8") from None
    return parts


def all_relative_safe(names: Collection[str]) -> bool:
    """True when ``relative_parts`` accepts every name (a few fast scans over all of them).

    False means at least one name needs a closer look (or is refused).
    """
    if not names:
        return True
    text = "\n" + "\n".join(names) + "\n"  # every name between two '\n'
    if text.count("\n") != len(names) + 1:
        return False  # a name holds '\n'
    if ":" in text or _BAD_CHARS.search(text) is not None:
        return False  # (a ':' may be a drive letter: rare, left to the closer look)
    if any(bad in text for bad in _BAD_COMPONENTS):
        return False
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return False
    return True


def virtual_path(path: str, *, directory: bool = False) -> str:
    """Normalise a virtual path: leading '/', no '.'/'..', no doubled '/'.

    With ``directory`` the result ends in '/' (so a prefix match stops at a
    component boundary); the root is always ``/``.
    """
    if not path.startswith("/"):
        raise UnsafePathError(f"{path!r}: virtual paths start with '/'")
    if _SUSPECT_VIRTUAL.search(path) is None:  # fast path: already normal
        return path + "/" if directory else path
    _check_chars(path)
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise UnsafePathError(f"{path!r}: '.' or '..' component")
    out = "/" + "/".join(parts)
    if directory and out != "/":
        out += "/"
    return out


def under_prefix(name: str, prefix: str) -> str | None:
    """The part of virtual ``name`` after directory ``prefix`` (ending '/'), else None."""
    if prefix == "/":
        rest = name[1:] if name.startswith("/") else None
    else:
        rest = name[len(prefix) :] if name.startswith(prefix) else None
    return rest or None


def _is_within(child: str, root: str) -> bool:
    return child == root or child.startswith(root.rstrip(os.sep) + os.sep)


def safe_target(root: Path, parts: tuple[str, ...], *, directory_ok: bool = False) -> Path:
    """The path of relative ``parts`` under ``root``, refusing links and non-directories.

    Missing parent directories are fine (``make_parents`` creates them); an
    existing parent that is a symlink or not a directory is refused, and so is
    a target that is a directory (unless ``directory_ok``: a mirror replacing a
    directory by the server's file).
    """
    current = root
    for part in parts[:-1]:
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(f"{'/'.join(parts)!r}: path goes through a symlink")
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(f"{'/'.join(parts)!r}: a parent is not a directory")
    target = root.joinpath(*parts)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(st.st_mode) and not directory_ok:
            raise UnsafePathError(f"{'/'.join(parts)!r}: target is a directory")
    real_root = os.path.realpath(root)
    deepest = target.parent
    while not deepest.exists() and deepest != root:
        deepest = deepest.parent
    if not _is_within(os.path.realpath(deepest), real_root):
        raise UnsafePathError(f"{'/'.join(parts)!r}: resolves outside the root")
    return target


def make_parents(root: Path, parts: tuple[str, ...]) -> None:
    """Create the parent directories of ``parts`` under ``root`` without following links."""
    current = root
    for part in parts[:-1]:
        current = current / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(current)
        st = os.lstat(current)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(f"{'/'.join(parts)!r}: a parent is not a plain directory")
