"""Real peer brokers for the bridge tests, started on a random loopback port in a temp dir.

``Mosquitto`` runs Debian's ``mosquitto`` in the foreground (persistence on, so a graceful
restart keeps sessions and queued messages).  ``peer_or_skip`` skips a test with the reason
when the program is not installed (``.ci/run`` installs it where the package manager can).

Every peer started is recorded (a JSON file per peer in :func:`records_dir`) until it is
stopped: a pytest run killed by ``timeout`` or kill -9 cannot stop its peers (they run in
sessions of their own), and a RabbitMQ node left behind holds ~100 MB and a core's share.
The first peer start of a run reaps them (:func:`reap_stale`): the peers whose recorded
owner (the test process that started them) is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from tests.polling import wait_until
from tests.ports import free_port  # (the one rule: tests/ports.py; kept importable here)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def peer_or_skip(program: str) -> str:
    found = shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin")
    if found is None:
        pytest.skip(f"{program} is not installed (apt-get install {program})")
    return found


def records_dir() -> Path:
    """Where started peers are recorded: ``$ZEROHUB_TEST_PEERS``, else a directory of the
    user's in the temp dir (shared by every test run of the machine, whatever its checkout)."""
    chosen = os.environ.get("ZEROHUB_TEST_PEERS")
    if chosen:
        return Path(chosen)
    return Path(tempfile.gettempdir()) / f"zerohub-test-peers-{os.getuid()}"


