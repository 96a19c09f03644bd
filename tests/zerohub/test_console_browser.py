"""The web console in a real headless browser (Debian's ``chromium``): the page loads, runs
its script, fetches the status and shows a queue a test created, names as plain text.

Slow (a browser start or two); skipped when no ``chromium`` is installed (``.ci/run``
installs it).  The screenshot is kept in ``.artifacts/console.png`` (or under
``$ZEROHUB_ARTIFACTS``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client
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
    with Client(endpoints.broker, context=zctx, timeout=10).connect() as client:
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
            '<td class="n">2</td><td class="n">0</td><td class="n">0</td></tr>'
        )
        assert row in dom, dom
        assert "<b>orders</b>" not in dom
        assert "<tr><td>/</td><td>" in dom  # the mount

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "console.png"
        shot.unlink(missing_ok=True)
        taken = chromium(
            tmp_path / "profile-shot", "--window-size=1200,900", f"--screenshot={shot}", url
        )
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
