"""The README's commands and the examples run as documented (real processes).

The slow test installs the project as the README says (a fresh virtualenv and
``pip install .``) and runs the README's commands and the systemd unit's ExecStart
against that install.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.filemq.conftest import read_tree
from tests.filemq.procs import read_endpoint
from tests.ports import free_port
from tests.zproto.support import ROOT

from .support import WAIT, one_line

README = ROOT / "README.md"
BROKER_DOC = ROOT / "docs" / "broker.md"  # the broker's page: its config example
SCRIPT = ROOT / "examples" / "mirror_directory.sh"
UNIT = ROOT / "examples" / "filemq-subscribe.service"
BIN = Path(sys.prefix) / "bin"  # the virtualenv running the tests


def readme_block(marker: str) -> list[str]:
    """The command lines between ``<!-- marker -->`` and ``<!-- /marker -->``."""
    text = README.read_text()
    found = re.search(rf"<!-- {marker} -->\n```\n(.*?)```\n<!-- /{marker} -->", text, re.S)
    assert found, f"README.md has no {marker} block"
    return [line for line in found.group(1).splitlines() if line.strip()]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        **extra,
    }


def _installed(bin_dir: Path, words: list[str]) -> list[str]:
    """``.venv/bin/X ...`` as the README writes it, with X from ``bin_dir``."""
    program = words[0]
    assert program.startswith(".venv/bin/"), program
    return [str(bin_dir / program.removeprefix(".venv/bin/")), *words[1:]]


def run_readme_session(bin_dir: Path, work: Path, tmp_path: Path) -> None:
    """The README's run command's server, then every command of its then-commands block."""
    *_install, serve = readme_block("run-command")[0].split(" && ")
    assert _install[-1] == "mkdir -p public"
    (work / "public").mkdir(parents=True)
    (work / "public" / "hello.txt").write_bytes(b"hello file")
    broker = f"tcp://127.0.0.1:{free_port()}"
    # the README's command with the default ports replaced (tests run side by side)
    words = _installed(bin_dir, shlex.split(serve))
    assert words[:2] == [str(bin_dir / "zerohub"), "serve"]
    words += ["--broker-bind", broker, "--bind", "tcp://127.0.0.1:*"]
    env = _env(tmp_path, BROKER_ENDPOINT=broker)
    server = subprocess.Popen(
        words, cwd=work, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )
    try:
        assert server.stderr is not None
        endpoint = read_endpoint(server.stderr)
        assert endpoint, "zerohub serve did not start"
        outputs = []
        for line in readme_block("then-commands"):
            line = line.replace("tcp://127.0.0.1:5670", endpoint)
            argv = _installed(bin_dir, shlex.split(line, comments=True))
            done = subprocess.run(
                argv, cwd=work, capture_output=True, text=True, timeout=WAIT, env=env
            )
            assert done.returncode == 0, f"{line}\n{done.stderr}"
            outputs.append(done.stdout)
        assert read_tree(work / "mirror") == {"hello.txt": b"hello file"}
        assert outputs[-1] == "hello\n"  # what the README says consume prints
        server.send_signal(signal.SIGINT)  # "Ctrl-C or SIGTERM stops both"
        assert stopped(server) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stderr is not None:
            server.stderr.close()


def stopped(server: subprocess.Popen[str], deadline: float = 2 * WAIT) -> int | None:
    """The exit code of a server asked to stop; past ``deadline`` (seen: a hub stop over
    30 s at load 40-60) the test fails with what it wrote: a stop that takes over 10 s
    writes every thread's stack there (``zerohub.cli.stop_signals``)."""
    try:
        return server.wait(deadline)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        err = server.stderr.read() if server.stderr is not None else ""
        pytest.fail(f"no stop within {deadline:.0f} s; its stderr:\n{err[-8000:]}")


def test_the_readme_commands_run_as_documented(tmp_path: Path) -> None:
    if not (BIN / "filemq").exists():
        pytest.skip("the tests do not run from an installed virtualenv")
    run_readme_session(BIN, tmp_path / "checkout", tmp_path)


