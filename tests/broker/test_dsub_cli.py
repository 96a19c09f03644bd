"""``broker dsub list|create|delete`` against a live in-process server (TMQP ops 230-232)."""

from __future__ import annotations

import json

import pytest

from broker.cli import main
from broker.server import Server
from tests.broker.conftest import MakeClient


def test_dsub_cli_creates_lists_and_deletes(
    make_client: MakeClient, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    c = make_client()
    c.create_channel("news", {"Status": "Broadcast"})
    assert server.endpoint is not None
    at = ("--connect", server.endpoint)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    assert run("dsub", "list", *at) == (0, "", "")
    assert run("dsub", "create", "reader", "news", "sport", *at) == (0, "", "")
    for i in range(3):
        c.push("news", 0, f"n{i}", ack=True)
    assert run("dsub", "list", *at) == (0, "reader\tnews,sport\t3\t0\n", "")
    code, out, _ = run("dsub", "list", *at, "--json")
    assert code == 0
    assert json.loads(out) == {"Id": "reader", "Topics": ["news", "sport"], "Messages": 3,
                               "Consumers": 0}  # fmt: skip
    assert run("dsub", "create", "reader", "sport", *at) == (0, "", "")  # new topics
    assert c.durable_subscriptions()[0]["Topics"] == ["sport"]
    assert run("dsub", "delete", "reader", *at) == (0, "", "")
    assert c.durable_subscriptions() == []


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (("delete", "nobody"), 1, "404"),  # unknown id: the broker's answer, one line
        (("create", "bad id"), 2, "TOPIC"),  # no topic
        (("create", "bad id", "news"), 1, "400"),  # a space: not a channel name
        (("create", "x", "/dsub/y"), 1, "400"),  # nor a topic
        (("delete",), 2, "ID"),
        (("list", "extra"), 2, "no ID"),
        (("delete", "x", "news"), 2, "create"),
        (("rename", "x"), 2, "invalid choice"),
    ],
)
def test_dsub_cli_errors_are_one_line_with_their_exit_code(
    make_client: MakeClient,
    server: Server,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    code: int,
    says: str,
) -> None:
    c = make_client()
    c.create_durable_subscription("kept", ["t"])
    assert server.endpoint is not None
    try:
        got = main(["dsub", *argv, "--connect", server.endpoint])
    except SystemExit as exc:  # argparse's own usage errors
        got = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert (got, out) == (code, "")
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert [s["Id"] for s in c.durable_subscriptions()] == ["kept"]  # nothing changed, serving
