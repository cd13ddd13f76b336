"""Whether the fleet serves the model a request names: the router answers for the fleet.

Rule kept here: with an ``[engine_contract]`` pinning ``model``, a request naming another model
is refused by the router with vLLM's own answer (404, type ``NotFoundError``, param ``model``,
message ``The model `X` does not exist.``) before anything is placed, so no engine is asked and
none is charged; a request that names no model is served, as vLLM serves it (its default model).
Without a contract the router does not know what the fleet serves, and every request goes on to
the engines, whose own 404 is passed through.

Theory of operation: :func:`unserved_model` is the one decision; the request lifecycle
(:mod:`narwhal.core.lifecycle`, both worlds) and the pass-through of ``/tokenize`` and
``/detokenize`` (:mod:`narwhal.core.passthrough`) ask it first and answer its fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from narwhal.core.config import NarwhalConfig
from narwhal.core.errors import Fault, FaultKind, fault


def unserved_model(body: Mapping[str, Any], config: NarwhalConfig) -> Fault | None:
    """The 404 fault for a request body naming a model the pinned contract does not serve;
    None when it names the pinned model, names none, or no model is pinned."""
    contract = config.engine_contract
    model = body.get("model")
    if contract is None or model is None or model == contract.model:
        return None
    return fault(
        FaultKind.MODEL_NOT_FOUND,
        f"The model `{model}` does not exist.",
        engine=None,
        phase="request",
        param="model",
    )
