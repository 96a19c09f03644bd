"""Errors of the bridges (one root, :class:`BridgeError`).

* :class:`ConfigError`: a route, URL or config file is wrong (the CLI exits 2).
* :class:`ConnectorError`: the remote broker could not be reached or refused us; the
  bridge logs it, counts it and reconnects with backoff.
* :class:`MissingLibrary`: the connector's client library is not installed
  (``pip install 'zerohub[bridges]'``; the CLI exits 2).
"""

from __future__ import annotations


class BridgeError(Exception):
    """Root of the bridge errors."""


class ConfigError(BridgeError):
    """A route, URL or config file is wrong."""


class MissingLibrary(ConfigError):
    """The connector's client library is not installed."""


class ConnectorError(BridgeError):
    """The remote broker could not be reached, or the connection failed."""
