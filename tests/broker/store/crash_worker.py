"""A store writer to be killed: ``python crash_worker.py DIR ROUND SEED DURABILITY PREALLOCATE``.

Four appender threads append to three queues (one of them in groups of 1-8 records,
``LogStore.append_many``), one thread removes most of what was
appended, one thread sets and deletes definitions; segments are 8 KiB, so the writer is
compacting nearly all the time (``PREALLOCATE``: octets of zeros ahead of the head,
``LogOptions.preallocate``; with 8 KiB segments any value over 8 KiB fills each segment
with zeros at its first write).  After a write completes (its ticket), a line goes to
stdout, flushed at once; whoever kills this process with SIGKILL reads those lines and
checks the recovered store against them:

    A channel queue seq token      append complete
    RI / R channel queue seq       removal issued / complete
    KI name value / KC name value  definition set: issued / complete ("-" = deleted)
    C count                        compactions finished so far
"""

from __future__ import annotations

import random
import sys
import threading
import zlib

from broker.store.log import Durability, LogOptions, LogStore
from broker.store.log.records import NO_META

QUEUES = [("orders", 1), ("orders", 2), ("audit", 9)]
NAMES = ["channel/orders", "queue/orders/1", "router/r"]


def blob_for(token: str) -> bytes:
    """The blob of a token: the token and a filler whose length the token decides."""
    return token.encode() + b"|" + b"." * (zlib.crc32(token.encode()) % 300)


def main() -> None:
    directory, round_, seed, durability, preallocate = sys.argv[1:6]
    options = LogOptions(
        durability=Durability(durability),
        segment_size=8192,
        max_record_size=4096,
        compact_step=5,
        batch_interval=0.002,
        preallocate=int(preallocate),
    )
    store = LogStore(directory, options)
    out = threading.Lock()
    acked: list[tuple[str, int, int]] = []
    acked_ready = threading.Condition(out)

    def say(line: str) -> None:
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def appender(k: int) -> None:
        rng = random.Random(f"{seed}-{round_}-{k}")
        counter = 0
        while True:
            queue = rng.choice(QUEUES)
            if k == 3:  # groups (``append_many``), often across a segment's end
                tokens = [f"{round_}.{k}.{counter + i}" for i in range(rng.randrange(1, 9))]
                counter += len(tokens)
                items = [(blob_for(t), NO_META, 0) for t in tokens]
                seqs, ticket = store.append_many(queue, items)
                store.wait(ticket)
            else:
                tokens = [f"{round_}.{k}.{counter}"]
                counter += 1
                appended = store.append(queue, blob_for(tokens[0]))
                seqs = [appended.seq]
                store.wait(appended.ticket)
            with out:
                for seq, token in zip(seqs, tokens, strict=True):
                    sys.stdout.write(f"A {queue[0]} {queue[1]} {seq} {token}\n")
                    acked.append((queue[0], queue[1], seq))
                sys.stdout.flush()
                acked_ready.notify()

    def remover() -> None:
        rng = random.Random(f"{seed}-{round_}-remover")
        told = 0
        while True:
            with out:
                while not acked:
                    acked_ready.wait()
                channel, queue_id, seq = acked.pop(rng.randrange(len(acked)))
            if rng.random() < 0.2:
                continue  # this one stays
            say(f"RI {channel} {queue_id} {seq}")
            ticket = store.remove((channel, queue_id), seq)
            store.wait(ticket)
            say(f"R {channel} {queue_id} {seq}")
            compactions = store.stats().compactions
            if compactions != told:  # (each new count: sampling missed them all under load)
                told = compactions
                say(f"C {compactions}")

    def definer() -> None:
        rng = random.Random(f"{seed}-{round_}-definer")
        counter = 0
        while True:
            name = rng.choice(NAMES)
            counter += 1
            value = "-" if rng.random() < 0.3 else f"{round_}.{counter}"
            say(f"KI {name} {value}")
            if value == "-":
                ticket = store.delete_value(name)
            else:
                ticket = store.put_value(name, value.encode())
            store.wait(ticket)
            say(f"KC {name} {value}")

    threads = [threading.Thread(target=appender, args=(k,), daemon=True) for k in range(4)]
    threads += [
        threading.Thread(target=remover, daemon=True),
        threading.Thread(target=definer, daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # never: the process is killed


if __name__ == "__main__":
    main()
