"""The web console in a real headless browser (Debian's ``chromium``): the page loads, runs
its script, fetches the status and shows a queue a test created, names as plain text; an
action taken in the page (driven over the DevTools protocol, ``tests/zerohub/cdp.py``)
changes the broker, and is refused without the token or from a page elsewhere; the
connected clients are listed (id, name as text, address).

Slow (a browser start or two); skipped when no ``chromium`` is installed (``.ci/run``
installs it).  The screenshots are kept in ``.artifacts/console.png`` and
``.artifacts/console-action.png`` (or under ``$ZEROHUB_ARTIFACTS``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client
from broker.client.errors import RemoteError
from tests.polling import wait_until
from tests.zerohub.cdp import WAIT, Browser
from zerohub.hub import Hub, HubEndpoints

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(
    os.environ.get("ZEROHUB_ARTIFACTS") or Path(__file__).resolve().parents[2] / ".artifacts"
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)"),
]


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with no network of its own (the flags this machine needs)."""
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",  # the page's script, and its fetch, run first
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_console_shows_a_queue_in_a_real_browser(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    _hub, endpoints, tmp_path = hub
    url = endpoints.http["console"] + "/"
    with Client(
        endpoints.broker, context=zctx, timeout=10, name="<i>tester</i>", client_type="cli"
    ).connect() as client:
        client.create_queue("<b>orders</b>", 5, {"Status": 3})
        for i in range(2):
            client.push("<b>orders</b>", 5, f"order {i}".encode(), ack=True)

        page = chromium(tmp_path / "profile-dom", "--dump-dom", url)
        assert page.returncode == 0, page.stderr[-2000:]
        dom = page.stdout
        assert '<span id="state" class="ok">up' in dom  # the script ran and fetched
        # the queue's row, its name as text (escaped), not as markup
        row = (
            "<tr><td>&lt;b&gt;orders&lt;/b&gt;</td><td>5</td><td>Pull</td>"
            '<td class="n">2</td><td class="n">0</td><td class="n">0</td>'
        )
        assert row in dom, dom
        assert "<b>orders</b>" not in dom
        assert "<tr><td>/</td><td>" in dom  # the mount
        # the channels, with their consumers
        assert '<tr><td>&lt;b&gt;orders&lt;/b&gt;</td><td class="n">0</td></tr>' in dom
        # the connected clients: the test's own, its name as text, and where it is from
        client_row = (
            f"<tr><td>{client.client_id}</td><td>&lt;i&gt;tester&lt;/i&gt;</td><td>cli</td>"
            "<td>127.0.0.1</td>"
        )
        assert client_row in dom, dom
        assert "<i>tester</i>" not in dom

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "console.png"
        shot.unlink(missing_ok=True)
        taken = chromium(
            tmp_path / "profile-shot", "--window-size=1200,900", f"--screenshot={shot}", url
        )
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _queue_button(action: str, channel: str, queue: int) -> str:
    """JavaScript: true once the row's button for ``action`` on a queue is drawn."""
    return (
        f"!![...document.querySelectorAll('#queues button[data-action={action}]')]"
        f".find(b => b.dataset.channel === {json.dumps(channel)} && "
        f"b.dataset.queue === '{queue}')"
    )


def _has_queue(client: Client, channel: str, queue: int) -> bool:
    try:
        client.queue_info(channel, queue)
    except RemoteError as exc:
        assert exc.code == 404
        return False
    return True


def _click(action: str, channel: str, queue: int) -> str:
    """JavaScript: click the row's button for ``action`` on a queue."""
    return (
        f"[...document.querySelectorAll('#queues button[data-action={action}]')]"
        f".find(b => b.dataset.channel === {json.dumps(channel)} && "
        f"b.dataset.queue === '{queue}').click()"
    )


def test_an_action_in_the_page_changes_the_broker_and_needs_the_token(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    the_hub, endpoints, tmp_path = hub
    url = endpoints.http["console"] + "/"
    with Client(endpoints.broker, context=zctx, timeout=10).connect() as client:
        client.create_queue("orders", 5, {"Status": "Pull"})
        for i in range(2):
            client.push("orders", 5, f"order {i}".encode(), ack=True)
        messages = lambda: client.queue_info("orders", 5)["Messages"]  # noqa: E731

        with Browser(tmp_path / "profile-cdp") as browser:
            # without the token: the page asks, the console refuses, nothing changes
            browser.navigate(url)
            browser.wait_for(_queue_button("purge", "orders", 5))
            browser.evaluate(_click("purge", "orders", 5))
            said = browser.wait_for(
                "document.getElementById('outcome').textContent.startsWith('refused') && "
                "document.getElementById('outcome').textContent"
            )
            assert "token" in said
            assert browser.dialogs == ["purge orders/5?"]
            assert messages() == 2

            # with the token from the link zerohub serve prints
            browser.navigate(f"{url}#token={the_hub.console_token}")
            browser.wait_for("location.hash === ''")  # taken out of the address bar
            assert browser.evaluate("document.getElementById('token-state').textContent") == (
                "token set"
            )
            browser.wait_for(_queue_button("purge", "orders", 5))
            browser.evaluate(_click("purge", "orders", 5))
            assert wait_until(lambda: messages() == 0, timeout=WAIT)
            said = browser.wait_for(
                "document.getElementById('outcome').className === 'ok' && "
                "document.getElementById('outcome').textContent"
            )
            assert said == "queue orders/5 purged: 2 removed"

            # a queue created through the page's form
            browser.evaluate(
                "document.getElementById('new-channel').value = 'made-in-page';"
                "document.getElementById('new-queue').value = '7';"
                "document.getElementById('new-status').value = 'Cache';"
                "document.getElementById('create').click()"
            )
            assert wait_until(lambda: _has_queue(client, "made-in-page", 7), timeout=WAIT)
            assert client.queue_info("made-in-page", 7)["Status"] == "Cache"
            browser.wait_for(_queue_button("browse", "made-in-page", 7))

            # browse shows what a queue holds and takes nothing
            client.push("made-in-page", 7, b"<i>latest</i>", ack=True)
            browser.evaluate(_click("browse", "made-in-page", 7))
            cell = browser.wait_for(
                "document.querySelector('#browsed tbody td:last-child')?.textContent"
            )
            assert cell == "<i>latest</i>"  # as text
            assert client.queue_info("made-in-page", 7)["Messages"] == 1

            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "console-action.png"
            browser.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_trash_view_lists_resubmits_and_purges_in_the_page(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """A queue's trash in the page: its messages with why they left, one pushed back
    into the queue by its row's button, the rest removed by "purge all" (confirmed)."""
    the_hub, endpoints, tmp_path = hub
    url = endpoints.http["console"] + "/"
    with Client(endpoints.broker, context=zctx, timeout=10).connect() as client:
        client.create_queue("late", 2, {"Status": "Pull", "MessageTimeout": 50})
        for i in range(3):
            client.push("late", 2, f"<u>lost {i}</u>".encode(), ack=True)
        assert wait_until(lambda: len(client.trash_list("late", 2)) == 3, timeout=WAIT)
        client.update_queue("late", 2, {"MessageTimeout": 0})
        seqs = [b.sequence for b in client.trash_list("late", 2)]

        with Browser(tmp_path / "profile-trash") as browser:
            browser.navigate(f"{url}#token={the_hub.console_token}")
            browser.wait_for(_queue_button("trash", "late", 2))
            browser.evaluate(_click("trash", "late", 2))
            rows = browser.wait_for(
                "document.querySelectorAll('#trashed tbody tr').length === 3 && "
                "[...document.querySelectorAll('#trashed tbody tr')].map(tr => "
                "[...tr.querySelectorAll('td')].slice(0, 5).map(td => td.textContent))"
            )
            assert [r[0] for r in rows] == [str(s) for s in seqs]
            assert [r[2] for r in rows] == ["expired"] * 3
            assert [r[4] for r in rows] == [f"<u>lost {i}</u>" for i in range(3)]  # as text
            assert not browser.evaluate("document.getElementById('trash').hidden")

            # the middle one back into its queue
            browser.evaluate(
                "document.querySelector('#trashed button[data-action=trash-resubmit]"
                f'[data-sequence="{seqs[1]}"]\').click()'
            )
            assert wait_until(lambda: client.queue_info("late", 2)["Messages"] == 1, WAIT)
            browser.wait_for("document.querySelectorAll('#trashed tbody tr').length === 2")
            assert [bytes(b.message.payload) for b in client.browse("late", 2, 0)] == [
                b"<u>lost 1</u>"
            ]

            # the rest removed for good
            browser.evaluate("document.getElementById('trash-purge-all').click()")
            assert wait_until(lambda: client.trash_list("late", 2) == [], timeout=WAIT)
            browser.wait_for("document.querySelectorAll('#trashed tbody tr').length === 0")
            assert browser.dialogs == ["remove everything from the trash of late/2?"]
            said = browser.wait_for(
                "document.getElementById('outcome').className === 'ok' && "
                "document.getElementById('outcome').textContent"
            )
            assert said == "2 message(s) of the trash of late/2 removed"
            assert client.queue_info("late", 2)["Messages"] == 1

            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "console-trash.png"
            browser.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


_EVIL_PAGE = """<!doctype html><html><body><script>
const target = %(target)s, token = %(token)s;
const body = JSON.stringify({action: "purge", channel: "orders", queue: 1});
const tries = [
  fetch(target, {method: "POST", mode: "no-cors", body,
                 headers: {"Content-Type": "text/plain"}}).then(() => "no-cors sent"),
  fetch(target, {method: "POST", body, headers: {"Content-Type": "application/json",
                 "X-Zerohub-Token": token}}).then(r => "cors " + r.status),
];
Promise.allSettled(tries).then(results => {
  document.title = "done: " + results.map(r => r.value || r.reason).join(" | ");
});
</script></body></html>"""


def test_a_page_elsewhere_cannot_act_on_the_console_even_knowing_the_token(
    hub: tuple[Hub, HubEndpoints, Path], zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    the_hub, endpoints, tmp_path = hub
    console = next(door for door in the_hub.http if door.name == "console")
    page = _EVIL_PAGE % {
        "target": json.dumps(endpoints.http["console"] + "/api/action"),
        "token": json.dumps(the_hub.console_token),
    }

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    evil = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    thread = threading.Thread(target=evil.serve_forever, daemon=True)
    thread.start()
    try:
        with Client(endpoints.broker, context=zctx, timeout=10).connect() as client:
            client.create_queue("orders", 1, {"Status": "Pull"})
            client.push("orders", 1, b"keep me", ack=True)
            served = console.served
            with Browser(tmp_path / "profile-evil") as browser:
                browser.navigate(f"http://127.0.0.1:{evil.server_address[1]}/")
                title = browser.wait_for("document.title.startsWith('done') && document.title")
            assert "no-cors sent" in title
            assert "cors 200" not in title
            assert console.served > served  # the forged request did reach the console
            assert client.queue_info("orders", 1)["Messages"] == 1
    finally:
        evil.shutdown()
        evil.server_close()
        thread.join()
