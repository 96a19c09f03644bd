"""Real peer brokers for the bridge tests, started on a random loopback port in a temp dir.

``Mosquitto`` runs Debian's ``mosquitto`` in the foreground (persistence on, so a graceful
restart keeps sessions and queued messages).  ``peer_or_skip`` skips a test with the reason
when the program is not installed (``.ci/run`` installs it where the package manager can).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.polling import wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def peer_or_skip(program: str) -> str:
    found = shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin")
    if found is None:
        pytest.skip(f"{program} is not installed (apt-get install {program})")
    return found


class Mosquitto:
    """A mosquitto process: ``start()``, ``stop(sig)``, ``pause()``/``resume()``."""

    def __init__(self, workdir: Path, extra: str = "") -> None:
        self.program = peer_or_skip("mosquitto")
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.config = workdir / "mosquitto.conf"
        data = workdir / "data"
        data.mkdir(exist_ok=True)
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            "persistence true",
            f"persistence_location {data}/",
            "autosave_interval 1",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
        ]
        if os.getuid() == 0:
            lines.append("user root")  # else it switches to 'mosquitto', who cannot write here
        self.config.write_text("\n".join(lines) + "\n" + extra)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.workdir / "mosquitto.log", "ab")  # noqa: SIM115 (kept by the child)
        self.proc = subprocess.Popen(
            [self.program, "-c", str(self.config)], stdout=log, stderr=log
        )
        log.close()
        if not wait_until(lambda: port_open(self.port) or self.proc.poll() is not None):
            self.stop()
            pytest.fail("mosquitto did not start listening")
        if self.proc.poll() is not None:
            text = (self.workdir / "mosquitto.log").read_text(errors="replace")
            pytest.skip(f"mosquitto could not start: {text.strip()[-300:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        # the port is free again once nothing listens on it
        deadline = time.monotonic() + 10
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.05)

    def saved(self) -> bool:
        """True once mosquitto wrote its persistence file (autosave every second)."""
        return (self.workdir / "data" / "mosquitto.db").exists()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
