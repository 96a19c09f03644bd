"""Fixtures of the zerohub tests: a running hub with every front door on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from zerohub.config import (
    BrokerConfig,
    ConsoleConfig,
    FilesConfig,
    HubConfig,
    MetricsConfig,
    PublishConfig,
)
from zerohub.hub import Hub, HubEndpoints, build


@pytest.fixture
def hub(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> Iterator[tuple[Hub, HubEndpoints, Path]]:
    public = tmp_path / "public"
    public.mkdir()
    (public / "a.txt").write_bytes(b"a" * 1000)
    (public / "sub").mkdir()
    (public / "sub" / "b.bin").write_bytes(os.urandom(70_000))
    config = HubConfig(
        files=FilesConfig(
            bind="tcp://127.0.0.1:*", publish=(PublishConfig(public, "/"),), state=False
        ),
        broker=BrokerConfig(bind="tcp://127.0.0.1:*"),
        metrics=MetricsConfig(enabled=True, address="127.0.0.1:0"),
        console=ConsoleConfig(enabled=True, address="127.0.0.1:0"),
    )
    the_hub = build(config, zctx)
    endpoints = the_hub.start()
    try:
        yield the_hub, endpoints, tmp_path
    finally:
        the_hub.stop()
