"""Issue 11: virtual hosts of a real ``broker serve --stomp`` from its config file
(``[[stomp.virtual_hosts]]``): each one a namespace of its own (queues, topics, wildcards,
durable subscriptions, what the store keeps across a kill -9), the first one where a
STOMP 1.0 client lands, an unknown or hostile ``host`` refused with one ERROR, a
virtual host's queue reached from TMQP by its prefixed channel name, and config errors
as one line with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client
from broker.stomp.frames import Command, Frame
from tests.ports import free_port
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve, connect_frame, raws, serve_factory

__all__ = ["raws", "serve_factory"]  # (fixtures, imported for pytest)

#: Two virtual hosts; ``alpha`` first (where STOMP 1.0 lands).  No ``default``: so
#: ``localhost`` reaches neither.
TWO_HOSTS = """\
[[stomp.virtual_hosts]]
name = "alpha"
host_names = ["alpha.example", "a.example"]

[[stomp.virtual_hosts]]
name = "beta"
host_names = ["beta.example"]
"""


def on_host(raws: Callable[[int], Raw], server: Serve, host: str, version: str = "1.2") -> Raw:
    """A raw client CONNECTed to virtual host ``host`` of ``server``."""
    raw = raws(server.port)
    raw.send(connect_frame(accept_version=version, host=host))
    frame = raw.next()
    assert frame.command is Command.CONNECTED, frame
    return raw


def send(raw: Raw, destination: str, body: str, receipt: str, *extra: str) -> None:
    """A SEND and its RECEIPT (the broker took it); MESSAGEs read before the RECEIPT (the
    sender may subscribe too) stay for :func:`message`."""
    headers = "".join(f"{h}\n" for h in extra)
    raw.send(f"SEND\ndestination:{destination}\n{headers}receipt:{receipt}\n\n{body}\x00".encode())
    early: list[Frame] = []
    while (frame := raw.next()).command is Command.MESSAGE:
        early.append(frame)
    assert frame.header("receipt-id") == receipt, frame
    raw.frames[:0] = early


def subscribe(raw: Raw, destination: str, sub_id: str, *extra: str) -> None:
    headers = "".join(f"{h}\n" for h in extra)
    raw.send(
        f"SUBSCRIBE\nid:{sub_id}\ndestination:{destination}\n{headers}receipt:sub-{sub_id}\n\n"
        "\x00".encode()
    )
    frame = raw.next()
    assert frame.header("receipt-id") == f"sub-{sub_id}", frame


def message(raw: Raw) -> Frame:
    frame = raw.next()
    assert frame.command is Command.MESSAGE, frame
    return frame


def test_two_virtual_hosts_isolate_queues_topics_and_wildcards(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    """The same names on two virtual hosts are different destinations: each side sees
    only what was sent on its own (a marker sent after the other side's message comes
    first), with the destination named as its client named it."""
    server = serve_factory(config=TWO_HOSTS)
    alpha = on_host(raws, server, "alpha.example")
    other_alpha = on_host(raws, server, "a.example")  # another name of the same host
    beta = on_host(raws, server, "beta")  # a virtual host's own name reaches it
    for raw in (alpha, beta):
        subscribe(raw, "/queue/a", "q")
        subscribe(raw, "/topic/t", "t")
        subscribe(raw, "/queue/w.*", "w")
    send(other_alpha, "/queue/a", "alpha-queue", "r1")
    send(other_alpha, "/topic/t", "alpha-topic", "r2")
    send(other_alpha, "/queue/w.1", "alpha-wild", "r3")
    got = {message(alpha).body for _ in range(3)}
    assert got == {b"alpha-queue", b"alpha-topic", b"alpha-wild"}
    send(beta, "/queue/a", "beta-queue", "r4")
    first = message(beta)
    assert (first.body, first.header("destination")) == (b"beta-queue", "/queue/a")
    send(beta, "/topic/t", "beta-topic", "r5")
    assert message(beta).body == b"beta-topic"
    send(beta, "/queue/w.2", "beta-wild", "r6")
    wild = message(beta)
    assert (wild.body, wild.header("destination")) == (b"beta-wild", "/queue/w.2")


def test_stomp_1_0_lands_on_the_first_virtual_host_and_1_1_needs_a_known_one(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    server = serve_factory(config=TWO_HOSTS)
    old = raws(server.port)  # STOMP 1.0: no accept-version, no host
    old.send(b"CONNECT\n\n\x00")
    assert old.next().command is Command.CONNECTED
    send(old, "/queue/first", "from-1.0", "r")
    alpha = on_host(raws, server, "alpha.example")
    subscribe(alpha, "/queue/first", "s")
    assert message(alpha).body == b"from-1.0"
    beta = on_host(raws, server, "beta.example")
    subscribe(beta, "/queue/first", "s")
    send(beta, "/queue/first", "beta-marker", "m")
    assert message(beta).body == b"beta-marker"
    for version, host in (("1.1", "gamma.example"), ("1.2", "localhost")):
        unknown = raws(server.port)  # localhost: no configured virtual host lists it
        unknown.send(connect_frame(accept_version=version, host=host))
        error = unknown.next()
        assert error.command is Command.ERROR
        assert f"unknown virtual host {host!r}" in (error.header("message") or "")
        assert unknown.closed_by_server()
        assert unknown.frames == []


def test_hostile_host_headers_are_refused_cleanly(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    """A 1 MiB ``host`` crosses the header limit; control characters name no virtual
    host: one ERROR each (the name shown escaped), then the close; the broker keeps
    serving a client connected before them."""
    server = serve_factory(config=TWO_HOSTS)
    bystander = on_host(raws, server, "beta.example")
    subscribe(bystander, "/queue/calm", "s")
    huge = raws(server.port)
    huge.send(connect_frame(accept_version="1.2", host="h" * (1 << 20)))
    error = huge.next()
    assert error.command is Command.ERROR
    assert "max_header_length" in (error.header("message") or "")
    assert huge.closed_by_server()
    control = raws(server.port)
    control.send(connect_frame(accept_version="1.2", host="beta\x01.example\x1b[2J\x7f"))
    error = control.next()
    text = error.header("message") or ""
    assert error.command is Command.ERROR and "unknown virtual host" in text
    assert "\\x01" in text and "\x01" not in text and "\x1b" not in text
    assert control.closed_by_server()
    send(bystander, "/queue/calm", "still served", "r")
    assert message(bystander).body == b"still served"


def _tmqp(server: Serve) -> str:
    args = [str(arg) for arg in server.proc.args]  # type: ignore[union-attr]
    return args[args.index("--bind") + 1]


def test_tmqp_reaches_a_virtual_hosts_queue_by_its_prefixed_channel(
    serve_factory: Callable[..., Serve],
    raws: Callable[[int], Raw],
    zctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    """``/queue/orders`` of ``alpha`` is the engine channel ``alpha/orders``: a TMQP
    consumer of that channel gets alpha's message (not beta's), and a TMQP push to it
    reaches alpha's STOMP subscriber as ``/queue/orders``."""
    server = serve_factory(config=TWO_HOSTS)
    alpha = on_host(raws, server, "alpha.example")
    beta = on_host(raws, server, "beta.example")
    send(beta, "/queue/orders", "beta-order", "rb")
    send(alpha, "/queue/orders", "alpha-order", "ra")
    with Client(_tmqp(server), context=zctx, timeout=30).connect() as tmqp:
        tmqp.join("alpha/orders")
        got = tmqp.receive(timeout=30)
        assert got is not None and bytes(got.payload) == b"alpha-order"
        tmqp.ack(got)
        tmqp.leave("alpha/orders")
        subscribe(alpha, "/queue/orders", "s")
        tmqp.push("alpha/orders", 0, b"from tmqp")
        frame = message(alpha)
        assert (frame.body, frame.header("destination")) == (b"from tmqp", "/queue/orders")
    subscribe(beta, "/queue/orders", "s")
    assert message(beta).body == b"beta-order"


