"""``broker serve --stomp``: browsing subscriptions that follow their queue
(``browser:true`` with ``browser-end:false``: no end marker, then every message the queue
takes afterwards) and two subscriptions of one connection on one queue, with stomp.py and
raw frames over real sockets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker.stomp.frames import Command
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve, bodies, recorder, synced
from tests.stomp.test_serve_flow import frame, raw_synced, send_all

FOLLOW = {"browser": "true", "browser-end": "false"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    serve = Serve(tmp_path_factory.mktemp("subs"))
    yield serve
    assert serve.stop() == 0


def test_a_following_browser_sees_what_is_there_then_each_new_message(
    clients: Callable[[], Any],
) -> None:
    producer = clients()
    send_all(producer, "/queue/follow1", [(f"old{i}", {}) for i in range(3)])
    browser = clients()
    browser.subscribe("/queue/follow1", id="b", headers=FOLLOW)
    assert wait_until(lambda: len(bodies(browser)) == 3)
    synced(browser, "b1")
    send_all(producer, "/queue/follow1", [(f"new{i}", {}) for i in range(4)])
    assert wait_until(lambda: len(bodies(browser)) == 7)
    synced(browser, "b2")
    assert bodies(browser) == ["old0", "old1", "old2", "new0", "new1", "new2", "new3"]
    assert all("browser" not in m.headers for m in recorder(browser).messages)  # no end
    browser.unsubscribe("b")
    synced(browser, "b3")
    send_all(producer, "/queue/follow1", [("after", {})])
    synced(browser, "b4")
    assert len(bodies(browser)) == 7  # unsubscribed: it follows no more
    consumer = clients()  # the browser consumed nothing
    consumer.subscribe("/queue/follow1", id="c")
    assert wait_until(lambda: len(bodies(consumer)) == 8)


def test_a_following_browser_of_an_empty_queue_sees_the_first_message(
    raws: Callable[[], Raw], clients: Callable[[], Any]
) -> None:
    browser = raws()
    browser.send(
        frame("SUBSCRIBE", id="b", destination="/queue/follow2", receipt="s", **_follow())
    )
    assert browser.next().command is Command.RECEIPT
    assert raw_synced(browser, "empty") == []  # nothing there, and no end marker
    producer = clients()
    send_all(producer, "/queue/follow2", [("first", {}), ("second", {})])
    got = raw_synced(browser, "x")
    while len(got) < 2:
        got += raw_synced(browser, "y")
    assert [f.body for f in got] == [b"first", b"second"]
    assert all(f.header("browser") is None for f in got)


def test_messages_consumed_before_the_browser_looks_are_skipped_without_a_spin(
    clients: Callable[[], Any],
) -> None:
    """Adversary: a consumer takes each message before the follower reads it; the
    follower then waits for later numbers (it does not re-read the same end for ever:
    the broker stays responsive) and sees what is still there when it looks."""
    browser = clients()
    browser.subscribe("/queue/follow3", id="b", headers=FOLLOW)
    synced(browser, "b0")
    consumer = clients()
    consumer.subscribe("/queue/follow3", id="c")
    synced(consumer, "c0")
    producer = clients()
    send_all(producer, "/queue/follow3", [(f"m{i}", {}) for i in range(50)])
    assert wait_until(lambda: len(bodies(consumer)) == 50)
    consumer.unsubscribe("c")
    synced(consumer, "c1")
    send_all(producer, "/queue/follow3", [("kept", {})])
    assert wait_until(lambda: "kept" in bodies(browser))
    synced(browser, "b1")
    seen = bodies(browser)
    assert len(seen) == len(set(seen))  # nothing twice
    assert set(seen) <= {f"m{i}" for i in range(50)} | {"kept"}


def test_a_follower_that_never_reads_holds_nothing_back(
    server: Serve, clients: Callable[[], Any]
) -> None:
    """Adversary: a following browser that stops reading; producers and consumers of the
    queue go on, nothing is lost, and its connection's end stops the following."""
    browser = Raw(server.port, rcvbuf=4096)
    browser.connect()
    browser.send(frame("SUBSCRIBE", id="b", destination="/queue/follow4", **_follow()))
    producer = clients()
    items = [(f"{i:05d}" + "z" * 900, {}) for i in range(2000)]
    send_all(producer, "/queue/follow4", items)
    consumer = clients()
    consumer.subscribe("/queue/follow4", id="c")
    assert wait_until(lambda: len(bodies(consumer)) == 2000, timeout=60)
    assert sorted(b[:5] for b in bodies(consumer)) == [f"{i:05d}" for i in range(2000)]
    browser.close()
    send_all(producer, "/queue/follow4", [("after-close", {})])
    assert wait_until(lambda: "after-close" in bodies(consumer))


