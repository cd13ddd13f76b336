"""KV-handoff descriptors: what the router sends on the prefill leg, and whether the
producer's answer is fit to send on the decode leg.

The rule this module keeps: it is pure. No I/O, no clock, no randomness; every function is a
total function of its arguments, never mutates them, and either returns a fresh value or
raises :class:`DescriptorError`. (Like the rest of ``narwhal.core``.)

Theory of operation
-------------------
A disaggregated request runs in two legs. On the *prefill* leg the router asks a producer
engine to compute the prompt's KV cache and keep it for a remote decode; the request carries
``kv_transfer_params`` built by :func:`prefill_kv_params`. The producer answers with its own
``kv_transfer_params`` object, the *descriptor*: where the KV lives (engine id, KV side
channel, block ids or a transfer id) and any number of runtime fields that only the engines
understand. On the *decode* leg the router hands that descriptor, unchanged, to a consumer,
which pulls (or is pushed) the KV and generates.

vLLM is lenient with a bad descriptor: depending on the fault and on
``kv_load_failure_policy`` the consumer silently recomputes the prompt, fails inside an HTTP
200 stream, or (stale block ids) generates wrong tokens. So the router checks the descriptor
*before* opening the decode request, with :func:`validate_descriptor`, and treats a rejected
descriptor as an engine fault of the producer. The checks run in a fixed order and the first
failing one names the :class:`DescriptorReason`:

1. ``NOT_AN_OBJECT``: the descriptor is missing or not a JSON object.
2. ``UNKNOWN_CONNECTOR``: the configured connector is not one this module knows.
3. ``CONNECTOR_MISMATCH``: the descriptor has another connector's shape (its keys), is not a
   decode-leg descriptor (``do_remote_prefill`` is not ``True``, or ``do_remote_decode`` is
   set), or names a transfer mode the connector does not have.
4. ``MISSING_ENGINE_IDENTITY``: the fields that name the producer engine and its KV side
   channel are absent or ill-typed (engine id; NIXL host and port; Mooncake transfer id and
   bootstrap address).
5. ``MALFORMED_BLOCK_IDS``: NIXL block ids are not a list of lists of non-negative ints, nor a
   flat list of them (an empty list is valid; ``bool`` is not an int).
6. ``TOO_MANY_BLOCK_IDS``: a group of NIXL block ids longer than the prompt could fill. The
   prompt's tokens are the fewest the producer reports (the reply's ``usage.prompt_tokens``,
   passed in, and the descriptor's own ``remote_num_tokens``); with vLLM's smallest block size,
   one token, a prompt of ``n`` tokens plus the one token the prefill leg generates fills at
   most ``n + 1`` blocks per KV-cache group, and :data:`BLOCK_ID_SLACK` more are allowed. A
   producer that reports no count is not bounded here (the reply's size still is). Checked
   before any id is read: a 3-token prompt's descriptor with 1,500,000 ids is refused in one
   comparison, and never reaches a consumer as a 10 MB decode body.
7. ``SIDE_CHANNEL_MISMATCH``: the engine contract pins the producer's KV side channel
   (``host:port``) and the descriptor names another one.
8. ``NON_FINITE_NUMBER``: a number anywhere in the descriptor is NaN or infinite (``NaN``,
   ``Infinity``, ``1e400``). JSON has no such numbers, so the decode leg could not carry it;
   the parser accepts them, as ``json.loads`` does.

A descriptor that passes is returned as a deep copy of the very object the producer sent:
unknown fields are kept verbatim and no value is re-serialised, so the consumer sees exactly
what the producer wrote, and the caller may mutate its copy freely.
"""

from __future__ import annotations

import enum
import functools
from typing import Any, TypeGuard

from narwhal.core.jsoncopy import json_copy
from narwhal.core.jsonparse import non_finite_at

__all__ = [
    "BLOCK_ID_SLACK",
    "KNOWN_CONNECTORS",
    "DescriptorError",
    "DescriptorReason",
    "max_block_ids",
    "parse_side_channel",
    "prefill_kv_params",
    "side_channel_of",
    "validate_descriptor",
]

