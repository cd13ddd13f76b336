"""The engine HTTP client's two failures, apart from the client so that both build alike.

Rule kept here: a lost connection is an ``OSError`` (``ConnectionResetError``), as the loop's own
socket errors are, so that every caller that handles a socket's failure handles it too; a
response that is not HTTP/1.1 is its own kind. A module of their own because the compiled build
(``setup.py``) cannot compile a subclass of an ``OSError``: the client's module is compiled,
this one stays Python.
"""

from __future__ import annotations


class EngineProtocolError(Exception):
    """The engine's bytes are not a valid HTTP/1.1 response (or its head is too long)."""


class ConnectionLost(ConnectionResetError):
    """The connection ended before the response did."""
