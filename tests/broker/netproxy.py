"""A loopback TCP proxy for tests that need a connection to fail without either end knowing.

``TcpProxy(port)`` forwards every connection made to ``proxy.endpoint`` to
``127.0.0.1:port``.  ``freeze()`` black-holes the connections open at that moment: their
octets are neither read nor forwarded in either direction and no FIN is sent, the way a
dead route or a suspended laptop looks to both peers.  Connections made afterwards are
forwarded normally.  ``close()`` ends the thread and every socket.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class TcpProxy:
    def __init__(self, port: int) -> None:
        self._target = ("127.0.0.1", port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._wake_rx, self._wake_tx = socket.socketpair()
        self._lock = threading.Lock()
        self._freeze = False
        self._peer: dict[socket.socket, socket.socket] = {}  # each side -> the other
        self._frozen: list[socket.socket] = []
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._sel.register(self._wake_rx, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    def freeze(self) -> None:
        """Stop moving octets on every connection open now (new ones still flow)."""
        with self._lock:
            self._freeze = True
        self._wake_tx.send(b"f")

    def close(self) -> None:
        self._wake_tx.send(b"q")
        self._thread.join(5)
        for sock in [*self._peer, *self._frozen, self._listener, self._wake_rx, self._wake_tx]:
            sock.close()
        self._sel.close()

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._wake_rx:
                    if b"q" in sock.recv(64):
                        return
                    self._apply_freeze()
                elif sock is self._listener:
                    self._accept()
                elif sock in self._peer:  # not dropped or frozen earlier in this batch
                    self._forward(sock)

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        try:
            server = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        self._peer[client] = server
        self._peer[server] = client
        self._sel.register(client, selectors.EVENT_READ)
        self._sel.register(server, selectors.EVENT_READ)

    def _forward(self, sock: socket.socket) -> None:
        other = self._peer[sock]
        try:
            data = sock.recv(65536)
            if data:
                other.sendall(data)
                return
        except OSError:
            pass
        self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        other = self._peer.pop(sock)
        del self._peer[other]
        for s in (sock, other):
            self._sel.unregister(s)
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _apply_freeze(self) -> None:
        with self._lock:
            if not self._freeze:
                return
            self._freeze = False
        for sock in list(self._peer):
            self._sel.unregister(sock)
            self._frozen.append(sock)
        self._peer.clear()
