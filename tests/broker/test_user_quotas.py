"""Per-user quotas (``Limits.max_channels_per_user``, ``max_queues_per_user``,
``max_durable_subscriptions_per_user``; ``broker.engine.quotas``): what a user created
counts for it, every connection and both doors together; past a quota the creation is
refused (TMQP 482, STOMP an ERROR with the receipt-id) and nothing else changes; a
removal frees one slot; an admin token has none; a restart on ``--data`` counts again.

A real broker over loopback: a TMQP server and a STOMP listener on one engine
(``tests.stomp.two_doors``), and ``broker serve --data`` processes for the restart."""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client
from broker.client.errors import RemoteError
from broker.engine.auth import ALL_ACTIONS, ANONYMOUS, Action, AllowAll, TokenAuthorizer
from broker.engine.channel import Client as Client_
from broker.engine.engine import Engine
from broker.engine.federated import FEDERATION_CLIENT
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.engine.quotas import user_of
from broker.protocol import ConnectionInfo, Outgoing, ResultCode
from tests.broker.test_cli import run
from tests.broker.test_durable_ops import Broker as Serve
from tests.polling import wait_until
from tests.ports import free_port
from tests.stomp.two_doors import Broker

Ctx = zmq.Context[zmq.Socket[bytes]]
WAIT = 10.0
CHANNELS, QUEUES, DSUBS = 3, 4, 2
#: Users' rights: everything but ``admin`` (a token granted ``admin`` has no quota).
USER = ALL_ACTIONS - {Action.ADMIN}


def _limits() -> Limits:
    return dataclasses.replace(
        Limits(),
        max_channels_per_user=CHANNELS,
        max_queues_per_user=QUEUES,
        max_durable_subscriptions_per_user=DSUBS,
    )


def _doors(zctx: Ctx, authorizer: AllowAll | TokenAuthorizer) -> Broker:
    config = dataclasses.replace(BrokerConfig(), limits=_limits())
    return Broker(zctx, Engine(config=config, authorizer=authorizer))


@pytest.fixture
def doors(zctx: Ctx) -> Iterator[Broker]:
    """Tokens: alice and bob are users, root an admin; no token: anonymous users."""
    made = _doors(zctx, TokenAuthorizer({"alice": USER, "bob": USER, "root": ALL_ACTIONS},
                                        anonymous=USER))  # fmt: skip
    yield made
    made.stop()


@pytest.fixture
def open_doors(zctx: Ctx) -> Iterator[Broker]:
    """No tokens: a client is the user it names (``Client-Name``, STOMP ``login``)."""
    made = _doors(zctx, AllowAll())
    yield made
    made.stop()