def test_persisted_destinations_keep_their_virtual_host_across_kill_9(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw], tmp_path: Path
) -> None:
    """A durable subscription ``d1`` made on ``beta`` and a persistent queue message
    sent on ``alpha`` come back after a kill -9 on their own virtual host only: ``alpha``
    has no ``d1`` (and may make one of its own), ``beta``'s ``/queue/keep`` is empty."""
    server = serve_factory("--data", str(tmp_path / "data"), config=TWO_HOSTS)
    beta = on_host(raws, server, "beta.example")
    subscribe(beta, "/topic/news", "d1", "persistent:true")
    beta.send(b"UNSUBSCRIBE\nid:d1\nreceipt:u\n\n\x00")  # it keeps collecting
    assert beta.next().header("receipt-id") == "u"
    alpha = on_host(raws, server, "alpha.example")
    send(alpha, "/topic/news", "alpha-news", "a1")  # alpha's topic: not beta's d1
    send(alpha, "/queue/keep", "alpha-kept", "a2", "persistent:true")
    for i in range(3):
        send(beta, "/topic/news", f"beta-news-{i}", f"b{i}", "persistent:true")
    server.kill9()
    server.restart()
    stranger = on_host(raws, server, "alpha.example")
    stranger.send(b"SUBSCRIBE\nid:d1\ndestination:/dsub/d1\nreceipt:x\n\n\x00")
    error = stranger.next()
    assert error.command is Command.ERROR
    assert "no durable subscription" in (error.header("message") or "")
    own = on_host(raws, server, "alpha.example")  # alpha's own d1: empty, independent
    subscribe(own, "/topic/news", "d1", "persistent:true")
    send(own, "/topic/news", "alpha-after", "a3")
    assert message(own).body == b"alpha-after"
    back = on_host(raws, server, "beta.example")
    subscribe(back, "/dsub/d1", "d1", "ack:client-individual")
    got = [message(back) for _ in range(3)]
    assert [f.body for f in got] == [b"beta-news-0", b"beta-news-1", b"beta-news-2"]
    assert {f.header("destination") for f in got} == {"/dsub/d1"}
    empty = on_host(raws, server, "beta.example")
    subscribe(empty, "/queue/keep", "k")
    send(empty, "/queue/keep", "beta-marker", "m")
    assert message(empty).body == b"beta-marker"
    kept = on_host(raws, server, "alpha.example")
    subscribe(kept, "/queue/keep", "k")
    assert message(kept).body == b"alpha-kept"


