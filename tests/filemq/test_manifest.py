"""FILEMQ manifests made in one process: contents, import as a server index, diff, CLI."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import xxhash
import zmq

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from filemq import manifest  # noqa: E402
from filemq.cli import main  # noqa: E402
from filemq.index import FileIndex  # noqa: E402
from filemq.server import FileServer, Mount  # noqa: E402


def _tree(root: Path) -> dict[str, bytes]:
    files = {
        "a.txt": b"alpha\n",
        "empty": b"",
        "d/b.bin": os.urandom(3 * 1024 * 1024 + 7),  # more than one read buffer
        "d/e/f/deep.txt": b"deep",
        "caf\u00e9.txt": b"non-ascii name",
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "d" / "outside").symlink_to("/etc/passwd")  # a link: never followed
    (root / "loop").symlink_to(root)
    os.mkfifo(root / "fifo")  # not a regular file: never opened
    return files


def test_build_hashes_every_regular_file_and_nothing_else(tmp_path: Path) -> None:
    files = _tree(tmp_path)
    table, stats = manifest.build(tmp_path)
    assert table.column_names == list(manifest.COLUMNS)
    rows = table.to_pylist()
    assert [r["path"] for r in rows] == sorted(files)
    for row in rows:
        data = files[row["path"]]
        st = (tmp_path / row["path"]).stat()
        assert row == {
            "path": row["path"],
            "size": len(data),
            "mtime_ns": st.st_mtime_ns,
            "sha1": hashlib.sha1(data).hexdigest(),
            "xxh3": xxhash.xxh3_64(data).hexdigest(),
        }
    assert stats == manifest.ManifestStats(len(files), sum(map(len, files.values())), 0)
    index = FileIndex(tmp_path)  # what a FILEMQ server indexes: the same files
    index.refresh()
    assert {e.name: e.sha1 for e in index} == {r["path"]: r["sha1"] for r in rows}


def test_an_unreadable_file_is_counted_and_left_out(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    _tree(tmp_path)
    (tmp_path / "secret").write_bytes(b"x")
    (tmp_path / "secret").chmod(0)
    table, stats = manifest.build(tmp_path)
    assert stats.unreadable == 1 and "secret" not in table.column("path").to_pylist()


def test_write_refuses_an_existing_path_and_leaves_no_temp_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _tree(root)
    table, _ = manifest.build(root)
    out = tmp_path / "m.parquet"
    manifest.write(table, out)
    before = out.read_bytes()
    with pytest.raises(manifest.ManifestError, match="already exists"):
        manifest.write(table, out)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.parquet", "root"]
    assert manifest.read(out).to_pylist() == table.to_pylist()


def _manifest_of(root: Path, out: Path, tamper: dict[str, str] | None = None) -> Path:
    """Write ``root``'s manifest at ``out``; ``tamper``: path -> SHA-1 written instead."""
    table, _ = manifest.build(root)
    rows = table.to_pylist()
    for row in rows:
        row["sha1"] = (tamper or {}).get(row["path"], row["sha1"])
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), out)
    return out


def _start_stop(context: zmq.Context[Any], root: Path, state: Path) -> FileServer:
    server = FileServer(context, [Mount(root, "/")], endpoint="tcp://127.0.0.1:*", state_dir=state)
    server.start()
    server.stop()
    return server


def test_imported_manifest_makes_server_startup_skip_hashing(
    tmp_path: Path, zctx: zmq.Context[Any]
) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    root.mkdir()
    files = _tree(root)
    # A SHA-1 no hashing of the file gives: only a server that trusted the manifest has it
    planted = "0123456789" * 4
    m = _manifest_of(root, tmp_path / "m.parquet", tamper={"d/b.bin": planted})
    assert main(["manifest", "import", str(m), str(root), "--state-dir", str(state)]) == 0
    server = _start_stop(zctx, root, state)
    index = server.indexes["/"]
    assert index.hashed_files == 0 and len(index) == len(files)
    entry = index.get("d/b.bin")
    assert entry is not None and entry.sha1 == planted
    # the control: without the import the same start hashes every file
    fresh = _start_stop(zctx, root, tmp_path / "other-state")
    assert fresh.indexes["/"].hashed_files == len(files)
    real = fresh.indexes["/"].get("d/b.bin")
    assert real is not None and real.sha1 == hashlib.sha1(files["d/b.bin"]).hexdigest()


