"""Chat streams resumed through the completions endpoint: what the continuation asks for and
how its chunks become the client's chat chunks.

Rule kept here: a chat stream is continued only from the token ids the engine reported for it
(the chat template's rendering of the messages, generation prompt included, and the generated
ids), never by re-rendering or re-tokenising text; and the client sees one chat stream — the
resumed leg's completions chunks are rewritten into chat chunks, nothing else about them
changes. Checked against the pinned vLLM (0.32, ``entrypoints/openai/chat_completion``): with
``return_token_ids`` a streaming chat request's first chunk (the role chunk) carries the
rendered prompt's ids at the chunk's top level (``prompt_token_ids``), and every generated
chunk ``token_ids`` in its choice; vLLM's chat endpoint takes no token-id prompt, so the
continuation is a completions request whose ``prompt`` is those ids plus the delivered ones.

Theory of operation: :func:`chat_refusal` names what in a chat request a replay could not
rebuild (media parts in the messages: their placeholder ids would be replayed without the
media; a thinking budget: it counts reasoning tokens by the parser's state). While the first
leg streams, :func:`parsed` spots a delta the engine's reasoning or tool parser shaped
(``reasoning``/``reasoning_content``, ``tool_calls``, or ids with no ``content`` key: the
parser held their text back), which a completions leg would not reproduce. On a resume,
:func:`continuation_body` maps the chat body to a completions one (chat-only fields dropped,
``max_completion_tokens`` taken as ``max_tokens``, both then reduced by the caller) and
:func:`as_chat_chunk` rewrites each of its chunks. A chat request with neither limit may run to
the context length (vLLM's default: ``max_model_len`` less the prompt), where a completions
request stops at 16 tokens; the continuation then asks explicitly for the stated sequence
length (``recovery.resume_max_seq_len``, to be set to the engines' ``max_model_len``) less
prompt and delivered tokens: the same end as the uninterrupted run's.
"""

from __future__ import annotations

from typing import Any

from narwhal.core.requests import COMPLETIONS

CONTINUATION_ENDPOINT = COMPLETIONS  # vLLM's chat endpoint takes no token-id prompt

# ChatCompletionRequest fields the pinned vLLM's CompletionRequest lacks (it would ignore them
# with a warning), and ``add_special_tokens`` (a chat default of False that concerns rendering
# the messages, done already: a token-id prompt is not tokenised again)
CHAT_ONLY_FIELDS = frozenset(
    (
        "messages",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "chat_template_kwargs",
        "documents",
        "include_reasoning",
        "max_completion_tokens",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "parallel_tool_calls",
        "reasoning_effort",
        "return_prompt_text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "add_special_tokens",
    )
)

_PARSED_FIELDS = ("reasoning", "reasoning_content", "tool_calls", "function_call")


def chat_limit(body: dict[str, Any]) -> int | None:
    """The output limit a chat request set (``max_completion_tokens`` first, as vLLM reads
    it), or None: it runs to the context length."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if type(value) is int:
            return value
    return None


def chat_refusal(body: dict[str, Any]) -> str | None:
    """Why a chat request's stream could not be replayed exactly from its ids, beyond what
    refuses a completions request (``media``, ``reasoning``), or None."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list) and any(
                not isinstance(part, dict) or part.get("type") != "text" for part in content
            ):
                return "media"
    budget = body.get("thinking_token_budget")
    if budget is not None:
        return "reasoning"
    return None


def parsed(choice: dict[str, Any]) -> bool:
    """Whether a chat choice's delta was shaped by a reasoning or tool parser on the engine:
    without one, vLLM writes every generated chunk's delta as ``{"content": text}``."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    if any(delta.get(name) for name in _PARSED_FIELDS):
        return True
    return bool(choice.get("token_ids")) and "content" not in delta


def continuation_body(body: dict[str, Any]) -> dict[str, Any]:
    """A chat body as a completions body (the caller sets ``prompt`` and the limits):
    chat-only fields dropped, the chat's output limit as ``max_tokens``. ``logprobs`` goes too:
    a chat's is a flag (one that is set refuses the resume), a completion's a count, and a
    chat's ``false`` read as a count would be 0 — logprobs of each sampled token."""
    out = {k: v for k, v in body.items() if k not in CHAT_ONLY_FIELDS and k != "logprobs"}
    limit = chat_limit(body)
    if limit is None:
        out.pop("max_tokens", None)
    else:
        out["max_tokens"] = limit
    return out


def as_chat_chunk(payload: dict[str, Any], keep_ids: bool) -> dict[str, Any]:
    """A completions chunk of a resumed leg as the chat chunk vLLM's chat endpoint writes for
    the same tokens: ``delta.content`` for ``text``, ``stop_reason`` only with a
    ``finish_reason``, ``token_ids`` only if the client asked (``keep_ids``), never the leg's
    own ``prompt_token_ids``; a usage chunk keeps its (empty) choices. The caller sets the
    client stream's ``id``, ``created``, ``model`` and usage."""
    out = {k: v for k, v in payload.items() if k not in ("choices", "prompt_token_ids")}
    out["object"] = "chat.completion.chunk"
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return out
    rewritten: list[Any] = []
    for choice in choices:
        if not isinstance(choice, dict):
            rewritten.append(choice)
            continue
        finish = choice.get("finish_reason")
        chat: dict[str, Any] = {
            "index": choice.get("index", 0),
            "delta": {"content": choice.get("text", "")},
            "logprobs": None,
            "finish_reason": finish,
        }
        if finish is not None:
            chat["stop_reason"] = choice.get("stop_reason")
        if keep_ids and "token_ids" in choice:
            chat["token_ids"] = choice["token_ids"]
        rewritten.append(chat)
    out["choices"] = rewritten
    return out
