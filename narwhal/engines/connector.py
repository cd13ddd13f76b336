"""PrefillResult: a producer's KV handoff, bound to where and how it was made.

Rule kept here: a PrefillResult is immutable and hands out its descriptor only as a detached
deep copy (:meth:`PrefillResult.parameters`), so inspecting or editing what a caller got can
never change what :meth:`EngineClient.decode` sends.

It records what the contract asks for (producer URL, endpoint, backend request id, the
backend-owned descriptor), plus the connector and the time the producer leg started (the handoff
age is counted from then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from narwhal.core.descriptor import validate_descriptor
from narwhal.core.jsoncopy import json_copy


class HandoffMismatch(ValueError):
    """A PrefillResult was offered to a decode it cannot serve (endpoint or connector)."""


@dataclass(frozen=True)
class PrefillResult:
    """The validated handoff of one prefill leg."""

    producer_url: str
    endpoint: str
    backend_request_id: str
    connector: str
    started_at: float  # the port clock's time when the producer HTTP leg started
    _descriptor: MappingProxyType[str, Any] = field(repr=False)

    @classmethod
    def create(
        cls,
        *,
        producer_url: str,
        endpoint: str,
        backend_request_id: str,
        connector: str,
        started_at: float,
        descriptor: dict[str, Any],
    ) -> PrefillResult:
        """Validate ``descriptor`` for ``connector`` (raising :class:`DescriptorError`) and keep
        a detached copy: every PrefillResult, even one built by hand, holds a descriptor that
        passed validation before any decode request is made with it."""
        frozen = MappingProxyType(validate_descriptor(descriptor, connector))
        return cls(producer_url, endpoint, backend_request_id, connector, started_at, frozen)

    def parameters(self) -> dict[str, Any]:
        """The KV descriptor as a detached dictionary (a deep copy)."""
        return json_copy(dict(self._descriptor))

    def check_decodable(self, endpoint: str, connector: str) -> None:
        """Raise :class:`HandoffMismatch` unless a decode on ``endpoint``/``connector`` fits."""
        if endpoint != self.endpoint:
            raise HandoffMismatch(
                f"endpoint mismatch: the handoff was made on {self.endpoint}, decode is {endpoint}"
            )
        if connector != self.connector:
            raise HandoffMismatch(
                f"connector mismatch: the handoff is {self.connector}, "
                f"the consumer uses {connector}"
            )
