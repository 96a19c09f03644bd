"""A mirror whose DEST is inside what it mirrors would copy itself without end.

``filemq sync pub/loop`` against a server publishing ``pub``: each file the
mirror writes under ``pub/loop`` is published again, sent again and written one
folder deeper (``pub/loop/loop/...``), for ever.  Only the server's machine can
tell, and only if it knows where the mirror writes, so:

* the client names its DEST in every ICANHAZ, as the option
  ``MIRROR-DEST`` (``filemq.engine.OPTION_MIRROR_DEST``): this machine's
  identity (Linux boot id, else host name), DEST's device and inode numbers and
  its real path (``dest_option``);
* the server (``locate_dest``) ignores the option unless the identity is its
  own and that path really is that folder (same device and inode), then walks
  from it up to ``/`` comparing each folder with its mounts' directories
  (device and inode again, so links and bind mounts do not hide a loop).  When
  DEST is inside a mount whose virtual tree overlaps the subscription, the
  ICANHAZ is refused with SRSLY, before a single file is copied.

Other FILEMQ peers ignore an option they do not know.  The option tells the
server DEST's path: a server that serves you files learns where you keep them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["dest_option", "locate_dest"]

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@functools.cache
def _machine() -> str:
    """This machine (and boot): the Linux boot id, else the host name (no spaces)."""
    try:
        with open(_BOOT_ID, "rb") as f:
            found = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        found = ""
    if not found:
        import socket  # (deferred: start-up time of `filemq sync`)

        found = socket.gethostname()
    return found.replace(" ", "_") or "unknown"


def dest_option(dest: str | os.PathLike[str]) -> str:
    """The ``MIRROR-DEST`` value for an existing folder ``dest`` (client side)."""
    real = os.path.realpath(dest)
    st = os.stat(real)
    return f"{_machine()} {st.st_dev} {st.st_ino} {real}"


def locate_dest(value: str, roots: Sequence[str | os.PathLike[str]]) -> list[tuple[int, str]]:
    """Where the DEST described by ``value`` is below ``roots`` (server side).

    ``(index in roots, DEST relative to that root)`` for every root DEST is in
    or equal to (relative name '' then), innermost first; empty when DEST is on
    another machine, has moved, or is in none of them.
    """
    try:
        machine, dev, ino, path = value.split(" ", 3)
        identity = (int(dev), int(ino))
    except ValueError:
        return []
    if machine != _machine() or not os.path.isabs(path):
        return []
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return []
    if (st.st_dev, st.st_ino) != identity:
        return []  # not this folder: another machine with the same boot id, or moved
    by_id: dict[tuple[int, int], list[int]] = {}
    for i, root in enumerate(roots):
        try:
            rs = os.stat(root)
        except OSError:
            continue
        by_id.setdefault((rs.st_dev, rs.st_ino), []).append(i)
    found: list[tuple[int, str]] = []
    current, below = Path(path), list[str]()
    while True:
        try:
            cs = os.stat(current)
        except OSError:
            break
        for i in by_id.get((cs.st_dev, cs.st_ino), ()):
            found.append((i, "/".join(reversed(below))))
        if current.parent == current:
            break
        below.append(current.name)
        current = current.parent
    return found