class Stomp:
    """A raw STOMP 1.2 connection with a login and passcode; whole frames read back."""

    def __init__(self, port: int, login: str, passcode: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.buffer = b""
        code = f"passcode:{passcode}\n" if passcode is not None else ""
        self.sock.sendall(
            f"CONNECT\naccept-version:1.2\nhost:localhost\nlogin:{login}\n{code}\n\x00".encode()
        )
        assert self.next_frame().startswith(b"CONNECTED\n")

    def next_frame(self) -> bytes:
        while b"\x00" not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, f"connection closed; read {self.buffer!r}"
            self.buffer += chunk
        frame, _, self.buffer = self.buffer.partition(b"\x00")
        return frame.lstrip(b"\n")

    def ask(self, text: str, receipt: str) -> bytes:
        """A frame (command and headers) with ``receipt``; the answer (a SEND: body x)."""
        body = "x" if text.startswith("SEND\n") else ""
        self.sock.sendall(f"{text}\nreceipt:{receipt}\n\n{body}\x00".encode())
        return self.next_frame()

    def close(self) -> None:
        self.sock.close()


def _receipted(frame: bytes, receipt: str) -> bool:
    return frame.startswith(f"RECEIPT\nreceipt-id:{receipt}\n".encode())


def _refused(frame: bytes, receipt: str, limit: str) -> bool:
    return (
        frame.startswith(b"ERROR\n")
        and f"receipt-id:{receipt}\n".encode() in frame
        and f"{limit}=".encode() in frame
    )


def _tmqp(doors: Broker, token: str | None = None, name: str | None = None) -> Client:
    return Client(doors.endpoint, context=doors.zctx, token=token, name=name,
                  timeout=WAIT).connect()  # fmt: skip


def _refused_482(call: Callable[..., object], *args: object, limit: str) -> None:
    """``call(*args)`` is refused with 482 naming ``limit`` (a push waits for its ack)."""
    with pytest.raises(RemoteError) as info:
        if getattr(call, "__name__", "") == "push":
            call(*args, ack=True)
        else:
            call(*args)
    assert info.value.code == ResultCode.LIMIT_EXCEEDED, info.value
    assert f"{limit}=" in info.value.reason, info.value.reason


def _held(doors: Broker) -> dict[str, tuple[int, int, int]]:
    """Each user's (channels, queues, durable subscriptions), read on the engine thread."""
    box: list[dict[str, tuple[int, int, int]]] = []

    def read(now: float) -> list[Outgoing]:
        quotas = doors.engine.channel_registry.quotas
        box.append({user: quotas.held(user) for user in quotas.counts})
        return []

    doors.door.submit(read)
    assert wait_until(lambda: bool(box))
    return box[0]


def _channels(doors: Broker) -> set[str]:
    box: list[set[str]] = []
    doors.door.submit(lambda now: box.append(set(doors.engine.channels)) or [])
    assert wait_until(lambda: bool(box))
    return box[0]


def test_the_defaults_are_a_quarter_of_the_brokers() -> None:
    limits = Limits()
    assert limits.max_channels_per_user == limits.max_channels // 4 == 2_500
    assert limits.max_queues_per_user == limits.max_queues // 4 == 5_000
    assert limits.max_durable_subscriptions_per_user == 250


def test_a_full_user_is_refused_while_another_creates_and_a_removal_frees_one(
    doors: Broker,
) -> None:
    with _tmqp(doors, "alice") as alice, _tmqp(doors, "bob") as bob:
        alice.create_channel("a-made")  # an operation
        alice.push("a-pushed", 1, b"x", ack=True)  # on the fly: a channel and a queue
        alice.join("a-joined")  # on the fly by a JOIN
        _refused_482(alice.create_channel, "a-4", limit="max_channels_per_user")
        _refused_482(alice.push, "a-5", 1, b"x", limit="max_channels_per_user")
        _refused_482(alice.join, "a-6", limit="max_channels_per_user")
        _refused_482(alice.create_queue, "a-7", 1, limit="max_channels_per_user")
        assert not {"a-4", "a-5", "a-6", "a-7"} & _channels(doors)  # nothing made
        # what she has still works, and bob is not held up by her
        alice.push("a-pushed", 1, b"y", ack=True)
        bob.push("b-pushed", 1, b"x", ack=True)
        bob.create_channel("b-made")
        held = _held(doors)
        assert sorted(held.values()) == [(2, 1, 0), (3, 1, 0)], held
        # one removed: exactly one more, whichever way it is made
        alice.delete_channel("a-made")
        alice.join("a-again")
        _refused_482(alice.create_channel, "a-8", limit="max_channels_per_user")


def test_queues_count_per_user_and_a_removed_queue_frees_one(doors: Broker) -> None:
    with _tmqp(doors, "alice") as alice, _tmqp(doors, "bob") as bob:
        for qid in range(1, QUEUES + 1):
            alice.push("a-queues", qid, b"x", ack=True)
        _refused_482(alice.push, "a-queues", 99, b"x", limit="max_queues_per_user")
        _refused_482(alice.create_queue, "a-queues", 98, limit="max_queues_per_user")
        # a new channel is not made for a queue she may not have
        _refused_482(alice.push, "a-other", 1, b"x", limit="max_queues_per_user")
        assert "a-other" not in _channels(doors)
        bob.push("a-queues", 50, b"x", ack=True)  # his, in her channel
        alice.delete_queue("a-queues", 2)
        alice.push("a-queues", 97, b"x", ack=True)
        _refused_482(alice.push, "a-queues", 96, b"x", limit="max_queues_per_user")
        # her channel removed: its queues free their makers' slots, bob's too
        alice.delete_channel("a-queues")
        held = _held(doors)
        assert held == {}, held


def test_more_connections_and_the_stomp_door_share_one_users_quota(doors: Broker) -> None:
    """alice's token over two TMQP connections and as a STOMP passcode (the login is
    not checked, so it does not make another user)."""
    port = doors.listener.port
    with _tmqp(doors, "alice", "one") as first, _tmqp(doors, "alice", "two") as second:
        first.push("t-1", 1, b"x", ack=True)
        stomp = Stomp(port, "someone-else", "alice")
        try:
            assert _receipted(stomp.ask("SEND\ndestination:/queue/s-2", "r1"), "r1")
            second.create_channel("t-3")
            _refused_482(first.create_channel, "t-4", limit="max_channels_per_user")
            answer = stomp.ask("SEND\ndestination:/queue/s-5", "r2")
            assert _refused(answer, "r2", "max_channels_per_user"), answer
        finally:
            stomp.close()
        # bob over STOMP is not held up; alice's connections still work
        other = Stomp(port, "alice", "bob")  # (his token: the login is only a name)
        try:
            answer = other.ask("SUBSCRIBE\nid:1\ndestination:/topic/s-bob", "r3")
            assert _receipted(answer, "r3"), answer
        finally:
            other.close()
        second.push("t-1", 1, b"y", ack=True)
        assert sorted(_held(doors).values()) == [(1, 0, 0), (3, 2, 0)]


def test_without_tokens_a_user_is_its_name_on_both_doors(open_doors: Broker) -> None:
    port = open_doors.listener.port
    with _tmqp(open_doors, name="carol") as carol, _tmqp(open_doors) as nameless:
        carol.push("c-1", 1, b"x", ack=True)
        stomp = Stomp(port, "carol")
        try:
            assert _receipted(stomp.ask("SEND\ndestination:/queue/c-2", "r1"), "r1")
            assert _receipted(stomp.ask("SUBSCRIBE\nid:1\ndestination:/topic/c-3", "r2"), "r2")
            answer = stomp.ask("SUBSCRIBE\nid:2\ndestination:/topic/c-4", "r3")
            assert _refused(answer, "r3", "max_channels_per_user"), answer
        finally:
            stomp.close()
        _refused_482(carol.create_channel, "c-5", limit="max_channels_per_user")
        nameless.create_channel("n-1")  # anonymous: another user
        held = _held(open_doors)
        assert held == {"name:carol": (3, 2, 0), ANONYMOUS: (1, 0, 0)}, held


def test_durable_subscriptions_count_per_user_on_both_doors(doors: Broker) -> None:
    port = doors.listener.port
    with _tmqp(doors, "alice") as alice, _tmqp(doors, "bob") as bob:
        alice.create_channel("news")
        alice.create_durable_subscription("a1", ["news"])
        alice.create_durable_subscription("a1", ["news", "b-topic"])  # an update: no more
        stomp = Stomp(port, "alice", "alice")
        try:
            answer = stomp.ask("SUBSCRIBE\nid:a2\npersistent:true\ndestination:/topic/news", "r1")
            assert _receipted(answer, "r1"), answer
            answer = stomp.ask("SUBSCRIBE\nid:a3\npersistent:true\ndestination:/topic/news", "r2")
            assert _refused(answer, "r2", "max_durable_subscriptions_per_user"), answer
        finally:
            stomp.close()
        _refused_482(alice.create_durable_subscription, "a4", ["news"],
                     limit="max_durable_subscriptions_per_user")  # fmt: skip
        bob.create_durable_subscription("b1", ["news"])
        # a subscription's channel and queue count only as the subscription: she holds
        # news, and the STOMP destination /topic/news (a channel and its queue)
        assert _held(doors)[_user(doors, "alice")] == (2, 1, 2)
        alice.destroy_durable_subscription("a1")
        alice.create_durable_subscription("a5", ["news"])
        _refused_482(alice.create_durable_subscription, "a6", ["news"],
                     limit="max_durable_subscriptions_per_user")  # fmt: skip
        assert sorted(s["Id"] for s in alice.durable_subscriptions()) == ["a2", "a5", "b1"]
        # a STOMP UNSUBSCRIBE persistent:true frees one too
        stomp = Stomp(port, "alice", "alice")
        try:
            answer = stomp.ask("SUBSCRIBE\nid:a2\npersistent:true\ndestination:/topic/news", "r3")
            assert _receipted(answer, "r3"), answer
            assert _receipted(stomp.ask("UNSUBSCRIBE\nid:a2\npersistent:true", "r4"), "r4")
            answer = stomp.ask("SUBSCRIBE\nid:a7\npersistent:true\ndestination:/topic/news", "r5")
            assert _receipted(answer, "r5"), answer
            answer = stomp.ask("SUBSCRIBE\nid:a8\npersistent:true\ndestination:/topic/news", "r6")
            assert _refused(answer, "r6", "max_durable_subscriptions_per_user"), answer
        finally:
            stomp.close()
        assert sorted(s["Id"] for s in bob.durable_subscriptions()) == ["a5", "a7", "b1"]


def _user(doors: Broker, token: str) -> str:
    """The user a token is (a digest: the token itself is not kept)."""
    user = doors.engine.parts.authorizer.user(Client_("x", ConnectionInfo(token=token), 0.0))
    assert user is not None and token not in user
    return user


def test_an_admin_token_has_no_quota(doors: Broker) -> None:
    with _tmqp(doors, "root") as root:
        for i in range(CHANNELS + 2):
            root.push(f"r-{i}", 1, b"x", ack=True)
        for i in range(DSUBS + 1):
            root.create_durable_subscription(f"r{i}", ["r-0"])
    assert _held(doors) == {}


def test_a_restart_on_data_counts_each_users_creations_again(
    tmp_path: Path, zctx: Ctx, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(
        '[tokens]\nalice = ["channel-create", "channel-remove", "queue-create", "push",'
        ' "join", "channel-list"]\nbob = ["channel-create", "queue-create", "push"]\n'
        'root = "all"\n'
        "[limits]\nmax_channels_per_user = 2\nmax_durable_subscriptions_per_user = 1\n"
    )
    serve = Serve("--data", str(tmp_path / "data"), "--config", str(config))

    def client(token: str) -> Client:
        return Client(serve.endpoint, context=zctx, token=token, timeout=WAIT).connect()

    serve.start()
    try:
        with client("alice") as alice:
            alice.create_channel("a-1", {"Status": "RoundRobin"})  # kept: a definition
            alice.push("a-2", 1, b"x", ack=True)
            alice.create_durable_subscription("a", ["a-1"])
        with client("root") as root:  # (statistics need admin)
            limits = root.stats()["engine"]["limits"]
            assert limits["max_channels_per_user"] == 2
            assert limits["max_queues_per_user"] == Limits().max_queues_per_user
        serve.kill()  # kill -9: the creators are in the log as the definitions are
        serve.start()
        with client("alice") as alice, client("bob") as bob:
            _refused_482(alice.create_channel, "a-3", limit="max_channels_per_user")
            _refused_482(alice.create_durable_subscription, "b", ["a-1"],
                         limit="max_durable_subscriptions_per_user")  # fmt: skip
            bob.push("b-1", 1, b"x", ack=True)
            alice.delete_channel("a-2")  # frees one, and the record goes with it
        serve.close()
        serve.start()
        with client("alice") as alice:
            alice.create_channel("a-4")
            _refused_482(alice.create_channel, "a-5", limit="max_channels_per_user")
            names = {c["Name"] for c in alice.channels()}
            assert {"a-1", "a-4", "b-1", "/dsub/a"} <= names and "a-2" not in names
    finally:
        serve.close()


def test_per_user_limits_are_config_keys_both_ways() -> None:
    table = {
        "max_channels_per_user": 7,
        "max_queues_per_user": 8,
        "max_durable_subscriptions_per_user": 9,
    }
    limits = Limits.from_mapping(table)
    assert {k: limits.table()[k] for k in table} == table
    assert json.loads(json.dumps(limits.table())) == limits.table()


def test_a_bad_per_user_limit_in_the_config_is_a_one_line_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[limits]\nmax_queues_per_user = 0\n[server]\nbind = "tcp://127.0.0.1:{free_port()}"\n'
    )
    code, _, err = run(capsys, "serve", "--data", "none", "--config", str(config))
    assert code == 2 and len(err.splitlines()) == 1
    assert "max_queues_per_user must be a positive integer" in err


def test_the_federation_client_and_an_admin_have_no_quota_and_no_name_is_anonymous() -> None:
    tokens = TokenAuthorizer({"alice": USER, "root": ALL_ACTIONS}, anonymous=[Action.PUSH])
    engine = Engine(authorizer=tokens)
    made = {}
    for key, info in {
        "alice": ConnectionInfo(token="alice", name="any"),
        "root": ConnectionInfo(token="Bearer root"),
        "nobody": ConnectionInfo(name="someone"),
    }.items():
        client_id, _ = engine.connect(info, 0.0)
        made[key] = engine.clients[client_id].user
    assert made["alice"] is not None and made["alice"].startswith("token:")
    assert "alice" not in made["alice"] and made["root"] is None
    assert made["nobody"] == ANONYMOUS
    federation = Client_(FEDERATION_CLIENT, ConnectionInfo(), 0.0)
    assert user_of(tokens, federation) is None and user_of(AllowAll(), federation) is None
    assert AllowAll().user(Client_("x", ConnectionInfo(name="carol"), 0.0)) == "name:carol"
