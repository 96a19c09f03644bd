"""A hub you can watch: Prometheus metrics and the console's JSON over real HTTP, after real
FILEMQ and broker traffic; hostile HTTP peers; ``zerohub serve --config`` as a process."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from broker.client.blocking import Client
from filemq.client import SyncClient
from tests.polling import wait_until
from zerohub.config import BrokerConfig, FilesConfig, HubConfig, PublishConfig
from zerohub.hub import Hub, HubEndpoints, build

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


wait_for = wait_until  # the shared bounded wait (tests/polling.py)


def get(url: str, timeout: float = 10.0) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def scrape(url: str) -> Samples:
    status, ctype, body = get(url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_move_with_real_traffic(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    the_hub, endpoints, tmp_path = hub
    url = endpoints.http["metrics"]
    before = scrape(url)
    assert value(before, "zerohub_filemq_index_entries", mount="/") >= 2
    assert value(before, "zerohub_filemq_sent_files_total") == 0
    assert value(before, "zerohub_filemq_resyncs_total") == 0
    assert value(before, "zerohub_broker_up") == 1
    assert value(before, "zerohub_broker_received_total") == 0

    result = SyncClient(
        zctx, endpoints.files, tmp_path / "mirror", once=True, index_path=None
    ).run()
    assert result.synced and result.files == 2
    with Client(endpoints.broker, context=zctx, timeout=10).connect() as consumer:
        consumer.create_queue("work", 1, {"Status": 1, "RequestAcknowledge": True})
        consumer.create_queue("work", 2, {"Status": 3})  # Pull: messages stay queued
        consumer.join("work")
        with Client(endpoints.broker, context=zctx, timeout=10).connect() as producer:
            for i in range(3):
                producer.push("work", 1, f"job-{i}".encode())
            for i in range(4):
                producer.push("work", 2, f"kept-{i}".encode(), ack=True)
            got = [consumer.receive(timeout=10) for _ in range(3)]
            assert all(m is not None for m in got)
            consumer.ack(got[0])  # type: ignore[arg-type]
            consumer.nack(got[1], "cannot")  # type: ignore[arg-type]
            # one delivery stays unacknowledged
            assert wait_for(lambda: scrape(url)[("zerohub_broker_acks_total", ())] == 1)
            after = scrape(url)
            assert value(after, "zerohub_broker_clients") == 2
            assert value(after, "zerohub_broker_channels") == 1
            assert value(after, "zerohub_broker_queues") == 2
            assert value(after, "zerohub_broker_received_total") == 7
            assert value(after, "zerohub_broker_deliveries_total") >= 3
            assert value(after, "zerohub_broker_nacks_total") == 1
            assert value(after, "zerohub_broker_queue_messages", channel="work", queue="2") == 4
            unacked = value(after, "zerohub_broker_queue_unacked", channel="work", queue="1")
            assert unacked >= 1  # (the nacked one may be back out, as the queue decides)
            assert unacked == value(after, "zerohub_broker_pending_acks")
            assert value(after, "zerohub_broker_channel_consumers", channel="work") == 1
            assert value(after, "zerohub_broker_frames_total", direction="in") > 0

    assert value(after, "zerohub_filemq_sent_files_total") == 2
    assert value(after, "zerohub_filemq_sent_bytes_total") == 71_000
    assert value(after, "zerohub_filemq_resyncs_total") == 1
    assert value(after, "zerohub_filemq_watcher_overflows_total") == 0
    the_hub.files.simulate_overflow()
    assert wait_for(lambda: scrape(url)[("zerohub_filemq_watcher_overflows_total", ())] == 1), (
        "an overflow is counted"
    )
    assert value(scrape(url), "zerohub_filemq_rescans_total") >= 1


def test_a_subscriber_lag_is_visible(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """A FILEMQ client that subscribes but gives no credit: its files wait, and show."""
    from filemq import fmq_msg

    _hub, endpoints, _tmp = hub
    dealer = zctx.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        dealer.connect(endpoints.files)
        for message in (fmq_msg.Ohai(), fmq_msg.Icanhaz("/", {"RESYNC": "1"}, {})):
            dealer.send_multipart(fmq_msg.encode(message))
        url = endpoints.http["metrics"]

        def lagging() -> bool:
            found = [
                v
                for (name, _labels), v in scrape(url).items()
                if name == "zerohub_filemq_subscriber_queued_files"
            ]
            return found == [3.0]  # two files and the resync-complete marker

        assert wait_for(lagging)
        status = json.loads(get(endpoints.http["console"] + "/api/status")[2])
        (sub,) = status["files"]["subscribers"]
        assert sub["paths"] == ["/"] and sub["queued"] == 3 and sub["sent_files"] == 0
    finally:
        dealer.close()


def test_console_status_json_and_page(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    _hub, endpoints, _tmp = hub
    url = endpoints.http["console"]
    with Client(endpoints.broker, context=zctx, timeout=10).connect() as client:
        client.create_queue("<b>orders</b>", 5, {"Status": 3})
        client.push("<b>orders</b>", 5, b"x", ack=True)
        status, ctype, body = get(url + "/api/status")
        assert status == 200 and ctype == "application/json"
        data = json.loads(body)
    assert data["files"]["files"] >= 2
    assert [m["at"] for m in data["files"]["mounts"]] == ["/"]
    assert data["broker"]["channels"] == 1 and data["broker"]["queues"] == 1
    assert data["broker"]["queue_list"] == [
        {
            "channel": "<b>orders</b>",
            "queue": 5,
            "status": data["broker"]["queue_list"][0]["status"],
            "messages": 1,
            "unacked": 0,
            "consumers": 0,
            "received": 1,
            "sent": 0,
            "in_rate": 0.0,  # (the first sample: no rate yet)
            "out_rate": 0.0,
            "history": [],
        }
    ]
    status, ctype, page = get(url + "/")
    assert status == 200 and ctype.startswith("text/html")
    assert b'<script src="/console.js">' in page and b'data-refresh-ms="2000"' in page
    assert b"<style" not in page and b" style=" not in page  # the CSP allows no inline style
    status, ctype, style = get(url + "/console.css")
    assert status == 200 and ctype.startswith("text/css") and b"table" in style
    status, ctype, script = get(url + "/console.js")
    assert status == 200 and ctype.startswith("text/javascript")
    assert b"innerHTML" not in script  # names are drawn as text, never parsed as HTML
    assert get(url + "/nope")[0] == 404


def _raw(address: tuple[str, int], data: bytes) -> bytes:
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("door", ["metrics", "console"])
def test_garbage_and_hostile_clients_do_not_stop_the_http_doors(
    hub: tuple[Hub, HubEndpoints, Path], door: str
) -> None:
    the_hub, endpoints, _tmp = hub
    server = next(d for d in the_hub.http if d.name == door)
    address = server.bound
    # (two words: answered the HTTP/0.9 way, a body without a status line)
    assert b"400 - Bad request" in _raw(address, b"\x00\xff\xfe garbage \r\n\r\n")
    assert _raw(address, b"\x16\x03\x01\x02\x00\x01 / HTTP/1.1\r\n\r\n").startswith(
        b"HTTP/1.0 501"
    )
    assert _raw(address, b"GET " + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n").startswith(
        b"HTTP/1.0 414"
    )
    # POST: not implemented by the metrics; the console's actions turn a stranger away
    posted = _raw(address, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert posted.startswith(b"HTTP/1.0 501" if door == "metrics" else b"HTTP/1.0 421")
    own = f"Host: 127.0.0.1:{address[1]}".encode()
    for request, status in (
        (b"POST /api/action HTTP/1.1\r\n" + own + b"\r\n\r\n", b"411"),
        (b"POST /api/action HTTP/1.1\r\n" + own + b"\r\nContent-Length: -1\r\n\r\n", b"411"),
        (b"POST /api/action HTTP/1.1\r\n" + own + b"\r\nContent-Length: 10\r\n\r\nab", b"400"),
    ):
        if door == "console":
            assert _raw(address, request).startswith(b"HTTP/1.0 " + status)
    # a page elsewhere reaching us through a rebound DNS name is turned away
    rebound = f"GET / HTTP/1.1\r\nHost: evil.example:{address[1]}\r\n\r\n".encode()
    assert _raw(address, rebound).startswith(b"HTTP/1.0 421")
    # a peer that connects and says nothing does not hold the others up
    with socket.create_connection(address, timeout=10):
        assert get(endpoints.http[door] + "/")[0] == 200
    path = "/metrics" if door == "metrics" else "/api/status"
    assert get(endpoints.http[door] + path)[0] == 200


def test_connections_over_the_limit_are_closed_and_serving_goes_on() -> None:
    from zerohub.httpd import HttpServer, Response

    server = HttpServer(
        "test", ("127.0.0.1", 0), {"/": lambda: Response(b"ok")}, max_connections=2, timeout=30
    )
    url = server.start()
    idle = []
    try:
        for _ in range(2):
            idle.append(socket.create_connection(server.bound, timeout=10))
        assert wait_for(lambda: server._server is not None and server._server.slots._value == 0)
        with socket.create_connection(server.bound, timeout=10) as third:
            assert third.recv(10) == b""  # closed at once, unanswered
        assert server.refused == 1
        for s in idle:
            s.close()
        idle.clear()

        def answered() -> bool:
            try:
                return get(url + "/")[0] == 200
            except (ConnectionError, urllib.error.URLError):  # a slot not free yet: closed
                return False

        assert wait_for(answered)
    finally:
        for s in idle:
            s.close()
        server.stop()


def test_a_silent_peer_is_dropped_after_the_timeout() -> None:
    from zerohub.httpd import HttpServer, Response

    server = HttpServer("test", ("127.0.0.1", 0), {"/": lambda: Response(b"ok")}, timeout=0.3)
    server.start()
    try:
        with socket.create_connection(server.bound, timeout=10) as s:
            s.sendall(b"GET / HT")  # and nothing more
            assert s.recv(100) == b""  # the server hung up
    finally:
        server.stop()


# -- the command, as a process ----------------------------------------------------------


def test_serve_config_as_a_process_with_json_logs(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    from tests.filemq.procs import read_endpoint

    (tmp_path / "public").mkdir()
    (tmp_path / "public" / "x.txt").write_bytes(b"x" * 10)
    (tmp_path / "hub.toml").write_text(
        "[files]\n"
        'bind = "tcp://127.0.0.1:*"\n'
        "state = false\n"
        "[[files.publish]]\n"
        'dir = "public"\n'
        "[broker]\n"
        'bind = "tcp://127.0.0.1:*"\n'
        "[limits]\n"
        "max_clients = 1\n"
        "[metrics]\n"
        "enabled = true\n"
        'address = "127.0.0.1:0"\n'
        "[logging]\n"
        'format = "json"\n'
        'file = "hub.log"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "zerohub", "serve", "--config", str(tmp_path / "hub.toml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        while not any(line.startswith("zerohub: serving") for line in lines) and len(lines) < 10:
            lines.append(proc.stderr.readline())
        text = "".join(lines)
        broker = text.split("broker serving on ")[1].split()[0]
        metrics = text.split("metrics on ")[1].split()[0].rstrip("/")
        files = read_endpoint(_Lines(lines))  # type: ignore[arg-type]
        assert files
        result = SyncClient(zctx, files, tmp_path / "mirror", once=True, index_path=None).run()
        assert result.files == 1
        with Client(broker, context=zctx, timeout=10).connect() as client:
            client.create_queue("q", 1, {"Status": 3})
        samples = scrape(metrics)
        assert value(samples, "zerohub_filemq_sent_files_total") == 1
        assert value(samples, "zerohub_broker_queues") == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        log = [json.loads(line) for line in (tmp_path / "hub.log").read_text().splitlines()]
        assert log and {"time", "level", "logger", "message"} <= set(log[0])
        assert any(entry["logger"].startswith("filemq") for entry in log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


class _Lines:
    """The lines already read, as a stream ``read_endpoint`` can read again."""

    def __init__(self, lines: list[str]) -> None:
        self._lines = iter(lines)

    def readline(self) -> str:
        return next(self._lines, "")


def test_scrapes_during_a_flood_of_pushes_read_consistent_figures(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """The collectors read tables the broker thread changes meanwhile: every scrape still
    answers, the broker's figures are there, and counters never go back."""
    import threading

    _hub, endpoints, _tmp = hub
    url = endpoints.http["metrics"]
    done = threading.Event()
    failures: list[BaseException] = []

    def flood() -> None:
        try:
            with Client(endpoints.broker, context=zctx, timeout=10).connect() as producer:
                for i in range(1500):  # new channels and queues all along: tables grow
                    producer.push_async(f"ch{i % 300}", 1 + i % 3, b"x")
                producer.push(f"ch{0}", 1, b"last", ack=True)
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=flood)
    worker.start()
    seen = 0.0
    scrapes = 0
    try:
        while not done.is_set() or scrapes < 3:
            samples = scrape(url)
            scrapes += 1
            assert value(samples, "zerohub_broker_up") == 1
            received = value(samples, "zerohub_broker_received_total")
            assert received >= seen
            seen = received
    finally:
        worker.join(timeout=60)
    assert not failures, failures
    # (a read of the broker serves every scrape for the hub's status_ttl: bounded wait)
    assert wait_for(lambda: scrape(url)[("zerohub_broker_received_total", ())] == 1501)
    assert value(scrape(url), "zerohub_broker_channels") == 300