NIXL = "NixlConnector"
MOONCAKE = "MooncakeConnector"
KNOWN_CONNECTORS: tuple[str, ...] = (NIXL, MOONCAKE)

# Keys that only another connector's descriptor carries. Their presence means the producer
# runs a different connector than the one configured (LMCache's keys are foreign to both).
_LMCACHE_KEYS: frozenset[str] = frozenset({"disagg_spec", "ret_first_tok"})
_FOREIGN_KEYS: dict[str, frozenset[str]] = {
    NIXL: frozenset({"transfer_id", "remote_bootstrap_addr"}) | _LMCACHE_KEYS,
    MOONCAKE: frozenset({"remote_block_ids", "remote_host", "remote_port"}) | _LMCACHE_KEYS,
}

_ABSENT: Any = object()  # marks a field that is not there at all
_NIXL_TRANSFER_MODES: frozenset[str] = frozenset({"pull", "push"})
_MAX_PORT = 65535
_SNIPPET_CHARS = 40
MIN_BLOCK_SIZE = 1  # tokens: vLLM's smallest KV block (its --block-size choices start at 1)
BLOCK_ID_SLACK = 2  # block ids per group beyond what the prompt fills (stated, not measured)


class DescriptorReason(enum.Enum):
    """Why a descriptor was rejected. The values are stable (logs, metrics labels)."""

    NOT_AN_OBJECT = "not_an_object"
    MISSING_ENGINE_IDENTITY = "missing_engine_identity"
    MALFORMED_BLOCK_IDS = "malformed_block_ids"
    CONNECTOR_MISMATCH = "connector_mismatch"
    SIDE_CHANNEL_MISMATCH = "side_channel_mismatch"
    UNKNOWN_CONNECTOR = "unknown_connector"
    TOO_MANY_BLOCK_IDS = "too_many_block_ids"
    NON_FINITE_NUMBER = "non_finite_number"


class DescriptorError(ValueError):
    """A descriptor (or a connector name) the router must not use.

    ``detail`` names the offending field and the type of the value found, with at most a short
    excerpt of the value itself.
    """

    reason: DescriptorReason
    detail: str

    def __init__(self, reason: DescriptorReason, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}"


# --------------------------------------------------------------------------------------------
# Small helpers


