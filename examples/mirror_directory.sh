#!/bin/sh
# Mirror a directory live over loopback with the two filemq commands.
#
#   examples/mirror_directory.sh SRC DEST [PORT]
#
# Starts `filemq serve` publishing SRC (watched with inotify: every file is pushed
# as soon as it is closed after writing) and runs `filemq subscribe` keeping DEST an
# exact mirror, printing one JSON line per applied change.  Ctrl-C stops both.
# Change files under SRC in another terminal and watch them arrive in DEST.
#
# Which filemq: $FILEMQ if set (e.g. FILEMQ="python3 -m filemq"), else `filemq` on
# PATH, else the one the README's install command puts in this checkout's .venv.
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 SRC DEST [PORT]" >&2
    exit 2
fi
SRC=$1
DEST=$2
PORT=${3:-5670}
ENDPOINT="tcp://127.0.0.1:$PORT"

if [ -z "${FILEMQ:-}" ]; then
    checkout_venv="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/filemq"
    if command -v filemq >/dev/null 2>&1; then
        FILEMQ=filemq
    elif [ -x "$checkout_venv" ]; then
        FILEMQ=$checkout_venv
    else
        echo "$0: no filemq found: install zerohub (README, 'Run it') or set FILEMQ" >&2
        exit 127
    fi
fi

$FILEMQ serve --bind "$ENDPOINT" --publish "$SRC" &
SERVER=$!
stop_server() {
    kill -TERM "$SERVER" 2>/dev/null || :   # (Ctrl-C may have stopped it already)
    wait "$SERVER" 2>/dev/null || :
}
trap stop_server EXIT
trap 'exit 0' INT TERM   # Ctrl-C: the subscriber stops cleanly, then the server

# The subscriber waits for the server and reconnects by itself: no need to sleep.
$FILEMQ subscribe "$ENDPOINT" "$DEST" --json
