"""The emulator's admin API: script faults while it runs, and read its state.

Rule kept here: ``/admin`` answers on both ports and is never itself hit by a fault (``freeze``,
``hang`` and ``refused`` spare it: ``refused`` closes the HTTP port only, so the side channel
still takes ``DELETE /admin/faults``); a fault body it cannot use is refused whole with HTTP 400
and the vocabulary's message (an old name names the new one), so nothing of it is applied.

Theory of operation:
- ``POST /admin/faults``: one fault object or ``{"faults": [...], "replace": bool}``; with
  ``replace`` the per-request faults are forgotten first; engine-wide faults start at once.
- ``DELETE /admin/faults``: every fault forgotten and every engine-wide fault ended.
- ``GET /admin/faults``: the per-request faults; ``GET /admin/state``: the counters, the held /
  pulled / released / expired handoffs, the faults and whether the engine is frozen, hung or
  listening, and the newest ``traceparent`` headers received (:func:`engine_state`).
"""

from __future__ import annotations

from typing import Any

from starlette.types import Send

from narwhal.core.jsonparse import parse_json
from narwhal.emulator.acting import FaultActor
from narwhal.emulator.asgi import NOT_FOUND, error_reply, json_reply
from narwhal.emulator.faults import FaultError, FaultSpec
from narwhal.emulator.state import EngineState


def engine_state(state: EngineState, actor: FaultActor) -> dict[str, Any]:
    """What ``GET /admin/state`` shows."""
    state.kv.sweep()
    return {
        "engine_id": state.engine_id,
        "role": state.config.role.value,
        "running": state.running,
        **state.counts,
        "kv_held": len(state.kv.entries),
        "kv_pulled": state.kv.pulled,
        "kv_released": state.kv.released,
        "kv_expired": state.kv.expired,
        "faults": actor.book.snapshot(),
        "frozen": actor.frozen,
        "hung": actor.hung,
        "listening": actor.listening,
        "traceparents": [list(pair) for pair in state.traceparents],
    }


def parse_faults(raw: bytes) -> tuple[list[FaultSpec], bool]:
    """The faults of a ``POST /admin/faults`` body and its ``replace`` flag."""
    try:
        data = parse_json(raw)
    except ValueError as error:
        raise FaultError(str(error)) from None
    items = data.get("faults", [data]) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise FaultError("expected {'faults': [...]} or one fault object")
    specs = [FaultSpec.from_dict(item) for item in items]
    return specs, isinstance(data, dict) and bool(data.get("replace"))


async def admin(
    state: EngineState, actor: FaultActor, method: str, path: str, raw: bytes, send: Send
) -> None:
    """Serve one ``/admin/...`` request."""
    if path == "/admin/state" and method == "GET":
        await json_reply(send, 200, engine_state(state, actor))
        return
    if path != "/admin/faults":
        await json_reply(send, 404, NOT_FOUND)
        return
    if method == "GET":
        await json_reply(send, 200, {"faults": actor.book.snapshot()})
    elif method == "DELETE":
        await actor.clear()
        await json_reply(send, 200, {"faults": []})
    elif method == "POST":
        try:
            specs, replace = parse_faults(raw)
        except FaultError as error:
            await error_reply(send, 400, str(error))
            return
        if replace:
            actor.book.clear()
        for spec in specs:
            await actor.add(spec)
        await json_reply(send, 200, {"faults": actor.book.snapshot()})
    else:
        await json_reply(send, 405, {"detail": "Method Not Allowed"})
