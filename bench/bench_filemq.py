"""FILEMQ benchmark: zerohub (plain, CURVE) vs ``rsync -a`` vs a raw pyzmq stream.

    python bench/bench_filemq.py            # full: 1 GiB file, 10,000 x 10 KiB, resync
    python bench/bench_filemq.py --quick    # tiny sizes, runs in seconds
    python bench/bench_filemq.py --skip-big # (b) and (c) only
    python bench/bench_filemq.py --measure-defaults [--quick]   # chunk size x credit

Scenarios, all on this machine in one run, every tool in its own process, time =
wall clock of the receiving process from launch to exit (Python start-up included
for zerohub and raw).  Conditions, the same for every method and run (printed
with the table): SRC warm in the page cache (read through before each run),
DEST a new folder on the same file system as SRC, no dirty pages outstanding
when the clock starts (``sync`` before each run: a run never pays the writeback
of the one before it), no method fsyncs (rsync does not by default; zerohub does
not), DEST trees of earlier runs deleted first.  (a) runs every method twice
(rounds 1 and 2, interleaved: rsync, plain, CURVE, plain and CURVE with
``--direct-io`` ("dio"), raw, raw CURVE, then again).

  (a) one big file into an empty DEST
  (b) many small files (100 folders) into an empty DEST
  (c) no-change resync of (b) (DEST already complete)
  (d) (c) with 10 exclude patterns (``--exclude`` on the mirror; rsync the same
      filters): the cost of patterns on both sides (the mirror sends them to the server)

zerohub: a ``filemq serve`` process is started first and has indexed its tree
(SHA-1 of every file) before the clock starts, as a long-running server has;
the timed process is ``filemq sync --once`` (with its saved DEST index, the
CLI default; (c') shows the resync when the client must re-hash DEST).
The filemq and zproto sources are byte-compiled first, as an installed package
is (this environment sets PYTHONDONTWRITEBYTECODE=1, which would otherwise make
every timed process compile them again: ~18 ms each).  (c) and (c') are the
median of 3 runs, rsync's too.
raw: a PUSH process reads the files and streams [name, offset, data] in 1 MiB
messages (read with ``os.preadv`` into buffers sent zero-copy and used again once
libzmq is done with them) to a PULL process that receives zero-copy and writes
them on a writer thread while it receives the next, a file of several chunks around
the page cache (``filemq.directio``, as ``sync --direct-io`` does; no protocol, no
checks, no hashing; both keep freed buffers in the heap, ``filemq.heap``; 16
messages queued per side, the product's credit window): the floor for Python +
ZeroMQ moving the same bytes; "raw CURVE" is the same over CURVE (libzmq encrypts
and decrypts on its I/O threads).

    python bench/bench_filemq.py --ceiling  # ZeroMQ alone: memory -> /dev/null, plain vs CURVE

``--ceiling`` sends 1 GiB from memory and drops it on arrival (no file, no Python work
per byte): what libzmq itself moves on this machine, plain and CURVE, and the CPU
seconds it takes (CURVE's ceiling bounds any CURVE transfer).
Targets (issue 15): (a) CURVE >= 1.2x rsync throughput, and within 10% of the raw
stream; (b) and (c) <= 1.0x rsync time, plain and CURVE.  CPU columns: seconds of
CPU both sides used (server + client; rsync's processes; raw sender + receiver),
a figure the load of other processes on the machine barely moves.
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: (d): ten ordinary exclude patterns (none matches a file of (b): pure matching cost)
EXCLUDES = [
    "*.tmp",
    "*.log",
    "build/",
    "cache/",
    "*.o",
    ".git/",
    "node_modules/",
    "*.swp",
    "__pycache__/",
    "dist/",
]
PY = sys.executable
# the console script, as a user runs it (``python -m filemq`` adds ~3 ms of runpy)
_SCRIPT = Path(PY).parent / "filemq"
FILEMQ = [str(_SCRIPT), "-q"] if _SCRIPT.exists() else [PY, "-m", "filemq", "-q"]


# -- data -------------------------------------------------------------------------


def make_big(root: Path, size: int) -> None:
    root.mkdir(parents=True)
    with open(root / "big.bin", "wb") as f:
        left = size
        while left:
            n = min(left, 64 << 20)
            f.write(os.urandom(n))
            left -= n


def make_small(root: Path, count: int, size: int) -> None:
    for i in range(count):
        folder = root / f"dir{i % 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"file{i:05d}.dat").write_bytes(os.urandom(size))


def tree_signature(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = path.stat().st_size
    return out


# -- tools ------------------------------------------------------------------------


def ensure_rsync() -> str | None:
    found = shutil.which("rsync")
    if found:
        return found
    print("rsync missing: apt-get install -y rsync", file=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", "rsync"], capture_output=True)
    return shutil.which("rsync")


def server_ticks(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def timed_cpu(cmd: list[str], server: int | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``cmd`` (and its waited-for children), plus what
    process ``server`` used meanwhile: a figure the machine's load barely moves."""
    before = server_ticks(server) if server else 0.0
    elapsed, user, system = timed_usage(cmd)
    cpu = user + system
    if server:
        cpu += server_ticks(server) - before
    return elapsed, cpu