@pytest.mark.parametrize("broker_allow", ["allowed", "broker-allowed"])
def test_curve_keys_from_the_config_file_secure_both_services(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]], broker_allow: str
) -> None:
    """Both services with CURVE on one context (one ZAP handler, shared: it failed with
    'Address already in use (inproc://zeromq.zap.01)'), and with different allow-lists
    (the broker then runs on a context of its own)."""
    from filemq.client import SyncRefused
    from zerohub import config
    from zerohub.zmqkit import new_certificate

    keys = tmp_path / "keys"
    files_pub, _files_sec = new_certificate("files", keys)
    broker_pub, _broker_sec = new_certificate("broker", keys)
    client_pub, client_sec = new_certificate("client", keys)
    (tmp_path / "allowed").mkdir()
    (tmp_path / "allowed" / "client.key").write_bytes(client_pub.read_bytes())
    (tmp_path / "broker-allowed").mkdir()
    (tmp_path / "broker-allowed" / "client.key").write_bytes(client_pub.read_bytes())
    (tmp_path / "public").mkdir()
    (tmp_path / "public" / "secret.txt").write_bytes(b"for key holders")
    (tmp_path / "hub.toml").write_text(
        '[files]\nbind = "tcp://127.0.0.1:*"\nstate = false\n'
        'curve_secret = "keys/files.key_secret"\nallow = "allowed"\n'
        '[[files.publish]]\ndir = "public"\n'
        '[broker]\nbind = "tcp://127.0.0.1:*"\n'
        f'curve_secret = "keys/broker.key_secret"\nallow = "{broker_allow}"\n'
    )
    the_hub = build(config.load(tmp_path / "hub.toml"), zctx)
    assert len(the_hub.owned) == (broker_allow != "allowed")
    endpoints = the_hub.start()
    try:
        mirrored = SyncClient(
            zctx,
            endpoints.files,
            tmp_path / "mirror",
            once=True,
            index_path=None,
            curve_secret=client_sec,
            server_key=files_pub,
        ).run()
        assert mirrored.files == 1
        assert (tmp_path / "mirror" / "secret.txt").read_bytes() == b"for key holders"
        with pytest.raises(SyncRefused):
            SyncClient(
                zctx, endpoints.files, tmp_path / "plain", once=True, index_path=None,
                connect_timeout=2,
            ).run()  # fmt: skip
        with Client(
            endpoints.broker,
            context=zctx,
            server_key=broker_pub,
            curve_secret=client_sec,
            timeout=10,
        ).connect() as client:
            client.create_queue("secure", 1, {"Status": 3})
            assert [c["Name"] for c in client.channels()] == ["secure"]
    finally:
        the_hub.stop()


