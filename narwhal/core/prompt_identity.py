"""What the request log says of a client's prompt, so that a replay can rebuild its traffic:
its size, the output it asked for, and its content identity, never its text.

Rule kept here: no prompt text leaves this module, only its length in bytes and chained hashes
of its full :data:`LOG_BLOCK_BYTES`-byte blocks (equal hashes mean equal prompt prefixes, as
vLLM's chained block hashes do); pure, no I/O.

Theory of operation: the prompt is rendered as ``prefix_affinity`` renders it
(:func:`~narwhal.core.routing.prefix.rendered_prompt`: a completion's text, a chat's turns as
canonical JSON), and its first :data:`LOG_BLOCKS` full blocks are hashed as a chain
(:func:`~narwhal.core.routing.prefix.block_hashes`); each hash is logged as
:data:`HASH_HEX` hex digits. The hashes are unsalted, so they can confirm a guessed prompt (a
short, well-known one, such as a public system prompt) but not reveal an unknown one. A replay
(``[workload] kind = "log"``) turns the chain into the simulated prompt's segments, so the
simulated prefix caches share what the real prompts shared, block for block.
"""

from __future__ import annotations

from typing import Any

from narwhal.core.requests import ClientRequest
from narwhal.core.routing.prefix import block_hashes, rendered_prompt

# about 512 tokens of English text: the granularity of Mooncake's published block hashes (the
# bundled traces'), and few enough blocks that hashing costs little more than reading the bytes
LOG_BLOCK_BYTES = 2048
LOG_BLOCKS = 128  # a prompt's first 256 KiB: past it, nothing more is logged of its identity
HASH_HEX = 12  # 48 bits a block: collisions improbable among hundreds of millions of blocks


def asked_output(request: ClientRequest) -> int | None:
    """The output tokens the client asked for at most (``max_tokens``, or a chat's
    ``max_completion_tokens``); None: the engine's default."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = request.body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def prompt_fields(request: ClientRequest) -> dict[str, Any]:
    """The request log's fields about ``request``'s prompt (module docstring)."""
    rendered = rendered_prompt(request)
    chain = block_hashes(rendered, LOG_BLOCK_BYTES, LOG_BLOCKS)
    return {
        "endpoint": request.endpoint,
        "stream": request.stream,
        "max_tokens": asked_output(request),
        "prompt_bytes": len(rendered),
        "prefix": [digest.hex()[:HASH_HEX] for digest in chain],
    }
