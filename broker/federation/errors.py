"""Errors of the federation (one root, :class:`FederationError`).

* :class:`ConfigError`: a ``--link`` spec, a broker id or a setting is wrong (CLI exit 2).
* :class:`BadPeerMessage`: a link peer sent a federation message we cannot accept (bad
  header, bad JSON, over a limit); answered with a refusal, counted, never raised further.
"""

from __future__ import annotations


class FederationError(Exception):
    """Root of the federation errors."""


class ConfigError(FederationError):
    """A link spec or setting is wrong."""


class BadPeerMessage(FederationError):
    """A federation message from a link peer is malformed or over a limit."""