BAD_CONFIGS = {
    "names twice": (
        '[[stomp.virtual_hosts]]\nname = "x"\nhost_names = ["a"]\n'
        '[[stomp.virtual_hosts]]\nname = "x"\nhost_names = ["b"]\n',
        "virtual host 'x' is named twice",
    ),
    "host name twice": (
        '[[stomp.virtual_hosts]]\nname = "x"\nhost_names = ["a"]\n'
        '[[stomp.virtual_hosts]]\nname = "y"\nhost_names = ["a"]\n',
        "host name 'a' of virtual host 'y' already reaches 'x'",
    ),
    "host name is another's name": (
        '[[stomp.virtual_hosts]]\nname = "x"\nhost_names = ["a"]\n'
        '[[stomp.virtual_hosts]]\nname = "y"\nhost_names = ["x"]\n',
        "host name 'x' of virtual host 'y' already reaches 'x'",
    ),
    "empty host_names": (
        '[[stomp.virtual_hosts]]\nname = "x"\nhost_names = []\n',
        "host_names must be a non-empty list",
    ),
    "no virtual hosts": ("[stomp]\nvirtual_hosts = []\n", "must be a non-empty list"),
    "a slash in a name": (
        '[[stomp.virtual_hosts]]\nname = "x/y"\nhost_names = ["a"]\n',
        "name must be 1 to 64 characters",
    ),
    "a space in a host name": (
        '[[stomp.virtual_hosts]]\nname = "x"\nhost_names = ["a b"]\n',
        "printable ASCII characters without spaces",
    ),
    "an unknown key": (
        '[[stomp.virtual_hosts]]\nname = "x"\nhost_names = ["a"]\nport = 1\n',
        "unknown keys ['port']",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_virtual_hosts_config_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    text, match = BAD_CONFIGS[case]
    path = tmp_path / "broker.toml"
    path.write_text(text)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--bind",
            f"tcp://127.0.0.1:{free_port()}",
            "--stomp",
            f"tcp://127.0.0.1:{free_port()}",
            "--data",
            "none",
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and match in done.stderr, done.stderr
    assert "config stomp: " in done.stderr and "Traceback" not in done.stderr


def test_temporary_destinations_belong_to_their_virtual_host(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    """A ``/temp-queue/`` of an ``alpha`` connection, named as its ``reply-to`` shows it,
    is reachable from ``alpha`` only: a ``beta`` SEND to that name is refused (no such
    temporary destination there), an ``alpha`` one arrives."""
    server = serve_factory(config=TWO_HOSTS)
    owner = on_host(raws, server, "alpha.example")
    subscribe(owner, "/temp-queue/replies", "r")
    owner.send(b"SEND\ndestination:/queue/ask\nreply-to:/temp-queue/replies\nreceipt:q\n\n\x00")
    assert owner.next().header("receipt-id") == "q"
    asker = on_host(raws, server, "alpha.example")
    subscribe(asker, "/queue/ask", "a")
    reply_to = message(asker).header("reply-to") or ""
    assert reply_to.startswith("/queue/temp.")
    outsider = on_host(raws, server, "beta.example")
    outsider.send(f"SEND\ndestination:{reply_to}\nreceipt:x\n\nforged\x00".encode())
    error = outsider.next()
    assert error.command is Command.ERROR and error.header("receipt-id") == "x"
    assert "no such temporary destination" in (error.header("message") or "")
    send(asker, reply_to, "answer", "y")
    assert message(owner).body == b"answer"


def test_a_run_of_sends_to_several_destinations_lands_in_its_own_virtual_host(
    serve_factory: Callable[..., Serve], raws: Callable[[int], Raw]
) -> None:
    """One write of SENDs naming two queues in turn (the door renames a run's
    destinations per change of the parsed tuple): each lands in its queue of the
    sender's virtual host, each queue's in order; the other virtual host's get none."""
    server = serve_factory(config=TWO_HOSTS)
    here = on_host(raws, server, "alpha.example")
    there = on_host(raws, server, "beta.example")
    for raw in (here, there):
        subscribe(raw, "/queue/a", "a")
        subscribe(raw, "/queue/b", "b")
    targets = ["a", "a", "b", "a", "b", "b"]
    sender = on_host(raws, server, "alpha.example")
    sender.send(
        "".join(
            f"SEND\ndestination:/queue/{t}\nreceipt:r{i}\n\n{t}{i}\x00"
            for i, t in enumerate(targets)
        ).encode()
    )
    assert [sender.next().header("receipt-id") for _ in targets] == [
        f"r{i}" for i in range(len(targets))
    ]
    got = [message(here) for _ in targets]
    for queue in ("a", "b"):  # (each queue's messages in order; the two queues interleave)
        assert [f.body.decode() for f in got if f.header("destination") == f"/queue/{queue}"] == [
            f"{t}{i}" for i, t in enumerate(targets) if t == queue
        ]
    send(there, "/queue/a", "marker", "m")
    assert message(there).body == b"marker"  # (nothing of the run before it)