def timed_usage(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """(wall, user CPU, system CPU) seconds of ``cmd`` and its waited-for children."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {err[-2000:]!r}")
    return elapsed, usage.ru_utime, usage.ru_stime


def timed_split(cmd: list[str], server: int | None = None) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of ``cmd``, CPU seconds process ``server`` used
    meanwhile): ``timed_cpu`` with the two sides apart (per-file CPU of (b))."""
    before = server_ticks(server) if server else 0.0
    wall, cpu = timed_cpu(cmd)
    return wall, cpu, (server_ticks(server) - before) if server else 0.0


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed


class Server:
    """A ``filemq serve`` process; ready once it printed its endpoint."""

    def __init__(self, src: Path, extra: list[str], chunk: int | None = None) -> None:
        cmd = [*FILEMQ, "serve", "--bind", "tcp://127.0.0.1:*", "--publish", str(src)]
        cmd += ["--no-state"]  # watching (the default) keeps its index fresh; nothing saved
        if chunk:
            cmd += ["--chunk-size", str(chunk)]
        self.proc = subprocess.Popen(
            [*cmd, *extra], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        assert self.proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + 600
        self.endpoint = ""
        while not self.endpoint and time.monotonic() < deadline:
            if sel.select(timeout=1):
                line = self.proc.stderr.readline()
                if not line:
                    break
                found = re.search(r"on (tcp://\S+) \(", line)
                if found:
                    self.endpoint = found.group(1)
        sel.close()
        if not self.endpoint:
            self.stop()
            raise RuntimeError("filemq serve did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        if self.proc.stderr:
            self.proc.stderr.close()


_RAW_CHUNK = 1 << 20  # bytes per raw message (the best of 256 KiB..4 MiB here)
#: Messages queued per raw side (sender's pipe, receiver's pipe): 16 MiB each, the
#: product's credit window.  libzmq's default (1000) let the receiver's I/O thread run
#: up to 1 GiB ahead of its writer, every buffer new pages: 165,000 page faults per GiB
#: vs 20,000 (session 18, load 8: 1.9-3.0 -> 1.2 CPU s per GiB, CURVE 3.1-4.2 -> 2.3-2.4).
_RAW_HWM = 16


def _curve_keys() -> list[str]:
    """Server public, server secret, client public, client secret (z85 text)."""
    import zmq

    server, client = zmq.curve_keypair(), zmq.curve_keypair()
    return [k.decode() for k in (*server, *client)]


def _keep_heap() -> None:
    """glibc keeps freed 1 MiB buffers in the heap (``filemq.heap``: what ``filemq serve``
    does): no page faults and zeroing per message on either raw side."""
    from filemq.heap import keep_freed_memory

    keep_freed_memory()


def raw_send(endpoint: str, src: str, keys: list[str] | None = None) -> None:
    """Read the files and stream them: each chunk read (``os.preadv``) straight into a
    buffer sent zero-copy and read into again once libzmq is done with it (a
    ``MessageTracker``): no copy but the kernel's, no buffer zeroed; the next read
    while the wire moves the last (libzmq's I/O thread sends; this thread only reads)."""
    from collections import deque

    import zmq

    _keep_heap()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    if keys:
        push.curve_serverkey = keys[0].encode()
        push.curve_publickey, push.curve_secretkey = keys[2].encode(), keys[3].encode()
    push.sndhwm = _RAW_HWM
    push.connect(endpoint)
    lent: deque[tuple[bytearray, Any]] = deque()
    free: list[bytearray] = []

    def buffer() -> bytearray:
        while lent and lent[0][1].done:
            free.append(lent.popleft()[0])
        return free.pop() if free else bytearray(_RAW_CHUNK)

    for dirpath, _dirs, files in os.walk(src):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src).encode()
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                offset = 0
                while True:
                    buf = buffer()
                    n = os.preadv(fd, [buf], offset)
                    head = [rel, offset.to_bytes(8, "big")]
                    if n == _RAW_CHUNK:  # zero-copy, tracked: the buffer is used again
                        push.send_multipart(head, zmq.SNDMORE)
                        lent.append((buf, push.send(buf, copy=False, track=True)))
                    else:  # (a file's short tail: sent as bytes)
                        push.send_multipart([*head, bytes(buf[:n])])
                        free.append(buf)
                    offset += n
                    if n < _RAW_CHUNK:
                        break
            finally:
                os.close(fd)
    push.send_multipart([b"", b"", b""])
    push.close(linger=-1)
    ctx.term()


def raw_recv(endpoint: str, dest: str, keys: list[str] | None = None) -> None:
    """Receive the stream; a writer thread writes while this one receives, around the page
    cache (``filemq.directio``: the best write here, ``sync --direct-io``'s)."""
    import queue
    import threading

    import zmq

    _keep_heap()
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    if keys:
        pull.curve_server = True
        pull.curve_secretkey = keys[1].encode()
    pull.rcvhwm = _RAW_HWM
    pull.bind(endpoint)
    jobs: queue.Queue[tuple[int, Any, int] | None] = queue.Queue(maxsize=16)

    def writer() -> None:
        from filemq.directio import DirectWrites

        # a file of several chunks is written direct (in order: one PUSH sends them so)
        files: dict[int, DirectWrites | None] = {}
        while (job := jobs.get()) is not None:
            fd, data, offset = job
            if fd < 0:
                direct = files.pop(-fd - 1, None)
                if direct is not None:
                    direct.close()
                os.close(-fd - 1)
                continue
            if fd not in files:  # (a small file, whole in one message: through the cache)
                files[fd] = DirectWrites(fd) if len(data) == _RAW_CHUNK else None
            direct = files[fd]
            if direct is not None:
                direct.write(data)
                continue
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, offset)
                view, offset = view[n:], offset + n

    thread = threading.Thread(target=writer)
    thread.start()
    made: set[str] = set()
    current, fd = b"", -1
    while True:
        rel, offset, data = pull.recv_multipart(copy=False)
        name = rel.bytes
        if not name:
            break
        if name != current:
            if fd >= 0:
                jobs.put((-fd - 1, b"", 0))  # close it after its writes
            path = os.path.join(dest, name.decode())
            parent = os.path.dirname(path)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            current = name
        jobs.put((fd, data.buffer, int.from_bytes(offset.bytes, "big")))
    if fd >= 0:
        jobs.put((-fd - 1, b"", 0))
    jobs.put(None)
    thread.join()
    pull.close()
    ctx.term()


def time_raw(src: Path, dest: Path, port: int, curve: bool = False) -> tuple[float, float]:
    """(wall, CPU seconds of both processes)."""
    endpoint = f"tcp://127.0.0.1:{port}"
    me = os.path.abspath(__file__)
    keys = ["--keys=" + ",".join(_curve_keys())] if curve else []  # (z85 may start with -)
    start = time.perf_counter()
    recv = subprocess.Popen([PY, me, "--raw-recv", endpoint, str(dest), *keys])
    send = subprocess.Popen([PY, me, "--raw-send", endpoint, str(src), *keys])
    cpu = 0.0
    for proc in (recv, send):
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu += usage.ru_utime + usage.ru_stime
    if recv.returncode != 0 or send.returncode != 0:
        raise RuntimeError("raw stream failed")
    return time.perf_counter() - start, cpu


# -- runs -------------------------------------------------------------------------


def sync_cmd(server: Server, dest: Path, index: Path | None, curve: list[str]) -> list[str]:
    cmd = [*FILEMQ, "sync", server.endpoint, str(dest), "--once"]
    cmd += ["--index", str(index)] if index else ["--no-index"]
    return cmd + curve


def compile_sources() -> None:
    """Byte-compile filemq and zproto (into their __pycache__, as an install does)."""
    import compileall

    import filemq
    import zproto

    for package in (filemq, zproto):
        for folder in package.__path__:
            compileall.compile_dir(folder, quiet=1)


def shown(row: tuple[str, str, float, int, float]) -> tuple[str, str, float, int, float]:
    """``row``, printed on stderr as it is measured (a run cut short still tells)."""
    label, method, t, _n, cpu = row
    print(f"  {label}  {method}: {t:.3f} s wall, {cpu:.2f} s CPU", file=sys.stderr, flush=True)
    return row


CONDITIONS = (
    "conditions: SRC warm in the page cache (read through before each run); DEST new, on "
    "SRC's file system; sync before each run (no dirty pages outstanding); earlier DEST "
    "trees deleted; no method fsyncs"
)


def warm(src: Path) -> None:
    """Read every file of ``src`` through (into the page cache, if it was not)."""
    for dirpath, _dirs, files in os.walk(src):
        for name in files:
            with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                while f.read(8 << 20):
                    pass


def fresh_dest(work: Path, name: str, src: Path, keep: str = "") -> Path:
    """The same start for every run: DEST trees of earlier runs (but those named
    ``keep``...) deleted, no dirty pages outstanding (``sync``: a run never pays the
    writeback of the one before), SRC in the page cache.  Returns ``work / name``."""
    for old in work.iterdir():
        if "-src" in old.name or old.name in ("keys", "allow"):
            continue
        if keep and old.name.startswith(keep):
            continue
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    os.sync()
    warm(src)
    return work / name


def median_time(cmd: list[str], runs: int = 3) -> float:
    return sorted(timed(cmd) for _ in range(runs))[runs // 2]


def check_same(src: Path, dest: Path) -> None:
    if tree_signature(src) != tree_signature(dest):
        raise RuntimeError(f"{dest} does not match {src}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--skip-big", action="store_true", help="skip scenario (a)")
    parser.add_argument("--measure-defaults", action="store_true")
    parser.add_argument("--dir", help="work folder (default: a temp folder)")
    parser.add_argument("--only-big", action="store_true", help="scenario (a) only")
    parser.add_argument("--ceiling", action="store_true", help="libzmq alone, plain vs CURVE")
    parser.add_argument("--raw-send", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--raw-recv", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=lambda text: text.split(","), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_send:
        raw_send(*args.raw_send, keys=args.keys)
        return 0
    if args.raw_recv:
        raw_recv(*args.raw_recv, keys=args.keys)
        return 0
    if args.ceiling:
        return ceiling((64 << 20) if args.quick else (1 << 30))
    big = (8 << 20) if args.quick else (1 << 30)
    count, small = (200, 10 << 10) if args.quick else (10_000, 10 << 10)
    work = Path(tempfile.mkdtemp(prefix="bench-filemq-", dir=args.dir))
    try:
        if args.measure_defaults:
            return measure_defaults(work, (16 << 20) if args.quick else (512 << 20))
        return run(work, 0 if args.skip_big else big, 0 if args.only_big else count, small)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, big: int, count: int, small: int) -> int:
    rsync = ensure_rsync()
    compile_sources()
    print(f"preparing data in {work} ...", file=sys.stderr)
    if big:
        make_big(work / "a-src", big)
    make_small(work / "b-src", count, small)
    keys = work / "keys"
    subprocess.run(
        [*FILEMQ, "keys", "new", "server", "--dir", str(keys)], check=True, capture_output=True
    )
    subprocess.run(
        [*FILEMQ, "keys", "new", "client", "--dir", str(keys)], check=True, capture_output=True
    )
    (work / "allow").mkdir()
    shutil.copy(keys / "client.key", work / "allow" / "client.key")
    curve_server = [
        "--curve-secret",
        str(keys / "server.key_secret"),
        "--allow",
        str(work / "allow"),
    ]
    curve_client = [
        "--server-key",
        str(keys / "server.key"),
        "--curve-secret",
        str(keys / "client.key_secret"),
    ]
    rows: list[tuple[str, str, float, int, float]] = []
    port = 47000 + os.getpid() % 1000
    print(CONDITIONS)

    if big:
        src, label = work / "a-src", f"(a) 1 x {big >> 20} MiB"
        for rnd in (1, 2):
            tag = f"(a){rnd}"
            if rsync:
                dest = fresh_dest(work, f"{tag}-rsync", src)
                t, cpu = timed_cpu([rsync, "-a", f"{src}/", f"{dest}/"])
                rows.append(shown((f"{label} #{rnd}", "rsync -a", t, big, cpu)))
                check_same(src, dest)
            for mode, server_extra, client_extra in (
                ("zerohub plain", [], []),
                ("zerohub CURVE", curve_server, curve_client),
                ("zerohub plain dio", [], ["--direct-io"]),
                ("zerohub CURVE dio", curve_server, [*curve_client, "--direct-io"]),
            ):
                server = Server(src, server_extra)
                try:
                    name = mode[8:].replace(" ", "-")
                    dest = fresh_dest(work, f"{tag}-{name}", src)
                    cmd = sync_cmd(server, dest, work / f"{tag}-{name}.idx", client_extra)
                    t, cpu = timed_cpu(cmd, server.proc.pid)
                    rows.append(shown((f"{label} #{rnd}", mode, t, big, cpu)))
                    check_same(src, dest)
                finally:
                    server.stop()
            for mode, curve in (("raw pyzmq stream", False), ("raw pyzmq CURVE", True)):
                dest = fresh_dest(work, f"{tag}-{mode[10:]}", src)
                port += 1
                t, cpu = time_raw(src, dest, port, curve)
                rows.append(shown((f"{label} #{rnd}", mode, t, big, cpu)))
                check_same(src, dest)
        fresh_dest(work, "", src)  # (the last round's trees go too)

    per_file: list[tuple[str, str, float, float]] = []  # (b): label, method, client, server
    if count:
        src, label = work / "b-src", f"(b) {count} x {small >> 10} KiB"
        modes = (("zerohub plain", [], []), ("zerohub CURVE", curve_server, curve_client))
        cold_small(work, 1, label, src, count * small, rsync, modes, rows, per_file)
        dest = fresh_dest(work, "(b)-raw", src, keep="(b)-")
        port += 1
        t, cpu = time_raw(src, dest, port)
        rows.append((label, "raw pyzmq stream", t, count * small, cpu))
        check_same(src, dest)
        # (b) a second round, the methods taking turns again (a cold mirror swings most)
        cold_small(work, 2, f"{label} #2", src, count * small, rsync, modes, rows, per_file)
        fresh_dest(work, "", src)

    print_table(rows)
    if per_file:
        print_per_file(per_file, count)
    return 0


_Mode = tuple[str, list[str], list[str]]  # method, server options, client options


def cold_small(
    work: Path,
    rnd: int,
    label: str,
    src: Path,
    nbytes: int,
    rsync: str | None,
    modes: tuple[_Mode, ...],
    rows: list[tuple[str, str, float, int, float]],
    per_file: list[tuple[str, str, float, float]],
) -> None:
    """Round ``rnd`` of (b): a cold mirror of ``src`` by rsync, then by each of ``modes``
    (rows and CPU per file appended); the first round also times (c), (c') and (d) on
    the mirrors it made (kept until the round's end)."""
    tag = "(b)" if rnd == 1 else f"(b){rnd}"
    keep = f"{tag}-" if rnd == 1 else ""
    excludes = [f"--exclude={p}" for p in EXCLUDES]
    if rsync:
        dest = fresh_dest(work, f"{tag}-rsync", src, keep=keep)
        t, cpu = timed_cpu([rsync, "-a", f"{src}/", f"{dest}/"])
        rows.append((label, "rsync -a", t, nbytes, cpu))
        per_file.append((label, "rsync -a", cpu, 0.0))
        check_same(src, dest)
        if rnd == 1:
            t = median_time([rsync, "-a", f"{src}/", f"{dest}/"])
            rows.append(("(c) no-change resync of (b)", "rsync -a", t, 0, 0.0))
            t = median_time([rsync, "-a", *excludes, f"{src}/", f"{dest}/"])
            rows.append(("(d) (c), 10 exclude patterns", "rsync -a", t, 0, 0.0))
    for mode, server_extra, client_extra in modes:
        server = Server(src, server_extra)
        try:
            dest = fresh_dest(work, f"{tag}-{mode[8:]}", src, keep=keep)
            index = work / f"{tag}-{mode[8:]}.idx"
            cmd = sync_cmd(server, dest, index, client_extra)
            t, client_cpu, server_cpu = timed_split(cmd, server.proc.pid)
            rows.append((label, mode, t, nbytes, client_cpu + server_cpu))
            per_file.append((label, mode, client_cpu, server_cpu))
            check_same(src, dest)
            if rnd != 1:
                continue
            t = median_time(sync_cmd(server, dest, index, client_extra))
            rows.append(("(c) no-change resync of (b)", mode, t, 0, 0.0))
            t = median_time(sync_cmd(server, dest, None, client_extra))
            rows.append(("(c') (c), client re-hashes DEST", mode, t, 0, 0.0))
            t = median_time(sync_cmd(server, dest, index, client_extra + excludes))
            rows.append(("(d) (c), 10 exclude patterns", mode, t, 0, 0.0))
        finally:
            server.stop()


def print_per_file(rows: list[tuple[str, str, float, float]], files: int) -> None:
    """(b): CPU per file of each side (us): the mirror (``filemq sync``, its process
    start included), the server (``filemq serve`` while it ran), rsync's processes."""
    print(f"\n(b) CPU per file, us (load {os.getloadavg()[0]:.0f})")
    print(f"{'round':26} {'method':18} {'client':>8} {'server':>8} {'both':>8} {'x rsync':>8}")
    rsync = {label: c for label, method, c, _s in rows if method == "rsync -a"}
    for label, method, client, server in rows:
        both = client + server
        ref = rsync.get(label)
        ratio = f"{both / ref:8.2f}" if ref else f"{'-':>8}"
        srv = f"{server / files * 1e6:8.0f}" if method != "rsync -a" else f"{'-':>8}"
        print(
            f"{label:26} {method:18} {client / files * 1e6:8.0f} {srv}"
            f" {both / files * 1e6:8.0f} {ratio}"
        )


def print_table(rows: list[tuple[str, str, float, int, float]]) -> None:
    """Wall clock against rsync's, and CPU seconds (both processes: server + client,
    rsync's own, raw sender + receiver) against rsync's: on a machine loaded by
    others the wall-clock ratio mostly says who got the cores, the CPU ratio what
    each needs."""
    rsync = {_key(label): t for label, method, t, _n, _c in rows if method == "rsync -a"}
    rsync_cpu = {_key(label): c for label, method, _t, _n, c in rows if method == "rsync -a"}
    print(
        f"\n{'scenario':34} {'method':18} {'seconds':>8} {'MB/s':>8} {'x rsync':>8}"
        f" {'CPU s':>7} {'CPU x':>6}  target"
    )
    for label, method, t, nbytes, cpu in rows:
        key = _key(label)
        ref = rsync.get(key)
        rate = f"{nbytes / t / 1e6:8.0f}" if nbytes else f"{'-':>8}"
        ratio = f"{t / ref:8.2f}" if ref else f"{'-':>8}"
        ref_cpu = rsync_cpu.get(key)
        cpus = f"{cpu:7.2f}" if cpu else f"{'-':>7}"
        cpu_ratio = f"{cpu / ref_cpu:6.2f}" if cpu and ref_cpu else f"{'-':>6}"
        target = ""
        if ref and method.startswith("zerohub CURVE") and label.startswith("(a)"):
            ok = ref / t >= 1.2
            target = f"throughput {ref / t:.2f}x rsync >= 1.2: {'OK' if ok else 'MISSED'}"
        elif ref and method.startswith("zerohub") and label[:3] in ("(b)", "(c)"):
            target = f"<= 1.0x: {'OK' if t / ref <= 1.0 else 'MISSED'}"
        print(f"{label:34} {method:18} {t:8.3f} {rate} {ratio} {cpus} {cpu_ratio}  {target}")
    # zerohub against the raw stream of the same round and security (plain, CURVE)
    raw = {
        (_key(label), method[10:]): (t, c)
        for label, method, t, _n, c in rows
        if method.startswith("raw pyzmq")
    }
    for label, method, t, _n, cpu in rows:
        security = "stream" if method.startswith("zerohub plain") else "CURVE"
        base = raw.get((_key(label), security))
        if method.startswith("zerohub") and base:
            print(
                f"{_key(label)} {method}: {t / base[0]:.2f}x the raw {security}'s time,"
                f" {cpu / base[1]:.2f}x its CPU"
            )


def _key(label: str) -> str:
    """The row of rsync a row is compared with: same scenario, same round."""
    if label.startswith("(c"):
        return "(c)"  # ((c') against rsync's (c))
    return label[:3] + (label[label.index("#") :] if "#" in label else "")


def ceiling(size: int, chunk: int = 1 << 20) -> int:
    """libzmq alone: ``size`` bytes from memory to a receiver that drops them, plain and
    CURVE, over loopback TCP (one context, so one I/O thread, per side, as two
    processes have): MB/s and the CPU seconds of both sides (I/O threads included)."""
    import threading

    import zmq

    print(f"\nlibzmq {zmq.zmq_version()}: {size >> 20} MiB memory -> /dev/null, {chunk >> 10} KiB")
    print(f"{'security':10} {'round':>5} {'seconds':>8} {'MB/s':>8} {'CPU s':>7}")
    data = os.urandom(chunk)
    for rnd in (1, 2):
        for security in ("plain", "CURVE"):
            ctx_in, ctx_out = zmq.Context(), zmq.Context()
            pull, push = ctx_in.socket(zmq.PULL), ctx_out.socket(zmq.PUSH)
            if security == "CURVE":
                public, secret = zmq.curve_keypair()
                pull.curve_server, pull.curve_secretkey = True, secret
                push.curve_serverkey = public
                push.curve_publickey, push.curve_secretkey = zmq.curve_keypair()
            port = pull.bind_to_random_port("tcp://127.0.0.1")
            push.connect(f"tcp://127.0.0.1:{port}")
            count = size // chunk

            def send(push: zmq.Socket[bytes] = push, count: int = count) -> None:
                for _ in range(count):
                    push.send(data, copy=False)

            start, cpu = time.perf_counter(), time.process_time()
            sender = threading.Thread(target=send)
            sender.start()
            for _ in range(count):
                pull.recv(copy=False)
            sender.join()
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            push.close(0)
            pull.close(0)
            ctx_in.term()
            ctx_out.term()
            print(f"{security:10} {rnd:>5} {wall:8.3f} {size / wall / 1e6:8.0f} {cpu:7.2f}")
    return 0


def measure_defaults(work: Path, size: int) -> int:
    """Time one big file for chunk sizes x credit windows (how the defaults were chosen)."""
    make_big(work / "src", size)
    print(f"\none {size >> 20} MiB file, plain, best of 2")
    print(f"{'chunk':>10} {'window':>10} {'seconds':>8} {'MB/s':>8}")
    for chunk in (64 << 10, 256 << 10, 1 << 20, 4 << 20):
        server = Server(work / "src", [], chunk)
        try:
            for window in (4 << 20, 16 << 20, 64 << 20):
                best = float("inf")
                for i in range(2):
                    dest = work / f"d-{chunk}-{window}-{i}"
                    cmd = [
                        *FILEMQ,
                        "sync",
                        server.endpoint,
                        str(dest),
                        "--once",
                        "--no-index",
                        "--window",
                        str(window),
                    ]
                    best = min(best, timed(cmd))
                    shutil.rmtree(dest)
                print(f"{chunk:>10} {window:>10} {best:8.3f} {size / best / 1e6:8.0f}")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
