"""Issue 10: ``fsync`` is the default durability of ``broker serve`` (and ``batch``'s N ms
reach the log as given): the store ``serve`` opens from its own command line.  The modes'
behaviour is in ``store/test_group_commit.py`` and ``test_durable_ops.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli import _open_data, build_parser
from broker.store.log import Durability


def _durability(*argv: str) -> tuple[Durability, float]:
    args = build_parser().parse_args(["serve", *argv])
    store = _open_data(args)
    try:
        options = store.log.options
        return options.durability, options.batch_interval
    finally:
        store.close()


def test_serve_saves_with_fsync_unless_told(tmp_path: Path) -> None:
    assert _durability("--data", str(tmp_path / "d")) == (Durability.FSYNC, 0.010)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("--durability", "batch", "--batch-interval", "25"), (Durability.BATCH, 0.025)),
        (("--durability", "os"), (Durability.OS, 0.010)),
    ],
)
def test_serve_passes_the_mode_and_the_interval_in_ms(
    tmp_path: Path, argv: tuple[str, ...], expected: tuple[Durability, float]
) -> None:
    assert _durability("--data", str(tmp_path / "d"), *argv) == expected


def test_data_none_opens_no_store() -> None:
    assert _open_data(build_parser().parse_args(["serve", "--data", "none"])) is None
