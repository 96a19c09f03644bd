"""FILEMQ no-change resync and server start-up on big trees, vs ``rsync -a``.

    python bench/bench_filemq_resync.py                 # 10,000 and 100,000 files, 2 rounds
    python bench/bench_filemq_resync.py --quick         # 2,000 files
    python bench/bench_filemq_resync.py --files 100000 --rounds 1

For each tree size N (files of 1 KiB in N/100 folders, page cache warm), in one run:

  server start   time from launching ``filemq serve`` (state kept, the default)
                 to its "serving" line (bound, watching, accepting), with the valid
                 index its first start saved; and to its "checked" line (the saved
                 index re-stat'd against the disk: the first answer comes after it)
  rsync resync   ``rsync -a SRC/ DEST/`` on an already complete DEST
  zerohub resync ``filemq sync ENDPOINT DEST --once`` on an already complete DEST,
                 with its saved DEST index (the CLI default); wall clock from launch
                 to exit, Python start-up included
  ..., 10 excludes  the two resyncs again with the same ten exclude patterns
                 (``bench_filemq.EXCLUDES``; rsync ``--exclude``, filemq ``--exclude``
                 on the mirror; none matches a file: the cost of the patterns); the
                 issue's filters benchmark (issue 13: 100,000 files, same run)
  ..., CURVE     the zerohub resync again over CURVE (a second server keyed with
                 ``--curve-secret``/``--allow``, the mirror with ``--server-key``/
                 ``--curve-secret``; its own DEST and index), beside plain rsync: libzmq
                 encrypts the first ICANHAZ (~12 MiB at 100,000 files) with copies of
                 its own, which the RSS column shows
  CPU s          user + system CPU of that process (rsync: with its children; a server
                 start: the server's CPU when its line came): on a loaded machine the
                 wall clock is mostly waiting for a core, compare these
  client RSS     peak resident set of that ``filemq sync`` process, reported by
                 ``/usr/bin/time`` starting it (``ru_maxrss`` straight from
                 ``os.wait4`` would start at this Python process's size: see
                 ``run_child``)

Every row is measured ``--rounds`` times (default 2), rsync and zerohub taking
turns.  The filemq and zproto sources are byte-compiled first, as an installed
package is.  Targets (issue 15): server start with a valid index < 0.5 s
(100k files); client RSS <= 40 MiB (100k files); no-change resync <= 1.0x rsync
time (10k and 100k files).

``--base DIR`` (a checkout of another commit, e.g. ``git archive BASE | tar -x -C DIR``)
adds "base" rows: the same server start and resyncs run from DIR's sources
(``PYTHONPATH``; its own server, state and DEST), taking turns with this tree's.
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

PY = sys.executable
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_filemq import EXCLUDES  # noqa: E402

_SCRIPT = Path(PY).parent / "filemq"
FILEMQ = [str(_SCRIPT), "-q"] if _SCRIPT.exists() else [PY, "-m", "filemq", "-q"]
SIZE = 1024


def make_tree(root: Path, count: int) -> None:
    payload = os.urandom(SIZE)
    folders = max(1, count // 100)
    for i in range(folders):
        (root / f"dir{i:04d}").mkdir(parents=True)
    for i in range(count):
        path = root / f"dir{i % folders:04d}" / f"file{i:06d}.dat"
        path.write_bytes(payload[: SIZE - 8] + i.to_bytes(8, "little"))


# A child's ru_maxrss starts at the resident size of the process it was forked from (Linux
# copies the high-water mark with the address space, and keeps it across exec): measured
# straight from this Python process, even /bin/true "peaks" at this process's size.  The
# child is started by GNU time (a small process) when there is one, which reports the
# peak of the command alone.
_TIME = "/usr/bin/time" if os.path.exists("/usr/bin/time") else None


def _env(base: str | None) -> dict[str, str]:
    """The environment of a child: running ``base``'s sources when given."""
    return {**os.environ, "PYTHONPATH": base} if base else dict(os.environ)