def test_import_trusts_a_row_only_for_the_file_it_describes(
    tmp_path: Path, zctx: zmq.Context[Any]
) -> None:
    """Changed since the manifest (size or mtime), gone, replaced by a folder: hashed at
    start-up as without a manifest; rows that cannot name a file here are refused."""
    root, state = tmp_path / "root", tmp_path / "state"
    root.mkdir()
    _tree(root)
    m = _manifest_of(root, tmp_path / "m.parquet")
    rows = manifest.read(m).to_pylist()
    rows.append({**rows[0], "path": "../escape"})
    rows.append({**rows[0], "path": "/etc/passwd"})
    rows.append({**rows[0], "path": "bad-sha1", "sha1": "zz"})
    b_row = next(r for r in rows if r["path"] == "d/b.bin")
    (root / "through").symlink_to(root / "d")
    rows.append({**b_row, "path": "through/b.bin"})  # the same file, reached through a link
    pq.write_table(pa.Table.from_pylist(rows), m)
    (root / "a.txt").write_bytes(b"ALPHA\n")  # same size, new mtime
    st = (root / "a.txt").stat()
    os.utime(root / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
    (root / "empty").unlink()
    (root / "d" / "e" / "f" / "deep.txt").unlink()
    (root / "d" / "e" / "f" / "deep.txt").mkdir()
    result = manifest.import_index(m, root, tmp_path / "index")
    assert result == manifest.ImportResult(imported=2, stale=4, refused=3)
    (tmp_path / "index").rename(tmp_path / "keep")
    assert main(["manifest", "import", str(m), str(root), "--state-dir", str(state)]) == 0
    index = _start_stop(zctx, root, state).indexes["/"]
    assert index.hashed_files == 1  # a.txt only
    a = index.get("a.txt")
    assert a is not None and a.sha1 == hashlib.sha1(b"ALPHA\n").hexdigest()
    assert "empty" not in index and "../escape" not in index and "through/b.bin" not in index


def test_import_for_a_mirror_and_at_a_virtual_path(tmp_path: Path, zctx: zmq.Context[Any]) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    root.mkdir()
    _tree(root)
    m = _manifest_of(root, tmp_path / "m.parquet")
    assert main(["manifest", "import", str(m), str(root), "--at", "/docs",
                 "--state-dir", str(state)]) == 0  # fmt: skip
    server = FileServer(zctx, [Mount(root, "/docs")], endpoint="tcp://127.0.0.1:*",
                        state_dir=state)  # fmt: skip
    server.start()
    server.stop()
    assert server.indexes["/docs"].hashed_files == 0
    index_file = tmp_path / "mirror.idx"
    assert main(["manifest", "import", str(m), str(root), "--index", str(index_file)]) == 0
    loaded = FileIndex.load(index_file, root)
    assert loaded.refresh().changed == () and loaded.hashed_files == 0


def test_diff_names_each_change_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _tree(root)
    a = tmp_path / "a.parquet"
    assert main(["manifest", str(root), str(a)]) == 0
    (root / "a.txt").write_bytes(b"changed")
    (root / "empty").unlink()
    (root / "new").write_bytes(b"new")
    st = (root / "d" / "e" / "f" / "deep.txt").stat()
    os.utime(root / "d" / "e" / "f" / "deep.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    b = tmp_path / "b.parquet"
    assert main(["manifest", str(root), str(b)]) == 0
    capsys.readouterr()
    assert main(["manifest", "diff", str(a), str(b)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "changed a.txt",
        "touched d/e/f/deep.txt",
        "removed empty",
        "added new",
    ]
    assert main(["manifest", "diff", str(a), str(a)]) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["manifest", "ROOT"], 2, "expected ROOT OUT"),
        (["manifest", "diff", "A"], 2, "expected diff A B"),
        (["manifest", "import", "M", "R", "extra"], 2, "expected import MANIFEST ROOT"),
        (["manifest", "--master", "local[2]", "R", "O"], 2, "--master goes with --spark"),
        (["manifest", "import", "--spark", "M", "R"], 2, "--spark does not apply"),
        (["manifest", "diff", "missing-a", "missing-b"], 1, "no such manifest"),
        (["manifest", "not-a-dir", "out"], 1, "not a directory"),
    ],
)
def test_command_errors_are_one_line(
    argv: list[str], code: int, says: str, capsys: pytest.CaptureFixture[str],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(argv) == code
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_file_that_is_not_a_manifest_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "root").mkdir()
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 not really")
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), other)
    for bad in (garbage, other):
        assert main(["manifest", "import", str(bad), str(tmp_path / "root"),
                     "--index", str(tmp_path / "i")]) == 1  # fmt: skip
        err = capsys.readouterr().err
        assert "manifest" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "i").exists()