def test_the_readme_config_example_is_what_broker_serve_reads(tmp_path: Path) -> None:
    text = BROKER_DOC.read_text()
    found = re.search(r"```toml\n(.*?)```", text, re.S)
    assert found
    port = free_port()
    config = tmp_path / "broker.toml"
    config.write_text(found.group(1).replace("127.0.0.1:5680", f"127.0.0.1:{port}"))
    server = subprocess.Popen(
        [sys.executable, "-m", "broker", "serve", "--config", str(config)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        assert "broker serving on" in server.stderr.readline()
        c = ["--connect", f"tcp://127.0.0.1:{port}"]

        def broker(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "broker", *args, *c],
                capture_output=True,
                text=True,
                timeout=WAIT,
            )

        done = broker("push", "jobs", "1", "x", "--ack", "--token", "worker-token")
        assert done.returncode == 0, done.stderr  # the worker may create (auto-creation)
        done = broker("stats", "--token", "worker-token")
        assert done.returncode == 3 and "401" in one_line(done.stderr)  # not an admin
        done = broker("stats", "--token", "admin-secret")
        assert done.returncode == 0 and json.loads(done.stdout)["engine"]["node"] == "zerohub"
        server.send_signal(signal.SIGTERM)
        assert server.wait(WAIT) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stderr is not None:
            server.stderr.close()


# -- examples/mirror_directory.sh ------------------------------------------------------


def _bare_path() -> str:
    path = os.pathsep.join(p for p in ("/usr/bin", "/bin") if Path(p).is_dir())
    if shutil.which("filemq", path=path) is not None:
        pytest.skip("a filemq is installed system-wide")
    return path


def test_mirror_directory_finds_filemq_in_the_checkout_venv(tmp_path: Path) -> None:
    if not (BIN / "filemq").exists():
        pytest.skip("the tests do not run from an installed virtualenv")
    checkout = tmp_path / "checkout"
    (checkout / "examples").mkdir(parents=True)
    shutil.copy2(SCRIPT, checkout / "examples")
    (checkout / ".venv").symlink_to(sys.prefix)  # where the README's install puts it
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "before.txt").write_bytes(b"before")
    env = _env(tmp_path, PATH=_bare_path())
    env.pop("FILEMQ", None)
    script = subprocess.Popen(
        ["sh", str(checkout / "examples" / "mirror_directory.sh"), str(src), str(dest),
         str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own process group, as a terminal job is
    )  # fmt: skip
    group = script.pid
    try:
        events = _json_lines(script)
        assert next(e for e in events if e["kind"] == "create")["name"] == "before.txt"
        (src / "live.txt").write_bytes(b"live")
        assert next(e for e in events if e["kind"] == "create")["name"] == "live.txt"
        assert read_tree(dest) == {"before.txt": b"before", "live.txt": b"live"}
        os.killpg(group, signal.SIGINT)  # Ctrl-C in the terminal: the whole job
        assert script.wait(WAIT) == 0
        _wait_group_gone(group)  # the background server was stopped too
    finally:
        if script.poll() is None:
            os.killpg(group, signal.SIGKILL)
            script.wait()
        for stream in (script.stdout, script.stderr):
            if stream is not None:
                stream.close()


def _json_lines(proc: subprocess.Popen[bytes]) -> Iterator[dict[str, object]]:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    partial = b""
    deadline = time.monotonic() + WAIT
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and sel.select(timeout=left), "no JSON event in time"
            data = os.read(proc.stdout.fileno(), 65536)
            assert data, "the script ended"
            partial += data
            *lines, partial = partial.split(b"\n")
            for line in lines:
                yield json.loads(line)
    finally:
        sel.close()


def _wait_group_gone(group: int) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError("a process of the example is still running")


def test_mirror_directory_without_filemq_says_so(tmp_path: Path) -> None:
    shutil.copy2(SCRIPT, tmp_path)  # no .venv beside it, none on PATH
    env = {**os.environ, "PATH": _bare_path()}
    env.pop("FILEMQ", None)
    done = subprocess.run(
        ["sh", str(tmp_path / "mirror_directory.sh"), "a", "b"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=env,
    )
    assert done.returncode == 127
    assert "no filemq found" in one_line(done.stderr)


# -- a fresh install (slow) ------------------------------------------------------------


@pytest.mark.slow
def test_a_fresh_install_runs_the_readme_and_the_systemd_unit(tmp_path: Path) -> None:
    venv = tmp_path / "opt-zerohub"  # the unit's /opt/zerohub
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    run_readme_session(venv / "bin", tmp_path / "checkout", tmp_path)

    unit = UNIT.read_text().replace("/opt/zerohub", str(venv))
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M)
    assert exec_start
    argv = shlex.split(exec_start.group(1))
    assert Path(argv[0]) == venv / "bin" / "filemq" and Path(argv[0]).exists()
    if shutil.which("systemd-analyze"):
        (tmp_path / "filemq-subscribe.service").write_text(unit)
        verified = subprocess.run(
            ["systemd-analyze", "verify", str(tmp_path / "filemq-subscribe.service")],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert verified.returncode == 0, verified.stderr
    src, mirror = tmp_path / "src", tmp_path / "srv-mirror"
    src.mkdir()
    (src / "f.txt").write_bytes(b"unit")
    server = subprocess.Popen(
        [str(venv / "bin" / "filemq"), "serve", "--publish", str(src), "--bind",
         "tcp://127.0.0.1:*", "--no-state"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    daemon = None
    try:
        assert server.stderr is not None
        endpoint = read_endpoint(server.stderr)
        argv = [a.replace("tcp://fileserver.example:5670", endpoint) for a in argv]
        argv = [a.replace("/srv/mirror", str(mirror)) for a in argv]
        daemon = subprocess.Popen(argv, env=_env(tmp_path), stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + WAIT
        while read_tree(mirror) != {"f.txt": b"unit"}:
            assert time.monotonic() < deadline, "the unit's command did not mirror"
            time.sleep(0.05)
        daemon.send_signal(signal.SIGTERM)  # KillSignal=SIGTERM
        assert daemon.wait(10) == 0  # within TimeoutStopSec=10
    finally:
        for proc in (daemon, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if server.stderr is not None:
            server.stderr.close()
