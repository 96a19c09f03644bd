"""Starting a server again on the endpoint a stopped one just left."""

from __future__ import annotations

from broker.server.server import Server, ServerError
from tests.polling import wait_until


def start_on_its_port(server: Server) -> None:
    """Start ``server`` on the port a stopped server held: libzmq closes the old listening
    socket after ``stop()`` returns, on its reaper and I/O threads (how long the port
    stays taken is the scheduler's affair), so the bind is tried again until it takes,
    to the polling deadline."""

    def bound() -> bool:
        try:
            server.start()
        except ServerError:
            return False
        return True

    assert wait_until(bound, step=0.05)
