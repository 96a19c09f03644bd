"""The console's actions over real HTTP against a running hub: each changes the broker (read
back through a broker client), browse moves nothing, and a request without the token, from a
foreign origin or shaped like a cross-site form is refused and changes nothing.  The broker's
own authorization applies to the console's actions (``[console] broker_token``)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import zmq

from broker.client.blocking import Client
from broker.client.errors import RemoteError
from broker.engine.auth import Action, TokenAuthorizer
from tests.polling import wait_until
from zerohub.config import (
    BrokerConfig,
    ConfigError,
    ConsoleConfig,
    FilesConfig,
    HubConfig,
    PublishConfig,
    check,
)
from zerohub.console import TOKEN_HEADER
from zerohub.hub import Hub, HubEndpoints, build

PULL = 3


def post(
    url: str,
    body: Any,
    *,
    token: str | None,
    headers: dict[str, str] | None = None,
    path: str = "/api/action",
    method: str = "POST",
) -> tuple[int, Any]:
    """POST ``body`` (JSON unless bytes) to the console; (status, decoded JSON or text)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {"Content-Type": "application/json", **(headers or {})}
        if token is not None:
            sent[TOKEN_HEADER] = token
        conn.request(method, path, body=data, headers=sent)
        answer = conn.getresponse()
        raw = answer.read()
        kind = answer.getheader("Content-Type") or ""
        return answer.status, json.loads(raw) if kind.startswith("application/json") else raw
    finally:
        conn.close()


def queue_info(client: Client, channel: str, queue: int) -> dict[str, Any] | None:
    try:
        info: dict[str, Any] = client.queue_info(channel, queue)
    except RemoteError as exc:
        assert exc.code == 404
        return None
    return info


