"""The rules every zerohub command line follows, checked on real processes.

One line and a documented exit code (``zerohub.cli.ExitCode``) for a malformed
endpoint, an endpoint in use, Ctrl-C while connecting and a closed output pipe;
``-v``/``-q`` before or after the subcommand; a help text for every option.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from broker.cli import build_parser as broker_parser
from broker.client.blocking import Client
from filemq.cli import build_parser as filemq_parser
from tests.broker.test_cli import start_serve
from tests.filemq.conftest import write_tree
from tests.ports import free_port
from tests.zproto.support import ROOT
from zerohub.cli import ExitCode, check_endpoint
from zerohub.main import build_parser as zerohub_parser
from zproto.cli import build_parser as zproto_parser

from .support import (
    cli,
    interrupt_while_connecting,
    one_line,
    run_into_closed_pipe,
)

# -- help ------------------------------------------------------------------------------


def _parsers(
    parser: argparse.ArgumentParser, name: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


@pytest.mark.parametrize(
    "parser",
    [filemq_parser([]), broker_parser(), zproto_parser(), zerohub_parser()],
    ids=["filemq", "broker", "zproto", "zerohub"],
)
def test_every_option_and_command_has_a_help_text(parser: argparse.ArgumentParser) -> None:
    missing = []
    commands = 0
    for name, command in _parsers(parser, parser.prog):
        commands += 1
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {a.dest for a in action._choices_actions if a.help}
                missing += [f"{name} {c}" for c in action.choices if c not in helped]
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert commands > 1  # the walk reached the subcommands
    assert missing == []


def test_help_into_a_closed_pipe_is_quiet() -> None:
    for prog in ("filemq", "broker", "zproto", "zerohub"):
        done = run_into_closed_pipe(prog, "--help")
        assert (done.returncode, done.stderr) == (0, b""), prog  # argparse drops the text


# -- malformed endpoints ---------------------------------------------------------------

_ENDPOINT_COMMANDS = [
    ("filemq", "serve", "--publish", ".", "--bind", "{e}"),
    ("zerohub", "serve", "--publish", ".", "--broker-bind", "{e}"),
    ("filemq", "sync", "{e}", "dest", "--once"),
    ("filemq", "subscribe", "{e}", "dest"),
    ("broker", "serve", "--bind", "{e}"),
    ("broker", "push", "--connect", "{e}", "ch", "1", "x"),
    ("broker", "consume", "--connect", "{e}", "ch"),
    ("broker", "pull", "--connect", "{e}", "ch", "1"),
    ("broker", "admin", "--connect", "{e}", "list"),
    ("broker", "stats", "--connect", "{e}"),
]


@pytest.mark.parametrize("endpoint", ["127.0.0.1:5670", "bogus://x", "tcp://127.0.0.1"])
@pytest.mark.parametrize("command", _ENDPOINT_COMMANDS, ids=" ".join)
def test_a_malformed_endpoint_is_a_usage_error(
    command: tuple[str, ...], endpoint: str, tmp_path: Path
) -> None:
    prog, *args = command
    done = cli(prog, *(a.replace("{e}", endpoint) for a in args), cwd=tmp_path)
    line = one_line(done.stderr)
    assert done.returncode == ExitCode.USAGE, line
    assert f"bad endpoint {endpoint!r}" in line
    assert list(tmp_path.iterdir()) == []  # nothing ran: no DEST made


def test_a_malformed_endpoint_from_the_environment_or_config(tmp_path: Path) -> None:
    done = cli("broker", "stats", env={"BROKER_ENDPOINT": "localhost:5680"})
    assert done.returncode == ExitCode.USAGE
    assert "bad endpoint 'localhost:5680'" in one_line(done.stderr)
    assert "(tcp://localhost:5680?)" in done.stderr  # the likely fix, spelled out
    config = tmp_path / "broker.toml"
    config.write_text('[server]\nbind = "127.0.0.1:5680"\n')
    done = cli("broker", "serve", "--config", str(config))
    assert done.returncode == ExitCode.USAGE
    assert "bad endpoint '127.0.0.1:5680'" in one_line(done.stderr)


def test_endpoint_syntax() -> None:
    for good in ("tcp://127.0.0.1:5670", "tcp://[::1]:1", "tcp://host:65535", "ipc:///tmp/x"):
        assert check_endpoint(good) == good
    for bind in ("tcp://*:*", "tcp://127.0.0.1:*", "tcp://127.0.0.1:0", "tcp://eth0:5670"):
        assert check_endpoint(bind, bind=True) == bind
    for bad in ("tcp://127.0.0.1:*", "tcp://h:0", "tcp://h:70000", "tcp://:1", "ipc://", "x"):
        with pytest.raises(Exception, match="bad endpoint"):
            check_endpoint(bad)


# -- endpoint in use -------------------------------------------------------------------


@pytest.fixture
def port_in_use() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def _published_tree(tmp_path: Path) -> Path:
    src = tmp_path / "public"
    write_tree(src, {f"d{i}/f{j}.bin": os.urandom(1000) for i in range(5) for j in range(20)})
    return src


def test_filemq_serve_on_a_port_in_use_fails_before_hashing(
    tmp_path: Path, port_in_use: int
) -> None:
    src, state = _published_tree(tmp_path), tmp_path / "state"
    done = cli(
        "filemq",
        "serve",
        "--publish",
        str(src),
        "--bind",
        f"tcp://127.0.0.1:{port_in_use}",
        "--state-dir",
        str(state),
    )
    line = one_line(done.stderr)
    assert done.returncode == ExitCode.FAILURE
    assert re.fullmatch(rf"filemq: cannot serve on tcp://127.0.0.1:{port_in_use}: .*in use", line)
    assert not list(state.rglob("*.idx"))  # no tree was hashed: no index was saved


def test_zerohub_serve_with_the_broker_on_a_port_in_use(tmp_path: Path, port_in_use: int) -> None:
    src, state = _published_tree(tmp_path), tmp_path / "state"
    done = cli(
        "zerohub",
        "serve",
        "--publish",
        str(src),
        "--bind",
        "tcp://127.0.0.1:*",
        "--state-dir",
        str(state),
        "--broker-bind",
        f"tcp://127.0.0.1:{port_in_use}",
    )
    line = one_line(done.stderr)
    assert done.returncode == ExitCode.FAILURE
    assert line.startswith(f"zerohub: broker: cannot serve on tcp://127.0.0.1:{port_in_use}")
    assert "in use" in line
    assert not list(state.rglob("*.idx"))


def test_broker_serve_on_a_port_in_use(port_in_use: int) -> None:
    done = cli("broker", "serve", "--bind", f"tcp://127.0.0.1:{port_in_use}")
    line = one_line(done.stderr)
    assert done.returncode == ExitCode.FAILURE
    assert line.startswith(f"broker: cannot serve on tcp://127.0.0.1:{port_in_use}")
    assert "in use" in line


# -- Ctrl-C while connecting -----------------------------------------------------------


def test_ctrl_c_while_connecting(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    dest = str(tmp_path / "dest")
    line = interrupt_while_connecting(
        "filemq", "sync", "{endpoint}", dest, "--once", "--timeout", "60", env=env
    )
    assert line == "filemq: interrupted"
    for command in (("stats",), ("consume", "ch"), ("push", "ch", "1", "x")):
        line = interrupt_while_connecting(
            "broker", *command, "--connect", "{endpoint}", "--timeout", "60"
        )
        assert line == "broker: interrupted"


# -- a closed output pipe (`| head`) ---------------------------------------------------


def test_output_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    done = run_into_closed_pipe("zproto", "check", "-v", "--root", str(ROOT))
    assert (done.returncode, done.stderr) == (ExitCode.BROKEN_PIPE, b"")
    done = run_into_closed_pipe("filemq", "keys", "new", "k", "--dir", str(tmp_path))
    assert (done.returncode, done.stderr) == (ExitCode.BROKEN_PIPE, b"")
    assert (tmp_path / "k.key_secret").exists()  # the work was done; only the report was lost
    port = free_port()
    proc = start_serve("--bind", f"tcp://127.0.0.1:{port}")
    try:
        connect = ("--connect", f"tcp://127.0.0.1:{port}")
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            with Client(connect[1], context=context, timeout=10).connect() as client:
                for i in range(50):
                    client.create_channel(f"ch{i}")
        finally:
            context.term()
        done = run_into_closed_pipe("broker", "admin", *connect, "list")
        assert (done.returncode, done.stderr) == (ExitCode.BROKEN_PIPE, b"")
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


# -- -v and -q before or after the subcommand ------------------------------------------


def test_verbosity_flags_before_or_after_the_subcommand(tmp_path: Path) -> None:
    model = tmp_path / "m.xml"
    model.write_text('<class name="m" signature="1"><message name="a" id="1"/></class>')
    assert cli("zproto", "generate", str(model)).returncode == 0
    for argv in (["-v", "generate", str(model)], ["generate", str(model), "-v"]):
        assert "m.py is up to date" in cli("zproto", *argv).stdout  # -v: unchanged too
    assert "up to date" not in cli("zproto", "generate", str(model)).stdout
    model.write_text(model.read_text().replace('name="a"', 'name="b"'))
    for argv in (["-q", "generate", str(model)], ["generate", "-q", str(model)]):
        done = cli("zproto", *argv)
        assert done.returncode == 0 and done.stdout == ""  # -q: wrote files, said nothing
    assert "b" in (tmp_path / "m.py").read_text()

    port = free_port()
    proc = start_serve("--bind", f"tcp://127.0.0.1:{port}")
    try:
        connect = ("--connect", f"tcp://127.0.0.1:{port}")
        for argv in (["-vv", "stats", *connect], ["stats", *connect, "-vv"]):
            assert "stats took" in cli("broker", *argv).stderr  # -vv: debug lines
        for argv in (["-q", "stats", *connect, "-vv"], ["-vv", "stats", "-q", *connect]):
            done = cli("broker", *argv)
            assert done.returncode == 0 and "took" not in done.stderr  # -q: one step back
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
