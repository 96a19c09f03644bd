"""``filemq.heap``: a chunk's buffer comes from the heap again, not from fresh pages.

The pattern of a transfer (1 MiB buffers, several in flight, freed as libzmq sends
them) makes glibc trim its heap and fault the pages in again for the next chunks;
with ``keep_freed_memory()`` (which ``filemq serve`` and ``filemq sync`` call) it reuses
them.  Each case runs in its own interpreter: the setting is for the whole process.
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

_RING = """
import collections, resource, sys
SETUP
ring = collections.deque()
def churn(rounds):
    for i in range(rounds):
        ring.append(b"x" * (1 << 20))  # a chunk's buffer; 8 in flight, as in a send pipe
        if len(ring) > 8:
            ring.popleft()
        if i % 50 == 49:
            ring.clear()  # (the pipe drained)
churn(40)  # glibc's own adjustments settle
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn(400)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

_KEEP = "from filemq.heap import keep_freed_memory; assert keep_freed_memory()"
_SERVE = """
from filemq.cli import main
try:  # parses, sets the heap up, then fails on the missing folder: one line, exit 1
    main(["-q", "serve", "--bind", "tcp://127.0.0.1:*", "--publish", sys.argv[1]])
except SystemExit:
    pass
"""
_SYNC = """
sys.argv = ["filemq", "-q", "sync", "--once", "--exclude-from", sys.argv[1]]
sys.argv += ["tcp://127.0.0.1:9", "d"]
from filemq.cli import main
try:  # as the installed command runs it (argv None: the process is the command's), then
    main()  # fails on the missing pattern file: one line, exit 2
except SystemExit:
    pass
"""

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's"
)


def _faults(setup: str, *args: str) -> int:
    code = _RING.replace("SETUP", setup)
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_kept_freed_memory_serves_the_next_chunks_without_page_faults() -> None:
    plain = _faults("pass")
    kept = _faults(_KEEP)
    assert plain > 4000  # (the default: every round faults pages in again; ~16,000 here)
    assert kept < plain // 20


def test_filemq_serve_keeps_freed_memory(tmp_path: object) -> None:
    assert _faults(_SERVE, f"{tmp_path}/missing") < _faults("pass") // 20


def test_filemq_sync_keeps_freed_memory(tmp_path: object) -> None:
    # the mirror's received chunks: freed by its threads, reused by libzmq's next receives
    assert _faults(_SYNC, f"{tmp_path}/missing") < _faults("pass") // 20


_RELEASE = """
import sys
from filemq.heap import keep_freed_memory, release_freed_memory
def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
if sys.argv[1] == "kept":
    assert keep_freed_memory()
blocks = [b"x" * (256 << 10) for _ in range(128)]  # 32 MiB in the heap (below its thresholds)
del blocks
freed = rss_kib()
released = release_freed_memory()
print(released, freed - rss_kib())
"""


def _released(mode: str) -> tuple[str, int]:
    """(what release_freed_memory said, KiB of RSS it gave back) in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", _RELEASE, mode], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    said, kib = done.stdout.split()
    return said, int(kib)


def test_release_gives_back_what_the_kept_heap_holds() -> None:
    # (the mirror's first ICANHAZ: what making it freed goes back before libzmq's copies)
    said, kib = _released("kept")
    assert said == "True"
    assert kib > 16 << 10  # (of the 32 MiB freed: all of it here)


def test_release_leaves_a_process_with_glibcs_own_thresholds_alone() -> None:
    assert _released("default")[0] == "False"