@pytest.fixture
def watched(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> Iterator[tuple[Hub, str, Client]]:
    the_hub, endpoints, _tmp = hub
    with Client(endpoints.broker, context=zctx, timeout=10).connect() as client:
        yield the_hub, endpoints.http["console"], client


def test_each_action_changes_the_broker(watched: tuple[Hub, str, Client]) -> None:
    the_hub, url, client = watched
    token = the_hub.console_token
    assert len(token) >= 16

    status, answer = post(url, {"action": "create-channel", "channel": "orders"}, token=token)
    assert status == 200, answer
    assert [c["Name"] for c in client.channels()] == ["orders"]

    request = {"action": "create-queue", "channel": "orders", "queue": 5, "status": "pull"}
    assert post(url, request, token=token)[0] == 200
    info = queue_info(client, "orders", 5)
    assert info is not None and info["Status"] == "Pull"
    status, answer = post(url, request, token=token)  # twice: the broker says so
    assert status == 409 and "exists" in answer["error"], answer

    for i in range(3):
        client.push("orders", 5, f"order {i}".encode(), ack=True)
    client.push("orders", 5, b"\xff\xfe binary", ack=True)

    status, answer = post(
        url, {"action": "browse", "channel": "orders", "queue": 5, "limit": 3}, token=token
    )
    assert status == 200, answer
    assert [m["text"] for m in answer["messages"]] == ["order 0", "order 1", "order 2"]
    assert [m["size"] for m in answer["messages"]] == [7, 7, 7]
    status, answer = post(url, {"action": "browse", "channel": "orders", "queue": 5}, token=token)
    assert answer["messages"][3]["base64"] == "//4gYmluYXJ5"
    assert queue_info(client, "orders", 5)["Messages"] == 4  # type: ignore[index]

    request = {"action": "set-status", "channel": "orders", "queue": 5, "status": "Paused"}
    assert post(url, request, token=token)[0] == 200
    assert queue_info(client, "orders", 5)["Status"] == "Paused"  # type: ignore[index]

    status, answer = post(url, {"action": "purge", "channel": "orders", "queue": 5}, token=token)
    assert status == 200 and answer["removed"] == 4, answer
    assert queue_info(client, "orders", 5)["Messages"] == 0  # type: ignore[index]

    request = {"action": "delete-queue", "channel": "orders", "queue": 5}
    assert post(url, request, token=token)[0] == 200
    assert queue_info(client, "orders", 5) is None
    status, answer = post(url, request, token=token)
    assert status == 404, answer

    assert post(url, {"action": "delete-channel", "channel": "orders"}, token=token)[0] == 200
    assert client.channels() == []


def test_requests_without_the_token_or_from_elsewhere_change_nothing(
    watched: tuple[Hub, str, Client],
) -> None:
    the_hub, url, client = watched
    token = the_hub.console_token
    client.create_queue("orders", 1, {"Status": "Pull"})
    client.push("orders", 1, b"keep me", ack=True)
    purge = {"action": "purge", "channel": "orders", "queue": 1}
    own = url.replace("http://", "")

    refusals = [
        (post(url, purge, token=None), 401),
        (post(url, purge, token=""), 401),
        (post(url, purge, token=token[:-1]), 401),
        (post(url, purge, token=token + "x"), 401),
        (post(url, purge, token=token, headers={"Origin": "http://evil.example"}), 403),
        (post(url, purge, token=token, headers={"Origin": "null"}), 403),
        (post(url, purge, token=token, headers={"Origin": f"https://{own}"}), 403),
        (post(url, purge, token=token, headers={"Sec-Fetch-Site": "cross-site"}), 403),
        (post(url, purge, token=token, headers={"Sec-Fetch-Site": "same-site"}), 403),
        (post(url, purge, token=token, headers={"Host": "evil.example"}), 421),
        # what an HTML form can send: refused for its type even with the token
        (post(url, purge, token=token, headers={"Content-Type": "text/plain"}), 415),
        (
            post(
                url,
                b"action=purge&channel=orders&queue=1",
                token=token,
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            ),
            415,
        ),
        (post(url, purge, token=token, method="GET"), 405),
        (post(url, purge, token=token, path="/api/status"), 405),
        (post(url, purge, token=token, path="/nowhere"), 404),
        (post(url, b"{not json", token=token), 400),
        (post(url, [1, 2], token=token), 400),
        (post(url, {"action": "format-disk"}, token=token), 400),
        (post(url, {**purge, "queue": "1; drop"}, token=token), 400),
        (post(url, {**purge, "queue": 70000}, token=token), 400),
        (post(url, {**purge, "channel": ""}, token=token), 400),
        (post(url, {**purge, "channel": "c" * 300}, token=token), 400),
        (post(url, b"x" * (64 * 1024 + 1), token=token), 413),
    ]
    for (status, answer), expected in refusals:
        assert status == expected, (status, answer)
    assert queue_info(client, "orders", 1)["Messages"] == 1  # type: ignore[index]

    # the same request from the console's own origin goes through
    status, answer = post(url, purge, token=token, headers={"Origin": url})
    assert status == 200, answer
    assert queue_info(client, "orders", 1)["Messages"] == 0  # type: ignore[index]
    # and the doors keep serving
    status, answer = post(url, {**purge, "action": "browse"}, token=token)
    assert status == 200 and answer["messages"] == []


def _hub_with_authorizer(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]], broker_token: str
) -> Hub:
    public = tmp_path / "public"
    public.mkdir(exist_ok=True)
    config = HubConfig(
        files=FilesConfig(
            bind="tcp://127.0.0.1:*", publish=(PublishConfig(public, "/"),), state=False
        ),
        broker=BrokerConfig(bind="tcp://127.0.0.1:*"),
        console=ConsoleConfig(
            enabled=True,
            address="127.0.0.1:0",
            token="a-console-token-of-some-length",
            broker_token=broker_token,
        ),
    )
    authorizer = TokenAuthorizer(
        {"admin": set(Action), "viewer": {Action.QUEUE_LIST, Action.CHANNEL_LIST}},
        require_token=True,
    )
    return build(config, zctx, authorizer=authorizer)


