"""Direct KV handoffs through a running producer/consumer pair, with no router in between.

Rule: a handoff here is exactly the two legs Narwhal sends, written with the standard library
only (the launcher's callers need no httpx): a one-token, non-streamed prefill on the producer
with the prefill leg's ``kv_transfer_params`` (:func:`narwhal.core.descriptor.prefill_kv_params`,
the router's own), then a greedy decode on the consumer carrying the descriptor the producer
returned. Any failure is an :class:`~narwhal.vllm.processes.EngineError` saying which leg.

Theory of operation: :func:`handoff` runs one and returns the decoded text.
:func:`wait_pair_ready` runs handoffs until one works: after an engine restarts on the same
ports its peer re-handshakes with the new engine id by itself, but on a loaded machine that
first NIXL handshake can miss vLLM's 5 s reply timeout, and that one decode then fails with an
in-band error.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from narwhal.core.descriptor import prefill_kv_params
from narwhal.vllm.processes import EngineError, EngineProcess

CONNECTOR = "NixlConnector"


def http_post_json(url: str, body: Mapping[str, object], timeout: float = 60.0) -> object:
    """``POST url`` with a JSON body -> the parsed JSON reply; raises :class:`EngineError`."""
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:300]
        raise EngineError(f"POST {url}: HTTP {error.code} {detail}") from error
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise EngineError(f"POST {url}: {error}") from error


def handoff(
    producer: EngineProcess, consumer: EngineProcess, prompt: str, max_tokens: int = 4
) -> str:
    """One disaggregated completion without a router: a one-token prefill on the producer,
    then a greedy decode on the consumer with the producer's KV descriptor; the text."""
    body: dict[str, object] = {"model": producer.spec.served_model_name, "prompt": prompt}
    prefill = http_post_json(
        producer.url + "/v1/completions",
        {
            **body,
            "max_tokens": 1,
            "stream": False,
            "kv_transfer_params": prefill_kv_params(CONNECTOR),
        },
    )
    params = prefill.get("kv_transfer_params") if isinstance(prefill, dict) else None
    if not isinstance(params, dict):
        raise EngineError(f"{producer.spec.name} returned no kv_transfer_params: {prefill}")
    decode = http_post_json(
        consumer.url + "/v1/completions",
        {**body, "max_tokens": max_tokens, "temperature": 0, "kv_transfer_params": params},
    )
    try:
        return str(decode["choices"][0]["text"])  # type: ignore[index]
    except (KeyError, IndexError, TypeError) as error:
        raise EngineError(f"{consumer.spec.name} decode failed: {decode}") from error


def wait_pair_ready(
    producer: EngineProcess, consumer: EngineProcess, attempts: int = 3
) -> list[str]:
    """Run handoffs until one works (a restarted peer must complete a NIXL handshake, whose
    5 s reply timeout a loaded machine can miss once); the errors seen before it worked."""
    errors: list[str] = []
    for attempt in range(attempts):
        try:
            handoff(producer, consumer, f"pair ready? {time.time()} {attempt}")
            return errors
        except EngineError as error:
            errors.append(str(error))
    raise EngineError(f"no KV handoff worked in {attempts} attempts: {errors}")
