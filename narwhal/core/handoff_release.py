"""Releasing an abandoned handoff: which producers are asked, and what their answer teaches.

Rule kept here: a handoff nobody will pull is released on its producer where the connector
allows (best effort, fire and forget: the request never waits for it, and no answer charges the
engine). A producer asked with ``POST /kv/release`` (Narwhal's emulator serves it; a real vLLM
has no such endpoint) that answers 404 or 405 does not serve it: it is never asked again for
the life of the router. Every other answer, errors and timeouts included, is ignored.

Theory of operation: the core hands an abandoned handoff to its transport
(``Transport.release_handoff``). The live transport keeps one :class:`HandoffReleases`, asks it
whether a producer is to be asked (:meth:`~HandoffReleases.asks`), sends
:meth:`~HandoffReleases.body` to :data:`RELEASE_PATH` in a task it owns, and tells it the answer
(:meth:`~HandoffReleases.answered`). The simulator's engines always release a handoff directly
(their lease ends at once), so the simulator never meets an engine that does not serve it.
"""

from __future__ import annotations

from typing import Any

from narwhal.core.ports import CallResult, Reply, TimedOut

RELEASE_PATH = "/kv/release"
UNSUPPORTED = (404, 405)
"""A producer answering one of these to :data:`RELEASE_PATH` does not serve it."""


class HandoffReleases:
    """The producers known not to serve :data:`RELEASE_PATH` (one set per transport)."""

    __slots__ = ("unsupported",)

    def __init__(self) -> None:
        self.unsupported: set[str] = set()

    def asks(self, producer_url: str) -> bool:
        """Whether a handoff of ``producer_url`` is to be released there."""
        return producer_url not in self.unsupported

    @staticmethod
    def body(descriptor: dict[str, Any]) -> dict[str, Any]:
        """The release request's JSON body: the handoff's descriptor."""
        return {"kv_transfer_params": descriptor}

    def answered(self, producer_url: str, reply: CallResult | TimedOut) -> None:
        """What ``producer_url`` answered a release: remember it if it does not serve one."""
        if isinstance(reply, Reply) and reply.status in UNSUPPORTED:
            self.unsupported.add(producer_url)