def test_the_console_is_no_way_around_the_brokers_authorization(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    hub = _hub_with_authorizer(tmp_path, zctx, broker_token="viewer")
    endpoints = hub.start()
    try:
        url, token = endpoints.http["console"], "a-console-token-of-some-length"
        assert hub.console_token == token
        with Client(endpoints.broker, context=zctx, token="admin", timeout=10) as admin:
            admin.create_queue("orders", 1, {"Status": "Pull"})
            admin.push("orders", 1, b"secret", ack=True)
            for request in (
                {"action": "purge", "channel": "orders", "queue": 1},
                {"action": "delete-queue", "channel": "orders", "queue": 1},
                {"action": "set-status", "channel": "orders", "queue": 1, "status": "Stopped"},
                {"action": "create-queue", "channel": "orders", "queue": 2},
                {"action": "delete-channel", "channel": "orders"},
                {"action": "browse", "channel": "orders", "queue": 1},  # needs browse
            ):
                status, answer = post(url, request, token=token)
                assert status == 401, (request, status, answer)
                assert "refused" in answer["error"]
            info = queue_info(admin, "orders", 1)
            assert info is not None and info["Messages"] == 1 and info["Status"] == "Pull"
            assert [q["Id"] for q in admin.queues("orders")] == [1]
    finally:
        hub.stop()


def test_a_console_whose_broker_token_is_refused_says_so(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    hub = _hub_with_authorizer(tmp_path, zctx, broker_token="")  # no token: not admitted
    endpoints = hub.start()
    try:
        url = endpoints.http["console"]
        request = {"action": "create-channel", "channel": "x"}
        status, answer = post(url, request, token="a-console-token-of-some-length")
        assert status == 502 and "connect" in answer["error"], answer
        # the status page is still served
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.request("GET", "/api/status")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        hub.stop()


def _expired_queue(client: Client, channel: str, n: int) -> None:
    """A Pull queue whose ``n`` messages expired into its trash (then no timeout any
    more: what is resubmitted stays)."""
    client.create_queue(channel, 1, {"Status": "Pull", "MessageTimeout": 50})
    for i in range(n):
        client.push(channel, 1, f"lost {i}".encode(), ack=True)
    assert wait_until(lambda: len(client.trash_list(channel, 1)) == n, timeout=30)
    client.update_queue(channel, 1, {"MessageTimeout": 0})


def test_trash_list_resubmit_and_purge(watched: tuple[Hub, str, Client]) -> None:
    the_hub, url, client = watched
    token = the_hub.console_token
    _expired_queue(client, "late", 4)
    status, listed = post(url, {"action": "trash", "channel": "late", "queue": 1}, token=token)
    assert status == 200, listed
    assert listed["trash"] is True and listed["channel"] == "late"
    rows = listed["messages"]
    assert [m["text"] for m in rows] == [f"lost {i}" for i in range(4)]
    assert {m["reason"] for m in rows} == {"expired"}
    assert all(m["headers"] == [] for m in rows)  # the reason is not shown twice
    seqs = [m["sequence"] for m in rows]
    # one message back into its queue
    status, done = post(
        url,
        {"action": "trash-resubmit", "channel": "late", "queue": 1, "sequences": [seqs[1]]},
        token=token,
    )
    assert (status, done["resubmitted"]) == (200, 1)
    assert client.queue_info("late", 1)["Messages"] == 1
    assert [bytes(b.message.payload) for b in client.browse("late", 1, 0)] == [b"lost 1"]
    # one removed, then the rest
    status, done = post(
        url,
        {"action": "trash-purge", "channel": "late", "queue": 1, "sequences": [seqs[0]]},
        token=token,
    )
    assert (status, done["purged"]) == (200, 1)
    left = [b.sequence for b in client.trash_list("late", 1)]
    assert left == [seqs[2], seqs[3]]
    status, done = post(url, {"action": "trash-purge", "channel": "late", "queue": 1}, token=token)
    assert (status, done["purged"]) == (200, 2)
    assert client.trash_list("late", 1) == []
    assert client.queue_info("late", 1)["Messages"] == 1  # the resubmitted one stays


@pytest.mark.parametrize(
    "sequences",
    [[], "1", [0], [-3], [True], [2**63], list(range(1, 102)), [1.5]],
    ids=["empty", "text", "zero", "negative", "bool", "too-big", "too-many", "float"],
)
def test_trash_actions_refuse_bad_sequences_and_change_nothing(
    watched: tuple[Hub, str, Client], sequences: Any
) -> None:
    the_hub, url, client = watched
    _expired_queue(client, "bad", 2)
    for action in ("trash-resubmit", "trash-purge"):
        status, answer = post(
            url,
            {"action": action, "channel": "bad", "queue": 1, "sequences": sequences},
            token=the_hub.console_token,
        )
        assert status == 400 and "sequences" in answer["error"]
    assert len(client.trash_list("bad", 1)) == 2
    assert client.queue_info("bad", 1)["Messages"] == 0


def test_trash_actions_need_the_token_and_the_brokers_permission(
    watched: tuple[Hub, str, Client],
) -> None:
    the_hub, url, client = watched
    _expired_queue(client, "kept", 1)
    status, _ = post(url, {"action": "trash-purge", "channel": "kept", "queue": 1}, token=None)
    assert status == 401
    status, _ = post(url, {"action": "trash", "channel": "nowhere", "queue": 1},
                     token=the_hub.console_token)  # fmt: skip
    assert status == 404
    assert len(client.trash_list("kept", 1)) == 1


def _curve_hub(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]], console_key: str | None
) -> Hub:
    """A hub whose broker requires CURVE (keys in ``tmp_path/allow``: the client's and,
    with ``console_key`` "allowed", the console's); the console's certificate as told."""
    from zerohub.zmqkit import new_certificate

    public = tmp_path / "public"
    public.mkdir()
    allow = tmp_path / "allow"
    allow.mkdir()
    _pub, server_sec = new_certificate("broker", tmp_path / "server")
    client_pub, _sec = new_certificate("client", tmp_path / "clients")
    (allow / "client.key").write_bytes(client_pub.read_bytes())
    console_sec = None
    if console_key is not None:
        console_pub, console_sec = new_certificate("console", tmp_path / "console")
        if console_key == "allowed":
            (allow / "console.key").write_bytes(console_pub.read_bytes())
    config = HubConfig(
        files=FilesConfig(
            bind="tcp://127.0.0.1:*", publish=(PublishConfig(public, "/"),), state=False
        ),
        broker=BrokerConfig(bind="tcp://127.0.0.1:*", curve_secret=server_sec, allow=allow),
        console=ConsoleConfig(
            enabled=True,
            address="127.0.0.1:0",
            token="a-console-token-of-some-length",
            curve_secret=console_sec,
        ),
    )
    return build(check(config), zctx)


