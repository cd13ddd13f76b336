"""Narwhal in front of a real NixlConnector pair: the same text as one plain engine, real KV moved.

For completions and chat, streamed and not, a request through Narwhal (OpenAI SDK as the client)
must give exactly the greedy text of the reference engine, and the consumer's
``prompt_tokens_by_source{source="external_kv_transfer"}`` must rise by the prompt's tokens while
the producer's ``local_compute`` rises by the same amount: the producer computed the prompt, the
consumer pulled its KV instead of recomputing it. With ``n = 2`` and seeded sampling, both choices
come back through the handoff as the plain engine samples them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.vllm.conftest import Fleet
from tests.vllm.harness import MODEL, Narwhal

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

SOURCE = "vllm:prompt_tokens_by_source_total"
MAX_TOKENS = 48


def unique_prompt(seed: int, length: int) -> str:
    """A prompt no engine has seen in this session (prefix caches stay out of the counts)."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz ,.;:!?ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return f"[{seed}] " + "".join(rng.choice(alphabet) for _ in range(length))


def sources(fleet: Fleet) -> dict[str, dict[str, float]]:
    return {
        engine.spec.name: {
            kind: engine.metric(SOURCE, source=kind)
            for kind in ("local_compute", "local_cache_hit", "external_kv_transfer")
        }
        for engine in (fleet.producer, fleet.consumer)
    }


def reference(fleet: Fleet, endpoint: str, prompt: str) -> tuple[str, int]:
    """Greedy text and prompt tokens from the plain engine (non-streamed)."""
    client = openai.OpenAI(base_url=fleet.single.url + "/v1", api_key="unused", max_retries=0)
    if endpoint == "completions":
        done = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        text = done.choices[0].text
    else:
        chat = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        text = chat.choices[0].message.content or ""
        done = chat  # type: ignore[assignment]
    assert done.usage is not None
    return text, done.usage.prompt_tokens


def through_narwhal(router: Narwhal, endpoint: str, prompt: str, stream: bool) -> str:
    client = router.client()
    common: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0}
    if endpoint == "completions":
        if not stream:
            done = client.completions.create(prompt=prompt, **common)
            assert done.choices[0].finish_reason == "length"
            return str(done.choices[0].text)
        parts = [
            c.choices[0].text
            for c in client.completions.create(prompt=prompt, stream=True, **common)
            if c.choices
        ]
        return "".join(parts)
    messages: Any = [{"role": "user", "content": prompt}]
    if not stream:
        chat = client.chat.completions.create(messages=messages, **common)
        assert chat.choices[0].finish_reason == "length"
        return chat.choices[0].message.content or ""
    parts = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(messages=messages, stream=True, **common)
        if c.choices
    ]
    return "".join(parts)


CASES = [
    ("completions", False, 40),
    ("completions", True, 300),
    ("chat", False, 150),
    ("chat", True, 700),
]


@pytest.mark.parametrize(
    ("endpoint", "stream", "length"),
    CASES,
    ids=[f"{e}-{'stream' if s else 'json'}" for e, s, _ in CASES],
)
def test_same_text_as_one_engine_and_kv_moved(
    narwhal: Callable[..., Narwhal], pair: Fleet, endpoint: str, stream: bool, length: int
) -> None:
    router = narwhal()
    prompt = unique_prompt(length * 10 + stream, length)
    expected, prompt_tokens = reference(pair, endpoint, prompt)
    if endpoint == "completions":
        assert prompt_tokens == len(prompt) + 1  # one token per character, plus <s>
    before = sources(pair)

    text = through_narwhal(router, endpoint, prompt, stream)

    after = sources(pair)
    assert len(text) == MAX_TOKENS  # one character per token, no special token emitted
    assert text == expected
    moved = {
        name: {kind: after[name][kind] - before[name][kind] for kind in after[name]}
        for name in after
    }
    assert moved["consumer"]["external_kv_transfer"] == prompt_tokens, moved
    assert moved["consumer"]["local_compute"] == 0, moved
    assert moved["producer"]["local_compute"] == prompt_tokens, moved
    assert moved["producer"]["external_kv_transfer"] == 0, moved


def test_two_sampled_choices_as_one_engine(narwhal: Callable[..., Narwhal], pair: Fleet) -> None:
    """``n = 2`` with seeded sampling (vLLM refuses n > 1 with greedy decoding): both choices
    come back through the handoff, each as the plain engine samples it."""
    prompt = unique_prompt(2, 60)
    common: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "n": 2}
    sampling: dict[str, Any] = {"temperature": 1.0, "seed": 7}
    single = openai.OpenAI(base_url=pair.single.url + "/v1", api_key="unused", max_retries=0)
    expected = [c.text for c in single.completions.create(**common, **sampling).choices]
    before = sources(pair)

    done = narwhal().client().completions.create(**common, **sampling)

    assert [c.index for c in done.choices] == [0, 1]
    assert [c.text for c in done.choices] == expected
    assert done.usage is not None and done.usage.completion_tokens == 2 * 12
    after = sources(pair)
    assert after["consumer"]["external_kv_transfer"] > before["consumer"]["external_kv_transfer"]
    assert after["consumer"]["local_compute"] == before["consumer"]["local_compute"]


def test_non_streamed_logprobs_as_one_engine(narwhal: Callable[..., Narwhal], pair: Fleet) -> None:
    """A non-streaming client gets the logprobs the plain engine gives (Narwhal streams upstream
    and assembles: every token's logprob and its alternatives must survive that)."""
    prompt = unique_prompt(3, 50)
    common: dict[str, Any] = {
        "model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 2
    }  # fmt: skip
    single = openai.OpenAI(base_url=pair.single.url + "/v1", api_key="unused", max_retries=0)
    expected = single.completions.create(**common).choices[0].logprobs

    got = narwhal().client().completions.create(**common).choices[0].logprobs

    assert expected is not None and got is not None  # the assembler used to drop them: None
    assert got.tokens == expected.tokens and len(got.tokens or []) == 6
    assert got.text_offset == expected.text_offset
    assert got.token_logprobs == pytest.approx(expected.token_logprobs, abs=1e-3)
    assert [sorted(t) for t in got.top_logprobs or []] == [
        sorted(t) for t in expected.top_logprobs or []
    ]