def _follow() -> dict[str, str]:
    return {"browser": "true", "browser_end": "false"}


# -- two subscriptions of one connection on one queue -----------------------------------


def test_two_subscriptions_on_one_queue_take_turns_and_each_message_goes_once(
    clients: Callable[[], Any],
) -> None:
    consumer = clients()
    consumer.subscribe("/queue/two1", id="a")
    consumer.subscribe("/queue/two1", id="b", ack="client-individual")
    synced(consumer, "subs")
    producer = clients()
    send_all(producer, "/queue/two1", [(f"m{i}", {}) for i in range(20)])
    assert wait_until(lambda: len(bodies(consumer)) == 20)
    messages = recorder(consumer).messages
    by_sub = {sub: [m.body for m in messages if m.headers["subscription"] == sub] for sub in "ab"}
    assert len(by_sub["a"]) == len(by_sub["b"]) == 10  # turns
    assert sorted(by_sub["a"] + by_sub["b"]) == sorted(f"m{i}" for i in range(20))
    for m in messages:
        if m.headers["subscription"] == "b":
            consumer.ack(m.headers["ack"])
    synced(consumer, "acked")
    other = clients()  # everything was acknowledged: nothing left for anyone
    other.subscribe("/queue/two1", id="o")
    synced(other, "o")
    send_all(producer, "/queue/two1", [("last", {})])
    assert wait_until(lambda: "last" in bodies(consumer) + bodies(other))
    synced(other, "o2")
    everything = sorted([*(f"m{i}" for i in range(20)), "last"])
    assert sorted(bodies(consumer) + bodies(other)) == everything


def test_unsubscribing_one_returns_only_its_own_unacked_deliveries(
    clients: Callable[[], Any],
) -> None:
    consumer = clients()
    consumer.subscribe("/queue/two2", id="a", ack="client-individual")
    consumer.subscribe("/queue/two2", id="b", ack="client-individual")
    synced(consumer, "subs")
    producer = clients()
    send_all(producer, "/queue/two2", [(f"m{i}", {}) for i in range(10)])
    assert wait_until(lambda: len(bodies(consumer)) == 10)
    first = list(recorder(consumer).messages)
    of_b = sorted(m.body for m in first if m.headers["subscription"] == "b")
    consumer.unsubscribe("a")  # a's five come back: to b, the one consumer left
    assert wait_until(lambda: len(bodies(consumer)) == 15)
    synced(consumer, "after")
    later = recorder(consumer).messages[10:]
    assert all(m.headers["subscription"] == "b" for m in later)
    assert sorted(m.body for m in later) == sorted(
        m.body for m in first if m.headers["subscription"] == "a"
    )  # b's own unacked deliveries were not sent again
    assert len(bodies(consumer)) == 15 and len(of_b) == 5


@pytest.mark.parametrize(
    "headers",
    [{"selector": "n > 1"}, {"credit": "5"}, {"include-seq": "s"}, {"exclusive": "true"}],
)
def test_a_second_subscription_the_engine_cannot_share_is_an_error(
    raws: Callable[[], Raw], clients: Callable[[], Any], headers: dict[str, str]
) -> None:
    """Adversary: a second subscription asking for per-consumer rules on a queue the
    connection consumes already is refused with an ERROR; other connections go on."""
    raw = raws()
    raw.send(frame("SUBSCRIBE", id="a", destination="/queue/two3", receipt="a"))
    assert raw.next().command is Command.RECEIPT
    raw.send(frame("SUBSCRIBE", id="b", destination="/queue/two3", **headers))
    error = raw.next()
    assert error.command is Command.ERROR, error
    assert "already subscribed" in str(error.header("message"))
    consumer = clients()
    consumer.subscribe("/queue/two3", id="c")
    synced(consumer, "c")
    producer = clients()
    send_all(producer, "/queue/two3", [("still", {})])
    assert wait_until(lambda: bodies(consumer) == ["still"])