def _curve_client(tmp_path: Path, endpoint: str, zctx: zmq.Context[zmq.Socket[bytes]]) -> Client:
    return Client(
        endpoint,
        context=zctx,
        server_key=tmp_path / "server" / "broker.key",
        curve_secret=tmp_path / "clients" / "client.key_secret",
        timeout=10,
    ).connect()


def test_console_actions_on_a_curve_broker_with_the_consoles_own_key(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """Regression: the console's broker client had no key, so every action on a CURVE
    broker failed (502).  With ``[console] curve_secret`` they work."""
    hub = _curve_hub(tmp_path, zctx, "allowed")
    endpoints = hub.start()
    try:
        url, token = endpoints.http["console"], "a-console-token-of-some-length"
        with _curve_client(tmp_path, endpoints.broker, zctx) as client:
            status, answer = post(
                url,
                {"action": "create-queue", "channel": "sealed", "queue": 4, "status": "Pull"},
                token=token,
            )
            assert status == 200, answer
            client.push("sealed", 4, b"inside", ack=True)
            status, answer = post(url, {"action": "browse", "channel": "sealed", "queue": 4},
                                  token=token)  # fmt: skip
            assert status == 200 and [m["text"] for m in answer["messages"]] == ["inside"]
            status, answer = post(url, {"action": "purge", "channel": "sealed", "queue": 4},
                                  token=token)  # fmt: skip
            assert (status, answer["removed"]) == (200, 1)
            assert client.queue_info("sealed", 4)["Messages"] == 0
    finally:
        hub.stop()


def test_console_of_a_curve_broker_without_a_key_says_which_to_set(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    hub = _curve_hub(tmp_path, zctx, None)
    endpoints = hub.start()
    try:
        status, answer = post(
            endpoints.http["console"],
            {"action": "create-channel", "channel": "x"},
            token="a-console-token-of-some-length",
        )
        assert status == 503 and "[console] curve_secret" in answer["error"], answer
        with _curve_client(tmp_path, endpoints.broker, zctx) as client:
            assert [c["Name"] for c in client.channels()] == []
    finally:
        hub.stop()


def test_a_console_key_the_broker_does_not_allow_is_a_config_error(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    with pytest.raises(ConfigError) as caught:
        _curve_hub(tmp_path, zctx, "not-allowed")
    assert caught.value.key == "console.curve_secret"
    assert "broker.allow" in str(caught.value)


def test_a_console_key_without_a_curve_broker_is_a_config_error(tmp_path: Path) -> None:
    config = HubConfig(
        files=FilesConfig(publish=(PublishConfig(tmp_path, "/"),), state=False),
        console=ConsoleConfig(enabled=True, curve_secret=tmp_path / "c.key_secret"),
    )
    with pytest.raises(ConfigError) as caught:
        check(config)
    assert caught.value.key == "console.curve_secret"
