"""Fixtures shared by the broker tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.test_durable_serve import Broker


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Broker]:
    """A started ``broker serve --data DIR`` process (killed at the end if still running)."""
    b = Broker(tmp_path / "data")
    b.start()
    yield b
    if b.proc is not None:
        b.proc.kill()
        b.proc.wait(10)
