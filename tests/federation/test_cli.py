"""``broker serve`` federation options: bad ones are one line and exit 2; the config table."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client
from tests.broker.test_cli import start_serve
from tests.federation.kit import stats_or_none
from tests.polling import wait_until
from tests.ports import free_port


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--bind",
         f"tcp://127.0.0.1:{free_port()}", *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ["--link", "udp://127.0.0.1:1"],
        ["--link", "tcp://127.0.0.1:1?mode=sideways"],
        ["--federate", "--broker-id", "no spaces"],
        ["--federate", "--link-depth", "-5"],
        ["--link", "tcp://127.0.0.1:1", "--link-secret", "/nowhere.key_secret"],
        ["--link", "tcp://127.0.0.1:1?key=/nowhere.key", "--link-secret", "/nowhere.key_secret"],
    ],
)
def test_bad_federation_options_are_one_line_exit_2(args: list[str]) -> None:
    done = serve(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr


def test_config_unknown_federation_key(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('[federation]\nlinkz = ["tcp://127.0.0.1:1"]\n')
    done = serve("--config", str(config))
    assert done.returncode == 2 and "linkz" in done.stderr, done.stderr


@pytest.fixture
def zctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def test_config_table_and_broker_id_kept_in_data(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[federation]\nfederate = true\ndepth = 2\n")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ids = []
    for _ in range(2):  # the id made on the first start is kept in --data
        proc = start_serve("--bind", endpoint, "--config", str(config), "--data",
                           str(tmp_path / "data"))  # fmt: skip
        try:
            with Client(endpoint, context=zctx, timeout=10).connect() as client:
                assert wait_until(lambda c=client: stats_or_none(c) is not None, 20)
                stats = stats_or_none(client)
                assert stats is not None
                ids.append(stats["broker"])
        finally:
            proc.terminate()
            proc.wait(20)
            assert proc.stderr is not None
            proc.stderr.close()
    assert ids[0] == ids[1] and ids[0].startswith("b-")
    assert (tmp_path / "data" / "broker-id").read_text().strip() == ids[0]
