"""Wire metadata rules (filemq.meta) and include/exclude patterns (filemq.filters)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from filemq.filters import MAX_WIRE_PATTERNS, FilterError, Filters, read_pattern_file
from filemq.index import FileIndex
from filemq.meta import (
    Kind,
    MetaError,
    attr_dir,
    attr_file,
    attr_kind,
    attr_link,
    canonical_target,
    check_link_target,
    decode_attrs,
    local_mode,
    parse_entry,
    parse_mask,
)
from filemq.paths import OutsideRootError, resolve_beneath

# -- headers ---------------------------------------------------------------------------


def test_parse_entry_reads_mode_mtime_kind() -> None:
    meta = parse_entry({"mode": "4755", "mtime_ns": "-5"}, ("a",))
    assert (meta.kind, meta.mode, meta.mtime_ns) == (Kind.FILE, 0o4755, -5)
    assert parse_entry({}, ("a",)).mode is None  # an older server: nothing to apply
    folder = parse_entry({"kind": "dir", "mode": "0700"}, ("d",))
    assert (folder.kind, folder.mode) == (Kind.DIR, 0o700)


@pytest.mark.parametrize(
    "headers",
    [
        {"mode": "rwx"},
        {"mode": "-1"},
        {"mode": "17777"},  # bits beyond 7777
        {"mode": "7" * 30},
        {"mode": ""},
        {"mtime_ns": "soon"},
        {"mtime_ns": "9" * 40},
        {"mtime_ns": "1e9"},
        {"mtime_ns": "١٢٣"},  # digits, but not ASCII ones
        {"kind": "fifo"},
        {"kind": "dir", "touch": "1"},
    ],
)
def test_parse_entry_refuses_what_cannot_be_true(headers: dict[str, str]) -> None:
    with pytest.raises(MetaError):
        parse_entry(headers, ("a",))


def test_masks_strip_special_bits_and_folders_stay_writable() -> None:
    assert local_mode(0o7777, 0o777, Kind.FILE) == 0o777
    assert local_mode(0o4755, 0o7777, Kind.FILE) == 0o4755
    assert local_mode(0o000, 0o777, Kind.FILE) == 0o000
    assert local_mode(0o555, 0o777, Kind.DIR) == 0o755
    assert local_mode(0o000, 0o777, Kind.DIR) == 0o700
    assert parse_mask("777") == 0o777 and parse_mask("7777") == 0o7777
    with pytest.raises(MetaError):
        parse_mask("0")  # a mask that drops rwx bits


@pytest.mark.parametrize(
    ("link", "target"),
    [
        (("l",), "x"),
        (("a", "l"), "../x"),
        (("a", "b", "l"), "../../c/d"),
        (("a", "l"), ".."),
    ],
)
def test_link_targets_that_stay_inside(link: tuple[str, ...], target: str) -> None:
    assert check_link_target(link, target) == target
    assert parse_entry({"kind": "symlink", "target": target}, link).target == target


@pytest.mark.parametrize(
    ("link", "target"),
    [
        (("l",), "../x"),  # above the root
        (("a", "l"), "../../x"),
        (("l",), "/etc/passwd"),
        (("l",), "a/../../x"),  # '..' after a name: not canonical
        (("l",), "s/.."),
        (("l",), "./x"),
        (("l",), "x//y"),
        (("l",), "x/"),
        (("l",), ""),
        (("l",), "x\x00y"),
        (("l",), "x\ny"),
        (("l",), "..\\..\\x"),
        (("l",), "x" * 5000),
    ],
)
def test_link_targets_that_could_escape_are_refused(link: tuple[str, ...], target: str) -> None:
    with pytest.raises(MetaError):
        check_link_target(link, target)
    with pytest.raises(MetaError):
        parse_entry({"kind": "symlink", "target": target}, link)


def test_a_link_without_target_needs_a_reason() -> None:
    with pytest.raises(MetaError):
        parse_entry({"kind": "symlink"}, ("l",))
    assert parse_entry({"kind": "symlink", "skip": "dangling"}, ("l",)).skip == "dangling"


def test_canonical_targets() -> None:
    assert canonical_target(("a", "b", "l"), ("a", "f")) == "../f"
    assert canonical_target(("l",), ("a", "f")) == "a/f"
    assert canonical_target(("a", "l"), ()) == ".."
    assert canonical_target(("a", "l"), ("a",)) == "../a"  # its own folder
    with pytest.raises(MetaError):
        canonical_target(("l",), ())  # the root, from the root


def test_attrs_are_compared_as_text() -> None:
    text = "a.txt\tf\t640\t1600000000000000001\nd\td\t755\nl\tl\t../x"
    attrs = decode_attrs(text)
    assert attrs["a.txt"] == attr_file(0o640, 1_600_000_000_000_000_001)
    assert attrs["d"] == attr_dir(0o755) and attrs["l"] == attr_link("../x")
    assert [attr_kind(a) for a in attrs.values()] == [Kind.FILE, Kind.DIR, Kind.SYMLINK]
    garbage = decode_attrs("x\tf\tzz\t1\ncut\nz\tq\t1\nw\tf\t0644\t5")
    assert "cut" not in garbage and attr_kind(garbage["z"]) is None
    assert garbage["x"] != attr_file(0o644, 1) and garbage["w"] != attr_file(0o644, 5)


# -- link resolution below a root ------------------------------------------------------


def test_resolve_beneath_never_leads_out(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "a" / "b").mkdir(parents=True)
    outside.mkdir()
    (root / "a" / "f").write_bytes(b"f")
    links = {
        "a/b/up": "../f",
        "abs-in": str(root / "a" / "f"),
        "abs-out": str(outside),
        "rel-out": "../outside",
        "chain": "a/b/up",
        "loop": "loop",
        "a/s": "..",
        "via-link": "a/s/../outside",  # inside only if '..' were taken lexically
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    assert resolve_beneath(root, ("a", "b", "up")) == ("a", "f")
    assert resolve_beneath(root, ("abs-in",)) == ("a", "f")
    assert resolve_beneath(root, ("chain",)) == ("a", "f")
    assert resolve_beneath(root, ("a", "s")) == ()
    for name in ("abs-out", "rel-out", "loop", "via-link"):
        with pytest.raises(OutsideRootError):
            resolve_beneath(root, name.split("/"))


# -- patterns ------------------------------------------------------------------------


def test_patterns_gitignore_semantics() -> None:
    f = Filters(["*.log", "build/", "!keep.log", "/top", "# a comment", ""])
    assert f.lines == ("*.log", "build/", "!keep.log", "/top")
    assert f.excluded("a/b.log") and not f.excluded("keep.log")
    assert f.excluded("build", is_dir=True) and not f.excluded("build")  # folders only
    assert f.excluded_path("x/build/y.c")  # below an excluded folder
    assert f.excluded("top") and not f.excluded("a/top")  # anchored
    only_excludes = Filters(["*.tmp", "cache/"])
    assert only_excludes.excluded("a/b.tmp") and only_excludes.excluded("cache", True)
    assert not Filters() and not Filters(["# nothing"])


def test_include_and_exclude_in_command_line_order(tmp_path: Path) -> None:
    listed = tmp_path / "patterns"
    listed.write_text("*.c\n# comment\n")
    f = Filters.from_options([("include", "main.c"), ("exclude", "!odd")], [listed])
    assert f.lines == ("*.c", "!main.c", "\\!odd")
    assert f.excluded("x.c") and not f.excluded("main.c") and f.excluded("!odd")


@pytest.mark.parametrize(
    "lines",
    [
        ["\\"],  # pathspec cannot parse it
        ["*a*a*a*b"],  # backtracking bomb
        ["x" * 2000],
        ["a\x00b"],
    ],
)
def test_garbage_patterns_are_refused(lines: list[str]) -> None:
    with pytest.raises(FilterError):
        Filters(lines)


def test_garbage_pattern_files_are_refused(tmp_path: Path) -> None:
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    nul = tmp_path / "nul"
    nul.write_bytes(b"ok\x00")
    huge = tmp_path / "huge"
    huge.write_bytes(b"x\n" * (1 << 20))
    for path in (binary, nul, huge, tmp_path / "missing"):
        with pytest.raises(FilterError):
            read_pattern_file(path)


def test_wire_patterns_have_limits() -> None:
    assert Filters.from_option("").lines == ()
    assert Filters.from_option("*.log\nbuild/").lines == ("*.log", "build/")
    with pytest.raises(FilterError):
        Filters.from_option("\n".join(f"p{i}" for i in range(MAX_WIRE_PATTERNS + 1)))
    with pytest.raises(FilterError):
        Filters.from_option("x" * (1 << 17))


def test_index_walk_and_single_update_agree_on_patterns(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for name in ("a.log", "keep.log", "build/x.c", "build/keep.log", "src/m.c", "src/o.log"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
    filters = Filters(["*.log", "!keep.log", "build/"])
    index = FileIndex(root, filters=filters, tree=True)
    index.refresh()
    walked = set(index.entries())
    assert walked == {"keep.log", "src/m.c"}
    assert set(index.nodes()) == {"src"}
    single = FileIndex(root, filters=filters, tree=True)
    for name in ("a.log", "keep.log", "build/x.c", "build/keep.log", "src/m.c", "src/o.log"):
        single.update(name)
    assert set(single.entries()) == walked  # (build/keep.log: its folder is excluded)


def test_one_joined_regex_agrees_with_pathspec_itself() -> None:
    """The joined regex (excludes only) and the last-match-wins loop (with re-includes)
    give pathspec's own answer for each name (its folders taken as not excluded)."""
    import pathspec

    names = [
        "a.log", "x/a.log", "x/y/b.tmp", "build", "build/", "src/build/", "top", "x/top",
        "doc/x.md", "doc/sub/x.md", "cache/", "deep/cache/", "keep.log", "a/b/c/d.o",
        "node_modules/", "x/node_modules/", "readme", "weird name.txt", "ünï.log",
    ]  # fmt: skip
    line_sets = [
        ["*.log", "*.tmp", "build/", "/top", "doc/**/*.md", "cache/", "*.o", "node_modules/"],
        ["*.log", "!keep.log", "build/", "!src/build/", "/top", "**/x.md"],
        ["*", "!*.log", "!*/"],
    ]
    for lines in line_sets:
        ours = Filters(lines)
        spec = pathspec.GitIgnoreSpec.from_lines(lines)
        for name in names:
            is_dir = name.endswith("/")
            expected = spec.match_file(name)
            assert ours.excluded(name.rstrip("/"), is_dir) == expected, (lines, name)
