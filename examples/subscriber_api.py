"""React to each file a FILEMQ mirror applies, from Python.

    python examples/subscriber_api.py                     # self-contained demo
    python examples/subscriber_api.py ENDPOINT DEST [PATH]  # follow a real server

``filemq.subscriber.Subscriber`` keeps DEST an exact mirror (reconnecting and
resyncing by itself) and reports every applied change as a ``MirrorEvent``:
``kind`` is "create" (a new or replaced file, verified and renamed into place),
"delete", "resync-complete" or "disconnected"; ``name`` is relative to DEST,
``path`` the local file, ``size``/``sha1`` describe what was written.

Two ways to consume them: an ``on_event`` callback (runs in the subscriber's
thread; keep it quick) or the ``events()`` iterator used here.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import zmq

from filemq.events import EventKind, MirrorEvent
from filemq.live import LiveFileServer
from filemq.server import Mount
from filemq.subscriber import Subscriber


def react(event: MirrorEvent) -> None:
    """What an application would do: index, convert, notify, ..."""
    if event.kind is EventKind.CREATE:
        first_line = Path(event.path).read_bytes().split(b"\n", 1)[0][:60]
        print(f"new version of {event.name}: {event.size} bytes, sha1 {event.sha1[:12]}...")
        print(f"    starts with {first_line!r}")
    elif event.kind is EventKind.DELETE:
        print(f"{event.name} was deleted")
    elif event.kind is EventKind.RESYNC_COMPLETE:
        print("mirror is complete; live changes follow")
    else:
        print(f"connection lost ({event.detail}); reconnecting")


def follow(endpoint: str, dest: str, path: str) -> None:
    """Run until Ctrl-C against a real ``filemq serve``."""
    subscriber = Subscriber(endpoint, dest, path=path)
    events = subscriber.events()  # registered before start(): nothing is missed
    subscriber.start()
    try:
        for event in events:
            react(event)
    except KeyboardInterrupt:
        pass
    finally:
        subscriber.stop()


def demo() -> None:
    """A watching server and a subscriber in this process, on loopback."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dest = Path(tmp, "published"), Path(tmp, "mirror")
        src.mkdir()
        (src / "hello.txt").write_text("hello, world\n")
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        server = LiveFileServer(context, [Mount(src, "/")], endpoint="tcp://127.0.0.1:*")
        with server:
            subscriber = Subscriber(server.endpoint, dest, context=context, index_path=None)
            events = subscriber.events(timeout=10)
            with subscriber:
                for event in events:
                    react(event)
                    if event.kind is EventKind.RESYNC_COMPLETE:  # now change things
                        (src / "reports").mkdir()
                        (src / "reports" / "today.csv").write_text("day,value\nmon,1\n")
                        (src / "hello.txt").unlink()
                    elif event.kind is EventKind.DELETE:
                        break
        context.term()
        print("mirror now holds:", sorted(p.name for p in dest.rglob("*") if p.is_file()))


if __name__ == "__main__":
    if len(sys.argv) >= 3:
        follow(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "/")
    else:
        demo()
