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

The symlink policy, in one function (``open_dir_beneath``): **below a root no
symbolic link is ever followed**.  The root itself is opened as given (it may be
a link: that is the operator's choice); from there every component is opened
relative to its parent's descriptor with ``O_NOFOLLOW``, so a link planted (or
swapped in) anywhere below the root ends the walk instead of leading out, and
nothing checked is ever looked up again by path (no check-then-use race).  Every
place in filemq that opens, stats, lists, hashes, writes or deletes a path under
a root goes through it:

* ``open_beneath``: open a file (or a folder to list) under a root;
* ``lstat_beneath``: what a name is, without following it;
* ``replace_beneath``: rename a finished temp file into place, creating folders;
* ``remove_beneath``: delete a file and the folders it leaves empty;
* ``safe_target``: the same checks for a name about to be written;
* ``readlink_beneath`` / ``resolve_beneath``: what a symbolic link below the root says,
  and where it leads -- resolved one component at a time through the same walk, links
  on the way followed only while they stay below the root (``OutsideRootError`` as
  soon as one leads out, dangles into a folder that is not there, or loops);
* ``set_attrs_beneath``: permission bits and mtime of a file or folder (never of a link);
* ``rmdir_beneath``: remove an empty folder.

A link, or a non-folder where a folder is needed, raises ``OutsideRootError``
(an ``UnsafePathError``); a missing component raises ``FileNotFoundError``; any
other ``OSError`` (permission denied, I/O error) is passed on unchanged, so a
caller can tell "not there" from "there but unreadable".  POSIX only (``openat``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Collection, Sequence
from pathlib import Path

from filemq.engine import FilemqError

__all__ = [
    "OutsideRootError",
    "UnsafePathError",
    "absent",
    "all_relative_safe",
    "local_parts",
    "lstat_beneath",
    "open_beneath",
    "open_dir_beneath",
    "open_in",
    "readlink_beneath",
    "relative_inside",
    "relative_parts",
    "remove_beneath",
    "replace_beneath",
    "replace_in",
    "resolve_beneath",
    "rmdir_beneath",
    "safe_target",
    "set_attrs_beneath",
    "under_prefix",
    "virtual_path",
]


class UnsafePathError(FilemqError, ValueError):
    """A name would escape its root or is not a plain relative file name."""


class OutsideRootError(UnsafePathError):
    """A component below the root is a symbolic link or not a folder: it could lead out."""


Root = str | os.PathLike[str] | int
"""A root folder: its path, or a descriptor of it (borrowed, never closed here)."""


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
    """Components of a relative file name, or ``UnsafePathError``.

    First a few scans in C that accept only names ``_checked_parts`` accepts too
    (printable ASCII, no backslash, no '//', no leading or trailing '/', no component
    starting with '.', no ':' second): a mirror checks every file's name, and
    ``_SUSPECT``'s search cost ~10,000 instructions per name (callgrind, session 19);
    any other name gets the full checks."""
    if (
        name.isascii()
        and name.isprintable()
        and "\\" not in name
        and "//" not in name
        and "/." not in name
        and name[:1] not in _NOT_FIRST
        and name[-1:] != "/"
        and name[1:2] != ":"
    ):
        return tuple(name.split("/"))
    return _checked_parts(name)


#: A first character that needs the full checks ('' is an empty name).
_NOT_FIRST = frozenset(("", "/", "."))


def _checked_parts(name: str) -> tuple[str, ...]:
    """``relative_parts`` with every check (the name did not pass its quick scans)."""
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


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# A folder on the way is only walked through (Linux: O_PATH needs search permission, not
# read); the one to list is opened for reading.
_STEP = getattr(os, "O_PATH", os.O_RDONLY) | _DIRECTORY | _NOFOLLOW | _CLOEXEC
_ROOT = os.O_RDONLY | _DIRECTORY | _CLOEXEC
_NOT_THERE_BUT_IN_THE_WAY = (errno.ENOTDIR, errno.ELOOP)


def relative_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> str | None:
    """``path`` relative to ``root`` ('/'-separated; '' when equal) if, once both are
    resolved, it is ``root`` or below it; else None.  (To keep a program's own files --
    a server's state, a mirror's index -- out of what it publishes or mirrors.)"""
    real_root, real = os.path.realpath(root), os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        return None
    inner = os.path.relpath(real, real_root)
    return "" if inner == "." else Path(inner).as_posix()


def absent(exc: BaseException) -> bool:
    """Does an error from the functions here mean "no such file under the root"?

    True for a missing component and for a link or non-folder in the way; False
    for anything else (permission denied, I/O error...): the name is there but
    cannot be read, which is never a reason to delete a copy of it.
    """
    return isinstance(exc, FileNotFoundError | UnsafePathError)


def _check_part(part: str) -> None:
    if part in ("", ".", "..") or "/" in part or "\0" in part:
        raise UnsafePathError(f"{part!r}: not a plain name component")


def local_parts(name: str) -> tuple[str, ...]:
    """Components of a '/'-separated name of a file on disk under a root.

    Looser than ``relative_parts`` (the rule for names from the wire): a local
    file may have a backslash, a colon or a control character in its name.
    Refused: an empty name or component, '.', '..', NUL (``UnsafePathError``).
    """
    parts = tuple(name.split("/"))
    for part in parts:
        _check_part(part)
    return parts


def _in_the_way(parent: int, parts: Sequence[str], depth: int) -> OutsideRootError:
    """Why ``parts[depth]`` could not be walked through (a link, or not a folder)."""
    name = "/".join(parts)
    try:
        st = os.stat(parts[depth], dir_fd=parent, follow_symlinks=False)
    except OSError:
        return OutsideRootError(f"{name!r}: {parts[depth]!r} is not a plain folder")
    what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder"
    return OutsideRootError(f"{name!r}: {'/'.join(parts[: depth + 1])!r} is {what}")


def _open_root(root: Root) -> int:
    return os.dup(root) if isinstance(root, int) else os.open(root, _ROOT)


def open_dir_beneath(root: Root, parts: Sequence[str], *, create: bool = False) -> int:
    """THE symlink policy: a descriptor of folder ``root/parts...``, no link followed.

    Each component is opened relative to the previous one with ``O_NOFOLLOW``;
    a link or a non-folder raises ``OutsideRootError``, a missing one
    ``FileNotFoundError`` (with ``create``, missing folders are made instead).
    The caller closes the returned descriptor (``O_PATH`` on Linux: good for
    ``*at`` calls, not for reading; use ``open_beneath`` to list a folder).
    """
    for part in parts:
        _check_part(part)
    fd = _open_root(root)
    try:
        for depth, part in enumerate(parts):
            try:
                step = os.open(part, _STEP, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
                try:
                    step = os.open(part, _STEP, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in _NOT_THERE_BUT_IN_THE_WAY:
                        raise _in_the_way(fd, parts, depth) from None
                    raise
            except OSError as exc:
                if exc.errno in _NOT_THERE_BUT_IN_THE_WAY:
                    raise _in_the_way(fd, parts, depth) from None
                raise
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_beneath(
    root: Root, parts: Sequence[str], flags: int = os.O_RDONLY, mode: int = 0o666
) -> int:
    """Open ``root/parts...`` with ``flags``, following no link below ``root``.

    The last component is opened with ``O_NOFOLLOW`` too: a link there raises
    ``OutsideRootError``, like a link on the way.  With ``os.O_DIRECTORY`` in
    ``flags`` the result can be listed (``os.scandir``); ``parts`` may then be
    empty (the root itself).
    """
    if not parts:
        if not flags & _DIRECTORY:
            raise UnsafePathError("empty file name")
        return _open_root(root)
    _check_part(parts[-1])
    parent = open_dir_beneath(root, parts[:-1])
    try:
        return _open_last(parent, parts, flags, mode)
    finally:
        os.close(parent)


def open_in(folder: int, parts: Sequence[str], flags: int = os.O_RDONLY) -> int:
    """``open_beneath`` of ``parts`` with its folder already walked: ``folder`` is a
    descriptor of ``parts[:-1]`` from ``open_dir_beneath`` (the caller keeps it)."""
    _check_part(parts[-1])
    return _open_last(folder, parts, flags, 0o666)


def _open_last(parent: int, parts: Sequence[str], flags: int, mode: int) -> int:
    try:
        return os.open(parts[-1], flags | _NOFOLLOW | _CLOEXEC, mode, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and flags & _DIRECTORY):
            raise _in_the_way(parent, parts, len(parts) - 1) from None
        raise


def lstat_beneath(root: Root, parts: Sequence[str]) -> os.stat_result:
    """``lstat`` of ``root/parts...`` (the last component not followed, nor any before)."""
    if not parts:
        raise UnsafePathError("empty file name")
    _check_part(parts[-1])
    parent = open_dir_beneath(root, parts[:-1])
    try:
        return os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(parent)


def replace_beneath(source: str, root: Root, parts: Sequence[str]) -> None:
    """Rename file ``source`` to ``root/parts...``, making missing folders; no link followed.

    A link at the target itself is replaced (``rename`` never follows it); a
    folder there fails (``IsADirectoryError``).
    """
    _check_part(parts[-1])
    parent = open_dir_beneath(root, parts[:-1], create=True)
    try:
        os.replace(source, parts[-1], dst_dir_fd=parent)
    finally:
        os.close(parent)


def replace_in(source: str, folder: int, name: str) -> None:
    """Rename file ``source`` to ``name`` in the folder descriptor ``folder`` (one from
    ``open_dir_beneath``); ``name`` must be a plain component.  A link at ``name`` is
    replaced, never followed; a folder there fails (``IsADirectoryError``)."""
    _check_part(name)
    os.replace(source, name, dst_dir_fd=folder)


def remove_beneath(root: Root, parts: Sequence[str], *, prune: bool = True) -> bool:
    """Delete file (or link) ``root/parts...`` and, with ``prune``, the folders that
    leaves empty (never the root).

    False when there was nothing to delete.  Nothing outside the root is ever
    touched: the folders are reached through ``open_dir_beneath``.
    """
    _check_part(parts[-1])
    try:
        parent = open_dir_beneath(root, parts[:-1])
    except FileNotFoundError:
        return False
    try:
        os.unlink(parts[-1], dir_fd=parent)
    except (FileNotFoundError, IsADirectoryError):  # (a directory is not that file)
        return False
    finally:
        os.close(parent)
    for depth in range(len(parts) - 1 if prune else 0, 0, -1):  # folders left empty
        try:
            above = open_dir_beneath(root, parts[: depth - 1])
        except OSError:
            break
        try:
            os.rmdir(parts[depth - 1], dir_fd=above)
        except OSError:
            break
        finally:
            os.close(above)
    return True


def safe_target(root: Path, parts: tuple[str, ...], *, directory_ok: bool = False) -> Path:
    """The path of relative ``parts`` under ``root``, refusing links and non-directories.

    Missing parent directories are fine (``replace_beneath`` creates them); an
    existing parent that is a symlink or not a directory is refused, and so is
    a target that is a directory (unless ``directory_ok``: a mirror replacing a
    directory by the server's file).  (A check before receiving a file; the file
    itself is put in place with ``replace_beneath``, which checks again.)
    """
    for part in parts:
        _check_part(part)
    try:
        parent = open_dir_beneath(root, parts[:-1])
    except FileNotFoundError:
        return root.joinpath(*parts)  # the folders that exist were walked: no link
    try:
        st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(st.st_mode) and not directory_ok:
            raise UnsafePathError(f"{'/'.join(parts)!r}: target is a directory")
    finally:
        os.close(parent)
    return root.joinpath(*parts)


_MAX_LINK_HOPS = 40  # links followed while resolving one link (the kernel's limit too)


def readlink_beneath(root: Root, parts: Sequence[str]) -> str:
    """The target of the symbolic link ``root/parts...`` (no link on the way followed).

    ``OSError`` (``EINVAL``) when it is not a link.
    """
    if not parts:
        raise UnsafePathError("empty file name")
    _check_part(parts[-1])
    parent = open_dir_beneath(root, parts[:-1])
    try:
        return os.readlink(parts[-1], dir_fd=parent)
    finally:
        os.close(parent)


def _absolute_inside(root_path: str, target: str) -> list[str]:
    """The parts below ``root_path`` of absolute link ``target``; OutsideRootError if none."""
    for base in dict.fromkeys((os.path.abspath(root_path), os.path.realpath(root_path))):
        if target == base or target.startswith(base.rstrip("/") + "/"):
            return [p for p in target[len(base) :].split("/") if p]
    raise OutsideRootError(f"{target!r}: an absolute target outside the root")


def resolve_beneath(root: str | os.PathLike[str], parts: Sequence[str]) -> tuple[str, ...]:
    """Where the symbolic link ``root/parts...`` leads, as parts below ``root``.

    Resolved as the kernel would, one component at a time, every step through
    ``open_dir_beneath`` / ``lstat_beneath``: a ``..`` above the root, an absolute
    target that is not below the root's path, more than 40 links, or a component
    that is not a folder where one is needed raises ``OutsideRootError``; a missing
    component raises ``FileNotFoundError``.  The result names no link (it may be a
    folder, a file, or the root itself: ``()``).  Nothing is opened but folders on
    the way and the links' own entries: the caller opens the result (``open_beneath``,
    which refuses a link swapped in meanwhile).
    """
    root_path = os.fspath(root)
    for part in parts:
        _check_part(part)
    current: list[str] = list(parts[:-1])
    todo: list[str] = []  # components still to walk, the next one last

    def follow(link: Sequence[str]) -> None:
        nonlocal current
        target = readlink_beneath(root_path, link)
        if not target:
            raise FileNotFoundError(f"{'/'.join(link)!r}: empty link")
        if target.startswith("/"):
            current = []
            todo.extend(reversed(_absolute_inside(root_path, target)))
        else:
            todo.extend(reversed(target.split("/")))

    follow(parts)
    hops = 1
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not current:
                raise OutsideRootError(f"{'/'.join(parts)!r}: leads above the root")
            current.pop()
            continue
        if "\0" in part:
            raise UnsafePathError(f"{part!r}: NUL in a link target")
        st = lstat_beneath(root_path, [*current, part])
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_LINK_HOPS:
                raise OutsideRootError(f"{'/'.join(parts)!r}: too many levels of links")
            follow([*current, part])
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            raise OutsideRootError(f"{'/'.join(parts)!r}: {part!r} is not a folder")
        current.append(part)
    return tuple(current)


_PATH_ONLY = getattr(os, "O_PATH", 0)


def set_attrs_beneath(
    root: Root, parts: Sequence[str], *, mode: int | None = None, mtime_ns: int | None = None
) -> os.stat_result:
    """Set the permission bits and/or mtime of file or folder ``root/parts...``.

    No link is followed, not even the last component: a link there raises
    ``OutsideRootError`` (a link's own mode means nothing on Linux).  The entry is
    pinned by a descriptor first (``O_PATH``: no read permission needed, so a file
    of mode 000 can still be changed), then changed through ``/proc/self/fd``.
    Returns its ``stat`` afterwards.
    """
    fd = open_beneath(root, parts, _PATH_ONLY or os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise OutsideRootError(f"{'/'.join(parts)!r}: not a file or folder")
        where: int | str = fd
        if _PATH_ONLY:
            where = f"/proc/self/fd/{fd}"
        if mode is not None:
            os.chmod(where, mode)
        if mtime_ns is not None:
            os.utime(where, ns=(mtime_ns, mtime_ns))
        return os.fstat(fd)
    finally:
        os.close(fd)


def rmdir_beneath(root: Root, parts: Sequence[str]) -> bool:
    """Remove the empty folder ``root/parts...``; False when it is not there, not a
    folder, or not empty (nothing else is touched)."""
    _check_part(parts[-1])
    try:
        parent = open_dir_beneath(root, parts[:-1])
    except (FileNotFoundError, UnsafePathError):
        return False
    try:
        os.rmdir(parts[-1], dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    finally:
        os.close(parent)
    return True
