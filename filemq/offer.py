"""What a server sends a client for one entry of a mount: the ``FileOp`` and whether
the client's copy already matches it.

``filemq.server`` decides *which* names a client gets (subscriptions, deny list,
mounts, patterns); this module turns one indexed entry into the operation for that
client, following ``filemq.meta``:

* a file: its content with ``mode`` (every client), or -- for a ``META`` client
  whose copy has the same SHA-1 but another mode or mtime -- a ``touch``;
* a folder (``META`` clients): ``kind=dir`` and ``mode``;
* a symbolic link (``META`` clients), by the client's ``LinkPolicy`` and the
  server's ``links`` switch.  A link is resolved below its mount
  (``filemq.paths.resolve_beneath``: never followed out, not even to look).  It is
  offered only when it leads to something the mount publishes (in its index, or
  the mount's root) under the client's subscription: as a link with a canonical
  target (``links`` and ``skip`` clients: the latter only log it), or -- ``copy``
  clients, a link to a file -- as that file's content under the link's name.
  Anything else (leads out, dangles, loops, a folder for ``copy``, links off on
  the server) is a ``skip`` notice naming the reason: the mirror logs one line.
* a delete carries ``kind`` (what the client has there), so the client knows this
  server mirrors folders itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from filemq.engine import HEADER_MTIME, HEADER_SHA1, HEADER_SIZE, Operation
from filemq.engine_server import FileOp
from filemq.index import NODE_DIR, FileEntry, FileIndex, Node
from filemq.meta import (
    HEADER_KIND,
    HEADER_MODE,
    HEADER_SKIP,
    HEADER_TARGET,
    HEADER_TOUCH,
    Kind,
    LinkPolicy,
    MetaError,
    attr_dir,
    attr_file,
    attr_link,
    canonical_target,
    format_mode,
    local_mode,
)
from filemq.paths import UnsafePathError, local_parts, resolve_beneath

__all__ = [
    "LinkOffer",
    "delete_op",
    "file_op",
    "node_offer",
    "node_unchanged",
    "touch_op",
    "unchanged",
]


def file_op(name: str, entry: FileEntry, source: str = "", source_name: str = "") -> FileOp:
    """Send the content of ``entry`` as virtual ``name`` (``source``: see ``FileOp``)."""
    return FileOp(
        name,
        Operation.CREATE,
        source,
        entry.size,
        entry.mtime_ns,
        entry.sha1,
        inode=entry.inode,
        mode=entry.mode,
        source_name=source_name,
    )


def touch_op(name: str, entry: FileEntry) -> FileOp:
    """The client has this content: set mode and mtime only."""
    headers = [
        (HEADER_TOUCH, "1"),
        (HEADER_SHA1, entry.sha1),
        (HEADER_SIZE, str(entry.size)),
        (HEADER_MTIME, str(entry.mtime_ns)),
    ]
    if entry.mode >= 0:
        headers.append((HEADER_MODE, format_mode(entry.mode)))
    return FileOp(name, Operation.CREATE, headers=tuple(headers))


def delete_op(name: str, kind: Kind = Kind.FILE) -> FileOp:
    return FileOp(name, Operation.DELETE, headers=((HEADER_KIND, kind.value),))


def _dir_op(name: str, node: Node) -> FileOp:
    headers = ((HEADER_KIND, Kind.DIR.value), (HEADER_MODE, format_mode(node.mode)))
    return FileOp(name, Operation.CREATE, headers=headers)


def _link_op(name: str, target: str) -> FileOp:
    headers = ((HEADER_KIND, Kind.SYMLINK.value), (HEADER_TARGET, target))
    return FileOp(name, Operation.CREATE, headers=headers)


def _skip_op(name: str, reason: str) -> FileOp:
    headers = ((HEADER_KIND, Kind.SYMLINK.value), (HEADER_SKIP, reason))
    return FileOp(name, Operation.CREATE, headers=headers)


def unchanged(entry: FileEntry, name: str, attrs: Mapping[str, str], mask: int) -> FileOp | None:
    """None when a ``META`` client's copy of file ``entry`` matches it; else the touch
    op when only mode or mtime differ (a different SHA-1 is the caller's full send)."""
    attr = attrs.get(name)
    if attr is not None and (
        attr == attr_file(local_mode(entry.mode, mask, Kind.FILE), entry.mtime_ns)
        if entry.mode >= 0
        else attr.startswith("f\t") and attr.endswith(f"\t{entry.mtime_ns}")
    ):
        return None
    return touch_op(name, entry)


@dataclass(frozen=True, slots=True)
class LinkOffer:
    """What a client gets for one folder or link, and what it leads to (copied links)."""

    op: FileOp
    copied_from: str = ""  # relative name in the mount whose content a copy sends
    entry: FileEntry | None = None  # that file's entry


def node_offer(
    name: str,
    node: Node,
    *,
    directory: Path,
    index: FileIndex,
    base: str,
    prefix: str,
    policy: LinkPolicy,
    links_on: bool,
    published: Callable[[str], bool],
) -> LinkOffer:
    """The op for folder or link ``node`` of the mount at ``directory`` (virtual
    ``prefix``), seen as virtual ``name`` by a client whose DEST is subscription
    ``base`` (ends with '/').  ``published(virtual)``: may the client see that name
    (not denied, not under another mount)."""
    if node.kind == NODE_DIR:
        return LinkOffer(_dir_op(name, node))
    if not links_on:
        return LinkOffer(_skip_op(name, "the server does not publish links"))
    try:
        resolved = resolve_beneath(directory, local_parts(node.name))
    except FileNotFoundError:
        return LinkOffer(_skip_op(name, "dangling"))
    except (UnsafePathError, OSError) as exc:
        why = "leads outside what the server publishes"
        if "levels of links" in str(exc):
            why = "too many levels of links"
        return LinkOffer(_skip_op(name, why))
    rel = "/".join(resolved)
    virtual = prefix + rel  # (prefix ends with '/': the mount's root when rel is "")
    entry = index.get(rel) if rel else None
    if rel and (index.lookup(rel) is None or not published(virtual)):
        return LinkOffer(_skip_op(name, "leads to a name the server does not publish"))
    if policy is LinkPolicy.COPY:
        if entry is None:
            return LinkOffer(_skip_op(name, "leads to a folder: not copied"))
        return LinkOffer(file_op(name, entry, os.path.join(directory, rel), virtual), rel, entry)
    if not (name.startswith(base) and (virtual + "/").startswith(base)):
        return LinkOffer(_skip_op(name, "leads outside the mirrored path"))
    link_parts = name[len(base) :].split("/")
    target_rel = virtual[len(base) :].strip("/")
    try:
        target = canonical_target(link_parts, target_rel.split("/") if target_rel else [])
    except MetaError as exc:
        return LinkOffer(_skip_op(name, str(exc)[:200]))
    return LinkOffer(_link_op(name, target))


def node_unchanged(
    offer: LinkOffer, node: Node, name: str, attrs: Mapping[str, str], mask: int
) -> bool:
    """Does a ``META`` client's ``ATTRS`` say it has what ``offer`` would make?"""
    attr = attrs.get(name)
    if attr is None:
        return False
    if node.kind == NODE_DIR:
        return attr == attr_dir(local_mode(node.mode, mask, Kind.DIR))
    target = dict(offer.op.headers).get(HEADER_TARGET)
    return target is not None and attr == attr_link(target)
