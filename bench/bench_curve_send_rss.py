"""Peak RSS of one big message sent by pyzmq, plain TCP vs CURVE (issue 15, session 18).

    python bench/bench_curve_send_rss.py              # 12 MiB (the first ICANHAZ of 100,000 files)
    python bench/bench_curve_send_rss.py --mib 4 12 24

Each row is a fresh sender process (this script run again with ``--child``): it fixes
glibc's mmap threshold at 4 MiB as ``filemq sync`` does, connects a DEALER to a ROUTER
in another process (so the receiver's buffers are not counted), makes one frame of N MiB,
sends it and waits until the receiver has it.  Printed: the sender's VmRSS before the
frame is made, and its VmHWM (peak) at the end, above that start, in MiB and as a
multiple of the frame.  ``nocopy``: ``send(copy=False, track=True)``, the frame kept
until the tracker says libzmq is done with it (as ``filemq sync`` sends its first
ICANHAZ); ``copy``: ``send(copy=True)`` and the frame dropped at once.

What it shows (libzmq 4.3.5): plain, the frame alone (1.0x with ``nocopy``, 2.0x with
``copy``: libzmq's copy beside Python's for a moment); CURVE, 3.0x either way: the
encoder holds the message, a plaintext copy with its zero padding and the encrypted box
at once (then a new message the box is copied into, as the original is closed).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys

import zmq

_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
_MIRROR_MMAP_THRESHOLD = 4 << 20  # as filemq.heap.MIRROR_MMAP_THRESHOLD
_RECEIVER = r"""
import sys, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
if sys.argv[1] == "curve":
    sock.curve_server = True
    sock.curve_publickey, sock.curve_secretkey = sys.argv[2].encode(), sys.argv[3].encode()
print(sock.bind_to_random_port("tcp://127.0.0.1"), flush=True)
sock.recv_multipart()
print("got", flush=True)
sys.stdin.read()
sock.close(0)
ctx.term()
"""


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} missing from /proc/self/status")


def child(mode: str, how: str, mib: int) -> str:
    """One send in this process: the row's text."""
    libc = ctypes.CDLL(None)
    libc.mallopt(_M_MMAP_THRESHOLD, _MIRROR_MMAP_THRESHOLD)
    server_public, server_secret = zmq.curve_keypair()
    receiver = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER, mode, server_public.decode(), server_secret.decode()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert receiver.stdin is not None and receiver.stdout is not None
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        if mode == "curve":
            sock.curve_serverkey = server_public
            sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
        sock.connect(f"tcp://127.0.0.1:{int(receiver.stdout.readline())}")
        before = _status_mib("VmRSS")
        frame = os.urandom(1024) * (mib << 10)
        if how == "nocopy":
            tracker = sock.send(frame, copy=False, track=True)
            tracker.wait(30)
        else:
            sock.send(frame, copy=True)
        del frame
        if receiver.stdout.readline().strip() != "got":
            raise RuntimeError("the receiver did not get the frame")
        above = _status_mib("VmHWM") - before
    finally:
        sock.close(0)
        ctx.term()
        receiver.stdin.close()
        receiver.wait(30)
        receiver.stdout.close()
    return f"{mode:<6} {how:<7} {mib:>5} {before:>11.1f} {above:>12.1f} {above / mib:>11.2f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, nargs="*", default=[12], help="frame sizes, MiB")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(child(args.child[0], args.child[1], int(args.child[2])))
        return 0
    print(
        f"{'mode':<6} {'send':<7} {'MiB':>5} {'start MiB':>11} {'peak above':>12} {'x frame':>12}"
    )
    for mib in args.mib:
        for _ in range(args.turns):
            for mode in ("plain", "curve"):
                for how in ("nocopy", "copy"):
                    subprocess.run(
                        [sys.executable, __file__, "--child", mode, how, str(mib)], check=True
                    )
    print(f"(load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