def run_child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, float]:
    """(wall seconds, peak RSS in KiB, CPU seconds) of one child process that must exit 0.

    CPU (user + system, the process and its children: GNU time's rusage includes the
    command's) is what to compare on a loaded machine: wall time there is mostly waiting
    for a core."""
    if _TIME is not None:
        cmd = [_TIME, "-f", "peak-rss-kib %M", *cmd]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {err[-2000:]!r}")
    peak = re.findall(rb"peak-rss-kib (\d+)", err)
    cpu = usage.ru_utime + usage.ru_stime
    return elapsed, int(peak[-1]) if peak else usage.ru_maxrss, cpu


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A ``filemq serve`` process, state kept in ``state``; ready at its "serving" line
    (``curve``: its options serving over CURVE, ``--curve-secret`` and ``--allow``)."""

    def __init__(
        self, src: Path, state: Path, base: str | None = None, curve: list[str] | None = None
    ) -> None:
        env = {**_env(base), "XDG_STATE_HOME": str(state)}
        cmd = [*FILEMQ, "serve", "--bind", "tcp://127.0.0.1:*", "--publish", str(src)]
        cmd += curve or []
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
        )
        assert self.proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + 900
        self.endpoint, self.hashed, self.ready, self.serving = "", "", 0.0, 0.0
        self.serving_cpu = self.ready_cpu = 0.0
        try:
            while not self.ready and time.monotonic() < deadline:
                if not sel.select(timeout=1):
                    continue
                line = self.proc.stderr.readline()
                if not line:
                    break
                found = re.search(r"on (tcp://\S+) \(", line)
                if found:
                    self.endpoint = found.group(1)
                if "serving " in line and not self.serving:
                    self.serving = time.perf_counter() - self.start
                    self.serving_cpu = _cpu_of(self.proc.pid)
                found = re.search(r"(?:serving|checked) .*\((\d+) files, (\d+) hashed", line)
                if found:
                    self.ready = time.perf_counter() - self.start
                    self.ready_cpu = _cpu_of(self.proc.pid)
                    self.hashed = f"{int(found.group(2)):,} of {int(found.group(1)):,}"
        finally:
            sel.close()
        if not (self.endpoint and self.ready):
            self.stop()
            raise RuntimeError("filemq serve did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()


def compile_sources() -> None:
    import compileall

    import filemq
    import zerohub
    import zproto

    for package in (filemq, zproto, zerohub):  # (zerohub: the CLI's and zmqkit's)
        for folder in package.__path__:
            compileall.compile_dir(folder, quiet=1)


def same_tree(a: Path, b: Path) -> bool:
    def sig(root: Path) -> dict[str, int]:
        out = {}
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if name.startswith(".filemq"):
                    continue
                st = os.stat(os.path.join(dirpath, name))
                out[os.path.relpath(os.path.join(dirpath, name), root)] = st.st_size
        return out

    return sig(a) == sig(b)


def make_keys(work: Path) -> tuple[list[str], list[str]]:
    """A CURVE key pair for the server and one for the mirror: (the server's options,
    the mirror's)."""
    keys, allow = work / "keys", work / "allow"
    allow.mkdir(parents=True)
    for name in ("server", "client"):
        subprocess.run(
            [*FILEMQ, "keys", "new", name, "--dir", str(keys)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    shutil.copy(keys / "client.key", allow / "client.key")
    serve = ["--curve-secret", str(keys / "server.key_secret"), "--allow", str(allow)]
    return serve, [
        "--server-key",
        str(keys / "server.key"),
        "--curve-secret",
        str(keys / "client.key_secret"),
    ]


def bench_size(
    work: Path, count: int, rounds: int, rsync: str, base: str | None = None
) -> list[list[str]]:
    src = work / "src"
    print(f"preparing {count:,} files in {work} ...", file=sys.stderr)
    make_tree(src, count)
    rows: list[list[str]] = []
    kinds = [("", None)] + ([("base ", base)] if base else [])
    for tag, code in kinds:
        first = Server(src, work / f"{tag}state", code)  # hashes everything, saves the index
        first.stop()
    for _ in range(rounds):
        for tag, code in kinds:
            server = Server(src, work / f"{tag}state", code)
            rows.append(
                [f"{count:,}", f"{tag}server start: serving", f"{server.serving:.3f}",
                 f"{server.serving_cpu:.2f}", "", "", ""]
            )  # fmt: skip
            rows.append(
                [f"{count:,}", f"{tag}server start: index checked", f"{server.ready:.3f}",
                 f"{server.ready_cpu:.2f}", "", "", server.hashed]
            )  # fmt: skip
            server.stop()
    serve_curve, sync_curve = make_keys(work)
    servers = {tag: Server(src, work / f"{tag}state", code) for tag, code in kinds}
    curved = {
        tag: Server(src, work / f"{tag}state-curve", code, serve_curve) for tag, code in kinds
    }
    try:
        dest_r = work / "d-rsync"
        run_child([rsync, "-a", f"{src}/", f"{dest_r}/"])
        excluded = [f"--exclude={p}" for p in EXCLUDES]
        plain: dict[str, list[str]] = {}
        with_x: dict[str, list[str]] = {}
        over_curve: dict[str, list[str]] = {}
        for tag, code in kinds:
            dest_z, name = work / f"d-{tag.strip() or 'zh'}", tag.strip() or "zh"
            idx, idx_x = work / f"d-{name}.idx", work / f"d-{name}-excludes.idx"
            sync = [*FILEMQ, "sync", servers[tag].endpoint, str(dest_z), "--once"]
            plain[tag] = [*sync, "--index", str(idx)]
            with_x[tag] = [*sync, "--index", str(idx_x), *excluded]
            run_child(plain[tag], _env(code))
            if not same_tree(src, dest_z):  # (a --once that ended early: said, then again)
                print(f"{tag}mirror incomplete after a first sync: again", file=sys.stderr)
                run_child(plain[tag], _env(code))
            if not (same_tree(src, dest_r) and same_tree(src, dest_z)):
                raise RuntimeError("a mirror does not match its source")
            run_child(with_x[tag], _env(code))  # its own saved index, made with the patterns
            dest_c = work / f"d-{name}-curve"
            over_curve[tag] = [
                *FILEMQ, "sync", curved[tag].endpoint, str(dest_c), "--once",
                "--index", str(work / f"d-{name}-curve.idx"), *sync_curve,
            ]  # fmt: skip
            run_child(over_curve[tag], _env(code))  # (the first: every file, a full DEST)
            if not same_tree(src, dest_c):
                run_child(over_curve[tag], _env(code))
        for label, cmds, flags in (
            (", 10 excludes", with_x, excluded),
            ("", plain, []),
            (", CURVE", over_curve, []),
        ):
            for _ in range(rounds):
                t_r, rss_r, c_r = run_child([rsync, "-a", *flags, f"{src}/", f"{dest_r}/"])
                rows.append(
                    [f"{count:,}", f"rsync -a resync{label}", f"{t_r:.3f}", f"{c_r:.2f}",
                     "1.00", f"{rss_r / 1024:.1f}", ""]
                )  # fmt: skip
                for tag, code in kinds:
                    t_z, rss_z, c_z = run_child(cmds[tag], _env(code))
                    rows.append(
                        [f"{count:,}", f"{tag}zerohub resync{label}", f"{t_z:.3f}",
                         f"{c_z:.2f}", f"{t_z / t_r:.2f}", f"{rss_z / 1024:.1f}", ""]
                    )  # fmt: skip
    finally:
        for server in [*servers.values(), *curved.values()]:
            server.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 files only")
    parser.add_argument("--files", type=int, nargs="*", help="tree sizes (default 10k 100k)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", help="work folder (default: a temp folder)")
    parser.add_argument("--base", help="also run another checkout's sources (base rows)")
    args = parser.parse_args()
    sizes = args.files or ([2_000] if args.quick else [10_000, 100_000])
    rsync = shutil.which("rsync")
    if not rsync:
        print("rsync missing (apt-get install -y rsync)", file=sys.stderr)
        return 1
    compile_sources()
    if args.base:
        import compileall

        compileall.compile_dir(args.base, quiet=1)
    rows: list[list[str]] = []
    for count in sizes:
        work = Path(tempfile.mkdtemp(prefix="bench-resync-", dir=args.dir))
        try:
            rows += bench_size(work, count, args.rounds, rsync, args.base)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    head = f"{'files':>8} {'run':<33} {'seconds':>8} {'CPU s':>6} {'x rsync':>8} {'RSS MiB':>8}"
    print(f"\n{head}  hashed  (load {os.getloadavg()[0]:.0f})")
    for files, run, secs, cpu, ratio, rss, hashed in rows:
        print(f"{files:>8} {run:<33} {secs:>8} {cpu:>6} {ratio:>8} {rss:>8}  {hashed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
