"""``broker.heap``: the broker's threads allocate from one C heap arena.

Each case runs in its own interpreter (the setting is for the whole process): threads
allocate and keep buffers of 64 KiB (from the C heap, below its mmap threshold), then
glibc's ``malloc_stats()`` lists the arenas on the process's stderr.  Without the
setting every such thread gets its own arena (one ``mprotect`` per page its heap
grows by: what a broker queueing 4 KiB payloads paid per message).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys

import pytest

_THREADS = """
import ctypes, sys, threading
SETUP
held = []
def keep():
    held.append([bytes(65536) for _ in range(64)])  # 4 MiB per thread, kept
threads = [threading.Thread(target=keep) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert len(held) == 4
sys.stderr.flush()
ctypes.CDLL(None).malloc_stats()
"""

_ONE = "from broker.heap import one_arena; print(one_arena())"
_SERVE = """
from broker.cli import main
# parses, takes its one arena, then fails on the missing config file: one line, exit 2
print(main(["serve", "--config", sys.argv[1], "--data", "none"]))
"""

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's arenas")


def _arenas(setup: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(arenas the C heap used, the child's stdout)."""
    done = subprocess.run(
        [sys.executable, "-c", _THREADS.replace("SETUP", setup), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return len(re.findall(r"^Arena \d+:", done.stderr, re.M)), done.stdout


def test_threads_allocate_from_one_arena() -> None:
    plain, _ = _arenas("pass")
    one, out = _arenas(_ONE)
    assert plain > 1  # (the default: the threads' own arenas, the check can fail)
    assert out.split() == ["True"]
    assert one == 1


def test_broker_serve_takes_one_arena_before_anything_else(tmp_path: object) -> None:
    one, out = _arenas(_SERVE, str(os.path.join(str(tmp_path), "missing.toml")))
    assert out.split()[-1] == "2"  # (the usage error's exit code: it parsed and stopped)
    assert one == 1


def test_the_environment_keeps_the_users_choice() -> None:
    env = dict(os.environ, MALLOC_ARENA_MAX="4")
    arenas, out = _arenas(_ONE, env=env)
    assert out.split() == ["False"]
    assert arenas > 1
