"""``FileIndex.refresh`` (the server's start check, a mirror's check of DEST) never reads
through a folder swapped for a link while it walks: the swap is made by the walk's own
exclude test, so it lands between two folders every time (no timing)."""

from __future__ import annotations

import os
from pathlib import Path

from filemq.index import FileIndex

#: Files in each of the two folders.
_LONG = 128


def test_a_folder_swapped_for_a_link_mid_refresh_is_not_read_through(tmp_path: Path) -> None:
    """The walk's exclude test runs as it goes: at the first name of one folder it swaps
    the other (not walked yet, long enough for two threads) for a link to a folder
    outside the root.  The refresh must index nothing of the outside, and the folder
    walked first whole (a fresh index, and a loaded one: its folders are compared with
    the saved rows at once)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for i in range(_LONG):
        (outside / f"secret{i:03d}").write_bytes(b"secret")
    root = tmp_path / "root"
    root.mkdir()
    for folder in ("a", "b"):
        (root / folder).mkdir()
        for i in range(_LONG):
            (root / folder / f"f{i:03d}").write_bytes(b"mine %d" % i)
    made = FileIndex(root)
    made.refresh()
    saved = tmp_path / "index"
    made.save(saved)

    for loaded in (False, True):
        walked: list[str] = []  # the folder met first, then the one swapped

        def swap_other(name: str, walked: list[str] = walked) -> bool:
            folder = name.split("/")[0]
            if "/" in name and not walked:
                other = "b" if folder == "a" else "a"
                os.rename(root / other, tmp_path / "moved")
                os.symlink(outside, root / other)
                walked += [folder, other]
            return False

        if loaded:
            index = FileIndex.load(saved, root, exclude=swap_other)
            assert index.loaded
        else:
            index = FileIndex(root, exclude=swap_other)
        index.refresh()
        assert walked, "the walk met a folder and swapped the other"
        first, other = walked
        names = set(index.names())
        assert not any("secret" in n for n in names), sorted(names)[:5]
        mine = {f"{first}/f{i:03d}" for i in range(_LONG)}
        assert {n for n in names if n.startswith(f"{first}/")} == mine
        os.unlink(root / other)  # (back as it was for the next round)
        os.rename(tmp_path / "moved", root / other)
