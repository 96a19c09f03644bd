"""The broker client a Spark task or the driver opens from the data source's options."""

from __future__ import annotations

from broker.client.blocking import Client
from broker.spark.options import ConnectOptions


def open_client(options: ConnectOptions, *, threaded: bool = True) -> Client:
    """A connected client (CURVE when the options name the keys); ConnectError when the
    broker does not accept it within the options' timeout.

    ``threaded=False``: the caller's thread drives the socket (cheapest per message; for
    a task that keeps calling until it is done).
    """
    client = Client(
        options.endpoint,
        server_key=options.server_key,
        curve_secret=options.client_cert,
        timeout=options.timeout,
        threaded=threaded,
        linger=0.0,
    )
    try:
        return client.connect()
    except BaseException:
        client.close()
        raise
