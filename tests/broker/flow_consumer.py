"""A consumer process for the flow-control tests (run with ``python -m``).

``python -m tests.broker.flow_consumer ENDPOINT CHANNEL LOG [--ack]`` joins CHANNEL and
reads queue messages whose payload is a decimal index; it appends each index to LOG with
one ``write`` call (the file survives a SIGKILL) and then, with ``--ack``, acknowledges
the message: every message the broker saw acknowledged is in LOG.  A test stops it
with SIGSTOP mid-stream and kills it with SIGKILL.
"""

from __future__ import annotations

import os
import sys

import zmq

from broker.client.blocking import Client


def main(argv: list[str]) -> int:
    endpoint, channel, log_path = argv[:3]
    ack = "--ack" in argv[3:]
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    client = Client(endpoint, context=ctx, timeout=10.0).connect()
    client.join(channel)
    os.write(fd, b"joined\n")
    try:
        for message in client.consume(timeout=60):
            os.write(fd, message.payload + b"\n")
            if ack:
                client.ack(message)
    finally:
        client.close()
        ctx.term()
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