def test_a_failing_part_does_not_keep_the_others_running(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """Hub.stop stops every part even when one raises (a KeyboardInterrupt in the HTTP
    door's stop left the file server running: its sockets kept context.term() waiting
    for ever)."""
    from zerohub.httpd import HttpServer, Response

    class Interrupted(HttpServer):
        def stop(self) -> None:
            super().stop()
            raise KeyboardInterrupt

    (tmp_path / "public").mkdir()
    config = HubConfig(
        files=FilesConfig(
            bind="tcp://127.0.0.1:*",
            publish=(PublishConfig(tmp_path / "public", "/"),),
            state=False,
        ),
        broker=BrokerConfig(bind="tcp://127.0.0.1:*"),
    )
    the_hub = build(config, zctx)
    the_hub.http.append(Interrupted("door", ("127.0.0.1", 0), {"/": lambda: Response(b"")}))
    the_hub.start()
    with pytest.raises(KeyboardInterrupt):
        the_hub.stop()
    assert the_hub.files.publisher is not None
    assert the_hub.files.server._thread is None  # stopped, its sockets closed
    assert the_hub.broker.sender.router is None  # stopped, its ROUTER closed
    # (and the zctx fixture terminates the context: it would wait for ever otherwise)


def test_a_burst_of_signals_stops_the_hub_cleanly(tmp_path: Path) -> None:
    """``timeout`` sends its signal twice (to the child, then to the group), Ctrl-C
    may be pressed again: the hub stops once, fully, exit 0."""
    (tmp_path / "public").mkdir()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "zerohub", "serve", "--publish", str(tmp_path / "public"),
            "--bind", "tcp://127.0.0.1:*", "--broker-bind", "tcp://127.0.0.1:*",
            "--no-state", "--console", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for _ in range(10):
            if proc.stderr.readline().startswith("zerohub: serving"):
                break
        proc.send_signal(signal.SIGINT)
        time.sleep(0.02)  # the second one lands while the hub stops (its HTTP doors
        proc.send_signal(signal.SIGINT)  # take up to 0.2 s to close)
        assert proc.wait(timeout=30) == 0
        rest = proc.stderr.read()
        assert "Traceback" not in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