def _started(pid: int) -> int | None:
    """The start time (clock ticks since boot) of a live process, None if there is none
    (or only a zombie): with the pid it names one process, whatever reused the number."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of proc(5): starttime


def _record(path: Path, pid: int, name: str, epmd_port: int | None) -> None:
    owner = os.getpid()
    text = json.dumps(
        {
            "name": name,
            "pid": pid,
            "started": _started(pid),
            "owner": owner,
            "owner_started": _started(owner),
            "epmd_port": epmd_port,
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(text)
    partial.replace(path)


def reap_stale(directory: Path | None = None) -> list[str]:
    """Kill the recorded peers whose owner is gone (their whole process group, and a
    RabbitMQ node's epmd once no node uses it); forget records of peers already gone.
    A peer whose owner still runs (another test run, on any checkout) is left alone; so
    is a process that only reuses a recorded pid (its start time differs).  Returns what
    was killed, as "name pid"."""
    directory = directory or records_dir()
    killed: list[str] = []
    for path in sorted(directory.glob("*.json")):
        try:
            rec = json.loads(path.read_text())
            pid, owner = int(rec["pid"]), int(rec["owner"])
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)  # torn or foreign: nothing to act on
            continue
        if rec.get("owner_started") is not None and _started(owner) == rec["owner_started"]:
            continue  # its test run is still going
        if rec.get("started") is not None and _started(pid) == rec["started"]:
            try:
                os.killpg(pid, signal.SIGKILL)
                killed.append(f"{rec.get('name')} {pid}")
            except ProcessLookupError:
                pass
            wait_until(lambda pid=pid: _started(pid) is None, 10.0)
        if rec.get("epmd_port"):
            env = {
                **os.environ,
                "ERL_EPMD_PORT": str(rec["epmd_port"]),
                "ERL_EPMD_ADDRESS": "127.0.0.1",
            }
            epmd = shutil.which("epmd")
            if epmd is not None:  # refused by epmd while a node still uses it
                subprocess.run([epmd, "-kill"], env=env, capture_output=True, timeout=10)
        path.unlink(missing_ok=True)
    return killed


_reaped: set[Path] = set()


def _reap_once() -> None:
    directory = records_dir()
    if directory not in _reaped:
        _reaped.add(directory)
        reap_stale(directory)


class PeerProcess:
    """A peer broker's process, started by its command in ``workdir``: ``start()`` waits
    until every port of ``ports`` listens (the output goes to ``workdir/log``);
    ``stop(sig)`` signals its process group, waits (SIGKILL after ``stop_wait`` s) and
    then for the ports to be free; ``signal(sig)`` (SIGSTOP/SIGCONT).  A peer that does
    not listen in time or dies at the start is ``on_timeout`` (skip or fail) with why.
    A started peer is recorded in :func:`records_dir` until ``stop()`` (the first start of
    a run reaps the peers of runs that were killed first)."""

    def __init__(
        self,
        name: str,
        command: list[str],
        workdir: Path,
        ports: tuple[int, ...],
        *,
        env: dict[str, str] | None = None,
        log: str = "server.out",
        stop_wait: float = 30.0,
        on_timeout: Callable[[str], NoReturn] = pytest.skip,
        epmd_port: int | None = None,
    ) -> None:
        self.name = name
        self.command = command
        self.workdir = workdir
        self.ports = ports
        self.env = env
        self.log = workdir / log
        self.stop_wait = stop_wait
        self.on_timeout = on_timeout
        self.epmd_port = epmd_port
        self.proc: subprocess.Popen[bytes] | None = None
        self.record: Path | None = None

    def listening(self) -> bool:
        return all(port_open(port) for port in self.ports)

    def start(self, timeout: float) -> None:
        _reap_once()
        log = open(self.log, "ab")  # noqa: SIM115 (kept by the child)
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own group: stop() ends the helpers it starts too
            cwd=self.workdir,  # (a killed Erlang node may leave a crash dump in its cwd)
        )
        log.close()
        proc = self.proc
        self.record = records_dir() / f"{proc.pid}.json"
        _record(self.record, proc.pid, self.name, self.epmd_port)
        if not wait_until(lambda: self.listening() or proc.poll() is not None, timeout):
            self.stop(signal.SIGKILL)
            self.on_timeout(f"{self.name} did not start listening in time")
        if proc.poll() is not None:
            text = self.log.read_text(errors="replace")
            pytest.skip(f"{self.name} could not start: {text.strip()[-300:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)
            try:
                proc.wait(self.stop_wait)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if self.record is not None:
            self.record.unlink(missing_ok=True)
            self.record = None
        # the ports are free again once nothing listens on them
        deadline = time.monotonic() + 15
        while any(port_open(p) for p in self.ports) and time.monotonic() < deadline:
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)


class Mosquitto:
    """A mosquitto process: ``start()``, ``stop(sig)``, ``pause()``/``resume()``."""

    def __init__(self, workdir: Path, extra: str = "") -> None:
        program = peer_or_skip("mosquitto")
        self.workdir = workdir
        self.port = free_port()
        self.config = workdir / "mosquitto.conf"
        self.process = PeerProcess(
            "mosquitto", [program, "-c", str(self.config)], workdir, (self.port,),
            log="mosquitto.log", stop_wait=10, on_timeout=pytest.fail,
        )  # fmt: skip
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

    def start(self, timeout: float = 10.0) -> None:
        self.process.start(timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.process.stop(sig)

    def saved(self) -> bool:
        """True once mosquitto wrote its persistence file (autosave every second)."""
        return (self.workdir / "data" / "mosquitto.db").exists()

    def pause(self) -> None:
        self.process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.signal(signal.SIGCONT)


_RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")


class RabbitMQ:
    """A rabbitmq-server node of its own (HOME, mnesia, logs, epmd port) in a temp dir,
    started without systemd; ``stop(sig)`` ends the node's process group and its epmd.
    Its STOMP plugin (``rabbitmq_stomp``) listens on ``stomp_port`` (``stomp_url``)."""

    def __init__(self, workdir: Path) -> None:
        server = _RABBIT_BIN / "rabbitmq-server"
        if not server.exists() or shutil.which("epmd") is None:
            pytest.skip("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        self.workdir = workdir
        self.port = free_port()
        self.stomp_port = free_port()
        self.epmd_port = free_port()
        home = workdir / "home"
        home.mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            "HOME": str(home),
            "RABBITMQ_NODENAME": f"zhtest{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(workdir / "log"),
            "RABBITMQ_PID_FILE": str(workdir / "rabbit.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(workdir / "advanced.config"),
        }
        (workdir / "enabled_plugins").write_text("[rabbitmq_stomp].\n")
        (workdir / "rabbitmq.conf").write_text(
            f"loopback_users = none\nstomp.listeners.tcp.1 = 127.0.0.1:{self.stomp_port}\n"
        )
        self.process = PeerProcess(
            "rabbitmq-server", [str(server)], workdir, (self.port, self.stomp_port),
            env=self.env, epmd_port=self.epmd_port,
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def stomp_url(self) -> str:
        return f"stomp://guest:guest@127.0.0.1:{self.stomp_port}/"

    def start(self, timeout: float = 60.0) -> None:
        self.process.start(timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.process.stop(sig)  # the node and its helpers: the group it started

    def close(self) -> None:
        self.stop()
        subprocess.run(
            ["epmd", "-kill"], env=self.env, capture_output=True, timeout=10, check=False
        )

    def settle(self) -> None:
        """Stop the node gracefully and start it again: what was declared before is on
        its disk then.

        RabbitMQ (3.10) answers a queue declare, and confirms persistent messages into
        that durable queue, before the queue's definition is surely on disk: a kill -9
        soon after may restart the node without the queue, and the messages it confirmed
        are gone with it (``bench/rabbit_declare_kill.py`` shows it without zerohub; the
        queue's name already in Mnesia's log files was not enough there).  A test that
        kills the node declares its queues and settles first: it then tests what
        RabbitMQ guarantees."""
        self.stop()
        self.start()


_ACTIVEMQ_HOME = Path("/usr/share/activemq")

_ACTIVEMQ_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
    http://activemq.apache.org/schema/core
    http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false"
          brokerName="zerohub-test" dataDirectory="{data}">
    <persistenceAdapter><kahaDB directory="{data}/kahadb"/></persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}"/>
    </transportConnectors>
  </broker>
</beans>
"""


class ActiveMQ:
    """Debian's ``activemq`` (5.17) run by ``java -jar activemq.jar`` in a temp dir,
    without systemd or the init script: only a STOMP connector, on ``stomp_url``."""

    def __init__(self, workdir: Path) -> None:
        jar = _ACTIVEMQ_HOME / "bin" / "activemq.jar"
        java = shutil.which("java")
        if not jar.exists() or java is None:
            pytest.skip("activemq is not installed (apt-get install activemq)")
        command = [
            java, "-Xms64M", "-Xmx256M",
            f"-Dactivemq.home={_ACTIVEMQ_HOME}", f"-Dactivemq.base={workdir}",
            f"-Dactivemq.conf={workdir}", f"-Dactivemq.data={workdir / 'data'}",
            "-jar", str(jar), "start", f"xbean:file:{workdir / 'activemq.xml'}",
        ]  # fmt: skip
        self.workdir = workdir
        self.stomp_port = free_port()
        (workdir / "activemq.xml").write_text(
            _ACTIVEMQ_XML.format(data=workdir / "data", port=self.stomp_port)
        )
        self.process = PeerProcess("activemq", command, workdir, (self.stomp_port,))

    @property
    def stomp_url(self) -> str:
        return f"stomp://127.0.0.1:{self.stomp_port}/"

    def start(self, timeout: float = 90.0) -> None:
        self.process.start(timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.process.stop(sig)
