"""The opt-in compiled build (``ZEROHUB_COMPILE=1 pip install -e .``, hatch_build.py).

In a pure install (the default, CI) the compiled-build tests skip; after a compiled
install they check that every module the build lists is the compiled one (a stale or
half-made build fails) and that a broker on those modules serves real clients.  The
build hook's own promise, a default build that stays pure, has a (slow) wheel test.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import zmq

from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions
from tests.polling import WAIT

ROOT = Path(__file__).resolve().parents[2]


def listed() -> list[str]:
    """The module names the compiled build compiles (pyproject.toml)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    paths = config["tool"]["hatch"]["build"]["hooks"]["custom"]["compile"]
    return [path.removesuffix(".py").replace("/", ".") for path in paths]


def is_compiled(module: ModuleType) -> bool:
    name = str(module.__file__)
    return name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def compiled_modules() -> list[str]:
    return [name for name in listed() if is_compiled(importlib.import_module(name))]


def test_the_list_names_real_modules_of_the_checkout() -> None:
    names = listed()
    assert names and len(set(names)) == len(names)
    for name in names:
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name


def test_a_compiled_build_compiles_every_listed_module() -> None:
    compiled = compiled_modules()
    if not compiled:
        pytest.skip("pure install (ZEROHUB_COMPILE=1 pip install -e . builds the compiled one)")
    assert compiled == listed()  # none left pure, none stale: the build is whole


def test_a_broker_on_the_compiled_modules_serves_pushes_in_order() -> None:
    if not compiled_modules():
        pytest.skip("pure install (ZEROHUB_COMPILE=1 pip install -e . builds the compiled one)")
    ctx = zmq.Context()
    options = ServerOptions(endpoint="tcp://127.0.0.1:*")
    try:
        with Server(Engine(), options, context=ctx) as server:
            assert server.endpoint is not None
            consumer = Client(server.endpoint, context=ctx, timeout=WAIT).connect()
            producer = Client(server.endpoint, context=ctx, timeout=WAIT).connect()
            try:
                consumer.create_queue("compiled", 1, {"Status": 1})
                consumer.join("compiled")
                for i in range(300):
                    producer.push("compiled", 1, f"m{i}")
                producer.push("compiled", 1, b"last", ack=True)
                got = []
                for message in consumer.consume(timeout=WAIT):
                    got.append(message.payload)
                    if len(got) == 301:
                        break
                assert got == [f"m{i}".encode() for i in range(300)] + [b"last"]
            finally:
                producer.close()
                consumer.close()
    finally:
        ctx.term()


def test_the_clean_command_refuses_other_arguments_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "hatch_build.py"), "--everything"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr == "usage: python hatch_build.py --clean\n"


@pytest.mark.slow
def test_the_default_build_is_a_pure_wheel(tmp_path: Path) -> None:
    """Without ZEROHUB_COMPILE=1 (or with it set to anything else) the wheel is pure
    Python: no extension module, tagged for any platform."""
    env = {**os.environ, "ZEROHUB_COMPILE": "0"}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        env=env,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("zerohub-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "broker/engine/engine.py" in names
    assert not [name for name in names if name.endswith(".so")]
