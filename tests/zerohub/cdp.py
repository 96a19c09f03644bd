"""A headless Chromium driven over its DevTools protocol (CDP), for the console's browser tests.

Chromium (Debian's ``chromium``) is started with ``--remote-debugging-port=0``; the port it
chose is read from ``DevToolsActivePort`` in its profile directory, and the test talks to
its first page over a WebSocket (the ``websockets`` library).  JavaScript dialogs (the
console's ``confirm()``) are accepted as they open, and recorded.  Every wait is bounded.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from websockets.sync.client import ClientConnection, connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WAIT = 60.0  # generous: the machine is shared


class CdpError(Exception):
    """The browser answered a command with an error, or did not answer in time."""


class Browser:
    """One headless Chromium and a connection to its page (a context manager)."""

    def __init__(self, profile: Path) -> None:
        assert CHROMIUM is not None
        self.profile = profile
        self.proc = subprocess.Popen(
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
                "--window-size=1200,900",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._ids = itertools.count(1)
        #: Messages of the JavaScript dialogs that opened (and were accepted).
        self.dialogs: list[str] = []
        self.ws: ClientConnection | None = None
        self._stack = contextlib.ExitStack()
        try:
            self.ws = self._stack.enter_context(
                connect(self._page_socket(), max_size=64 << 20, open_timeout=WAIT)
            )
            self.call("Page.enable")
            self.call("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def _page_socket(self) -> str:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CdpError(f"chromium exited with {self.proc.returncode}")
            lines = port_file.read_text().split() if port_file.exists() else []
            if lines:
                base = f"http://127.0.0.1:{lines[0]}"
                with urllib.request.urlopen(base + "/json/list", timeout=WAIT) as answer:
                    pages = [t for t in json.load(answer) if t.get("type") == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.05)
        raise CdpError("chromium did not open its DevTools port")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a command and wait for its result (events met meanwhile are handled)."""
        assert self.ws is not None
        mid = next(self._ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.monotonic() + WAIT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError(f"no answer to {method}")
            message = json.loads(self.ws.recv(timeout=left))
            if message.get("method") == "Page.javascriptDialogOpening":
                self.dialogs.append(message["params"]["message"])
                dialog = {"accept": True}
                self.ws.send(
                    json.dumps(
                        {
                            "id": next(self._ids),
                            "method": "Page.handleJavaScriptDialog",
                            "params": dialog,
                        }
                    )
                )
            elif message.get("id") == mid:
                if "error" in message:
                    raise CdpError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = WAIT) -> Any:
        """Poll a JavaScript expression until it is truthy; its value (CdpError if never)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise CdpError(f"never true: {expression}")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for(f"location.href.startsWith({json.dumps(url.split('#')[0])})")
        self.wait_for("document.readyState === 'complete'")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        self.ws = None
        self._stack.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Browser:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
