"""Use the generated FILEMQ and TMQP codecs directly (no sockets).

python examples/codec_basics.py
"""

from __future__ import annotations

from broker import tmqp
from filemq import fmq_msg
from zproto.errors import DecodeError, EncodeError


def main() -> None:
    chunk = fmq_msg.Cheezburger(
        sequence=1,
        operation=fmq_msg.FILE_CREATE,
        filename="docs/readme.txt",
        offset=0,
        eof=1,
        headers={"SHA1": "0" * 40},
        chunk=b"hello",
    )
    frames = fmq_msg.encode(chunk)
    print("CHEEZBURGER on the wire:", frames[0].hex(" "))
    assert fmq_msg.decode(frames) == chunk

    try:
        fmq_msg.decode([b"\xaa\xa3\x01\x06FILEMQ\x00\x01"])  # OHAI with version 1
    except DecodeError as exc:
        print("refused:", exc, "| signature ok:", exc.signature_ok)

    try:
        fmq_msg.Icanhaz(path="/" + "x" * 300).encode()
    except EncodeError as exc:
        print("invalid:", exc)

    frame = tmqp.Frame(
        message_type=0x11,
        pending_ack=True,
        content_type=1,
        message_id="m1",
        target="orders",
        headers=(("CC", "audit"),),
        payload=b'{"order": 42}',
    )
    raw = tmqp.encode(frame)
    print("TMQP frame on the wire:", raw[0].hex(" "))
    print("decoded:", tmqp.decode(raw))


if __name__ == "__main__":
    main()
