#!/bin/sh
# Mirror a directory live over loopback with the two filemq commands.
#
#   examples/mirror_directory.sh SRC DEST [PORT]
#
# Starts `filemq serve` publishing SRC (watched with inotify: every file is pushed
# as soon as it is closed after writing) and runs `filemq subscribe` keeping DEST an
# exact mirror, printing one JSON line per applied change.  Ctrl-C stops both.
# Change files under SRC in another terminal and watch them arrive in DEST.
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 SRC DEST [PORT]" >&2
    exit 2
fi
SRC=$1
DEST=$2
PORT=${3:-5670}
ENDPOINT="tcp://127.0.0.1:$PORT"
FILEMQ=${FILEMQ:-filemq}   # or FILEMQ="python -m filemq"

$FILEMQ serve --bind "$ENDPOINT" --publish "$SRC" &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT INT TERM

# The subscriber waits for the server and reconnects by itself: no need to sleep.
$FILEMQ subscribe "$ENDPOINT" "$DEST" --json