def _describe(value: object) -> str:
    """``type (short repr)``; never the whole of a large value."""
    if value is None:
        return "null"
    kind = type(value).__name__
    if isinstance(value, list | dict | tuple | set):
        return f"{kind} of length {len(value)}"
    text = repr(value)
    if len(text) > _SNIPPET_CHARS:
        text = text[: _SNIPPET_CHARS - 3] + "..."
    return f"{kind} ({text})"


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_nonblank_str(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and value.strip() != ""


def _require_known(connector: str) -> None:
    if connector not in KNOWN_CONNECTORS:
        raise DescriptorError(
            DescriptorReason.UNKNOWN_CONNECTOR,
            f"connector {_describe(connector)} is not one of {', '.join(KNOWN_CONNECTORS)}",
        )


def _norm_host(host: str) -> str:
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.lower()


def _join_host_port(host: str, port: int) -> str:
    host = host.strip()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def parse_side_channel(text: str) -> tuple[str, int]:
    """Parse ``host:port`` (optionally ``http://host:port``, ``[v6]:port``) into
    ``(host, port)``; the host is returned as written, without brackets.

    Raises ``ValueError`` when the text is not of that form or the port is not in 1..65535.
    """
    if not isinstance(text, str):
        raise ValueError(f"side channel must be a 'host:port' string, got {_describe(text)}")
    rest = text.strip()
    for scheme in ("http://", "https://"):
        if rest.lower().startswith(scheme):
            rest = rest[len(scheme) :]
            break
    if rest.endswith("/"):
        rest = rest[:-1]
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0 or rest[close + 1 : close + 2] != ":":
            raise ValueError(f"side channel {_describe(text)} is not 'host:port'")
        host, port_text = rest[1:close], rest[close + 2 :]
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            raise ValueError(f"side channel {_describe(text)} is not 'host:port'")
    if host.strip() == "" or "/" in host or any(c.isspace() for c in host):
        raise ValueError(f"side channel {_describe(text)} has no usable host")
    if not port_text or any(c not in "0123456789" for c in port_text) or len(port_text) > 5:
        raise ValueError(f"side channel {_describe(text)} has no numeric port")
    port = int(port_text)
    if not 1 <= port <= _MAX_PORT:
        raise ValueError(f"side channel {_describe(text)} has port {port} outside 1..65535")
    return host, port


# --------------------------------------------------------------------------------------------
# Prefill leg


def prefill_kv_params(connector: str, transfer_id: str | None = None) -> dict[str, Any]:
    """The ``kv_transfer_params`` the router sends on the prefill leg (a fresh dict).

    NixlConnector needs no id of the router's (``transfer_id`` is ignored); MooncakeConnector
    needs the router-chosen ``transfer_id`` that both legs rendezvous on.
    """
    _require_known(connector)
    if connector == NIXL:
        return {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
    if not _is_nonblank_str(transfer_id):
        raise ValueError(
            f"{connector} prefill leg needs a non-empty transfer_id, got {_describe(transfer_id)}"
        )
    return {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}


# --------------------------------------------------------------------------------------------
# Decode leg


def _check_shape(params: dict[str, Any], connector: str) -> None:
    unused = _FOREIGN_KEYS[connector]
    if not unused.isdisjoint(params):  # (one C call for the usual, clean descriptor)
        foreign = sorted(k for k in params if k in unused)
        raise DescriptorError(
            DescriptorReason.CONNECTOR_MISMATCH,
            f"descriptor carries {', '.join(foreign)}, which {connector} does not use",
        )
    prefill = params.get("do_remote_prefill")
    if prefill is not True:
        raise DescriptorError(
            DescriptorReason.CONNECTOR_MISMATCH,
            f"do_remote_prefill must be true on the decode leg, got {_describe(prefill)}",
        )
    decode = params.get("do_remote_decode")
    if decode is not None and decode is not False:
        raise DescriptorError(
            DescriptorReason.CONNECTOR_MISMATCH,
            f"do_remote_decode must be false or absent on the decode leg, got {_describe(decode)}",
        )
    if connector == NIXL:
        mode = params.get("transfer_mode")
        if mode is not None and (not isinstance(mode, str) or mode not in _NIXL_TRANSFER_MODES):
            raise DescriptorError(
                DescriptorReason.CONNECTOR_MISMATCH,
                f"transfer_mode must be 'pull' or 'push', got {_describe(mode)}",
            )


def _missing_identity(field: str, value: object, wanted: str) -> DescriptorError:
    what = "absent" if value is _ABSENT else _describe(value)
    return DescriptorError(
        DescriptorReason.MISSING_ENGINE_IDENTITY, f"{field} must be {wanted}, got {what}"
    )


def _check_nonblank(params: dict[str, Any], field: str) -> None:
    value = params.get(field, _ABSENT)
    if not _is_nonblank_str(value):
        raise _missing_identity(field, value, "a non-empty string")


def _check_identity(params: dict[str, Any], connector: str) -> None:
    _check_nonblank(params, "remote_engine_id")
    if connector == NIXL:
        # Optional (older vLLM omits it), but vLLM drops a descriptor whose id is unusable.
        if "remote_request_id" in params:
            _check_nonblank(params, "remote_request_id")
        _check_nonblank(params, "remote_host")
        port = params.get("remote_port", _ABSENT)
        if not _is_int(port) or not 1 <= port <= _MAX_PORT:
            raise _missing_identity("remote_port", port, "an int in 1..65535")
        return
    _check_nonblank(params, "transfer_id")
    addr = params.get("remote_bootstrap_addr", _ABSENT)
    if not isinstance(addr, str):
        raise _missing_identity("remote_bootstrap_addr", addr, "a 'host:port' string")
    try:
        parse_side_channel(addr)
    except ValueError as exc:
        raise DescriptorError(
            DescriptorReason.MISSING_ENGINE_IDENTITY, f"remote_bootstrap_addr: {exc}"
        ) from None


def _bad_block(path: str, value: object, wanted: str) -> DescriptorError:
    return DescriptorError(
        DescriptorReason.MALFORMED_BLOCK_IDS, f"{path} must be {wanted}, got {_describe(value)}"
    )


def _all_block_ids(ids: list[Any]) -> bool:
    """Whether every item is a non-negative int (exactly int: a bool is not a block id)."""
    for item in ids:  # a plain loop: all() over a generator costs about twice as much per id
        if type(item) is not int or item < 0:
            break
    else:
        return True
    return False


def _check_flat_ids(ids: list[Any], path: str) -> None:
    if _all_block_ids(ids):
        return
    for i, item in enumerate(ids):  # find and name the first bad one
        if not _is_int(item) or item < 0:
            raise _bad_block(f"{path}[{i}]", item, "a non-negative int")


def max_block_ids(prompt_tokens: int) -> int:
    """The most block ids one KV-cache group of a ``prompt_tokens`` prompt may hold: the
    prompt and the prefill leg's one generated token in blocks of :data:`MIN_BLOCK_SIZE`,
    plus :data:`BLOCK_ID_SLACK`."""
    return -(-(prompt_tokens + 1) // MIN_BLOCK_SIZE) + BLOCK_ID_SLACK


def _prompt_bound(params: dict[str, Any], prompt_tokens: int | None) -> int | None:
    """The fewest prompt tokens reported (the reply's count, the descriptor's), or None."""
    counts = [] if prompt_tokens is None else [prompt_tokens]
    own = params.get("remote_num_tokens")
    if type(own) is int and own >= 0:
        counts.append(own)
    return min(counts) if counts else None


def _check_block_count(ids: list[Any], prompt_tokens: int | None) -> None:
    if prompt_tokens is None:
        return
    bound = max_block_ids(prompt_tokens)
    groups = ids if ids and type(ids[0]) is list else [ids]
    for g, group in enumerate(groups):
        if type(group) is list and len(group) > bound:
            where = "remote_block_ids" if groups is not ids else f"remote_block_ids[{g}]"
            raise DescriptorError(
                DescriptorReason.TOO_MANY_BLOCK_IDS,
                f"{where} holds {len(group)} block ids; a prompt of {prompt_tokens} tokens "
                f"fills at most {bound}",
            )


def _check_block_ids(params: dict[str, Any], connector: str, prompt_tokens: int | None) -> None:
    if connector != NIXL:
        return
    field = "remote_block_ids"
    ids: Any = params.get(field)
    if ids is None:
        if params.get("transfer_mode") == "push":
            return  # push mode: the producer writes into the consumer; no ids to pull
        raise _bad_block(field, ids, "a list in pull mode")
    if not isinstance(ids, list):
        raise _bad_block(field, ids, "a list of int lists or a flat int list")
    _check_block_count(ids, _prompt_bound(params, prompt_tokens))
    if _all_block_ids(ids):  # the usual case, a flat list, in one pass
        return
    if all(isinstance(group, list) for group in ids):
        for g, group in enumerate(ids):
            _check_flat_ids(group, f"{field}[{g}]")
        return
    if any(isinstance(group, list) for group in ids):
        first = next(i for i, group in enumerate(ids) if not isinstance(group, list))
        raise _bad_block(f"{field}[{first}]", ids[first], "a list like its sibling groups")
    _check_flat_ids(ids, field)


def _check_finite(params: dict[str, Any]) -> None:
    """No NaN or infinity anywhere; the block ids, checked to be ints already, are skipped (a
    long prompt's are thousands of values)."""
    for key, value in params.items():
        kind = type(value)  # exact types, as parsed JSON has (compared without a call)
        if not (kind is float or kind is dict or kind is list) or key == "remote_block_ids":
            continue
        where = non_finite_at({key: value})
        if where is not None:
            raise DescriptorError(
                DescriptorReason.NON_FINITE_NUMBER,
                f"{where} is not a finite number (JSON has none)",
            )


def _side_channel_parts(descriptor: dict[str, Any], connector: str) -> tuple[str, int] | None:
    if connector == NIXL:
        host = descriptor.get("remote_host")
        port = descriptor.get("remote_port")
        if not _is_nonblank_str(host) or not _is_int(port) or not 1 <= port <= _MAX_PORT:
            return None
        return host.strip(), port
    addr = descriptor.get("remote_bootstrap_addr")
    if not isinstance(addr, str):
        return None
    try:
        return parse_side_channel(addr)
    except ValueError:
        return None


def side_channel_of(descriptor: dict[str, Any], connector: str) -> str | None:
    """The producer's KV side channel named by ``descriptor``, as ``host:port``.

    NixlConnector: ``remote_host``/``remote_port``; MooncakeConnector: ``remote_bootstrap_addr``
    without its scheme (an IPv6 host is bracketed). ``None`` when the descriptor does not name
    a usable one.
    """
    _require_known(connector)
    parts = _side_channel_parts(descriptor, connector)
    return None if parts is None else _join_host_port(*parts)


@functools.lru_cache(maxsize=64)
def _parse_pinned(pinned: str) -> tuple[str, int]:
    """The pinned side channel, parsed once per value (it comes from the config and is
    checked against every descriptor)."""
    return parse_side_channel(pinned)


def _check_side_channel(params: dict[str, Any], connector: str, pinned: str) -> None:
    try:
        pinned_host, pinned_port = _parse_pinned(pinned)
    except ValueError as exc:
        raise ValueError(f"pinned side channel is unusable: {exc}") from None
    parts = _side_channel_parts(params, connector)
    if parts is None:  # pragma: no cover - the identity checks ran first
        raise DescriptorError(
            DescriptorReason.MISSING_ENGINE_IDENTITY, "descriptor names no KV side channel"
        )
    host, port = parts
    if _norm_host(host) != _norm_host(pinned_host) or port != pinned_port:
        fields = "remote_host/remote_port" if connector == NIXL else "remote_bootstrap_addr"
        found = _join_host_port(host, port)
        if len(found) > 100:
            found = found[:97] + "..."
        raise DescriptorError(
            DescriptorReason.SIDE_CHANNEL_MISMATCH,
            f"engine contract pins the producer's KV side channel to "
            f"{_join_host_port(pinned_host, pinned_port)}, but the descriptor's {fields} "
            f"names {found}",
        )


def validate_descriptor(
    params: object,
    connector: str,
    pinned_side_channel: str | None = None,
    *,
    detach: bool = True,
    prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """Check the producer's ``kv_transfer_params`` for the decode leg of ``connector``.

    Returns a deep copy of ``params`` (every field kept verbatim) or raises
    :class:`DescriptorError`. ``pinned_side_channel`` (``host:port``) is the producer's KV side
    channel fixed by the engine contract; hosts compare case-insensitively and literally
    (``localhost`` is not ``127.0.0.1``). A pinned value that does not parse is a configuration
    error and raises a plain ``ValueError``. ``detach=False`` returns ``params`` itself, for a
    value the caller has just parsed and holds nowhere else (a prefill reply's): a copy of a
    long prompt's block ids costs about as much as checking them. ``prompt_tokens``: the
    prompt's length as the producer's reply reports it (``usage.prompt_tokens``), which bounds
    the block ids with the descriptor's own ``remote_num_tokens``.
    """
    if not isinstance(params, dict):
        raise DescriptorError(
            DescriptorReason.NOT_AN_OBJECT,
            f"kv_transfer_params must be a JSON object, got {_describe(params)}",
        )
    _require_known(connector)
    _check_shape(params, connector)
    _check_identity(params, connector)
    _check_block_ids(params, connector, prompt_tokens)
    if pinned_side_channel is not None:
        _check_side_channel(params, connector, pinned_side_channel)
    _check_finite(params)
    return json_copy(params) if detach else params
