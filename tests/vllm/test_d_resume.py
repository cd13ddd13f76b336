"""A resumed stream on real vLLM: a consumer killed mid-stream, the client's stream resumed by
token replay (vLLM's ``return_token_ids``: the prompt's and the delivered tokens' ids, prefilled
afresh), and the client's text exactly the uninterrupted greedy run's — for a completions stream
and for a chat stream (its prompt's ids the chat template's, as the engine reported them on the
role chunk; the continuation a completions request, rewritten into the client's chat chunks).

Destructive (the consumer is left dead; the ``pair`` fixture restarts it for any later test), so
it runs after the other files. The second consumer is the suite's plain engine (no KV connector:
it ignores the handoff and computes the prompt itself), which also gives the reference text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from narwhal.vllm.processes import metric_sum
from tests.vllm.conftest import Fleet
from tests.vllm.harness import MODEL, Narwhal, fleet_config_text
from tests.vllm.test_a_serving import unique_prompt
from tests.vllm.test_c_faults import kill_after_tokens

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

MAX_TOKENS = 1900  # about 4 s of decode: the kill comes long before the end
KILL_AFTER = 20


def uninterrupted(client: openai.OpenAI, endpoint: str, prompt: str) -> str:
    """The greedy text of one whole run (not streamed)."""
    if endpoint == "completions":
        done = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        assert done.choices[0].finish_reason == "length"  # (the tiny model: greedy, no EOS)
        return done.choices[0].text
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert chat.choices[0].finish_reason == "length"
    return chat.choices[0].message.content or ""


def streamed(client: openai.OpenAI, endpoint: str, prompt: str) -> tuple[str, set[str]]:
    """The text a streaming client assembles, and the extra fields its choices carried."""
    common: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0}
    if endpoint == "completions":
        stream = client.completions.create(prompt=prompt, stream=True, **common)
        choices = [chunk.choices[0] for chunk in stream if chunk.choices]
        extra = {k for choice in choices for k in choice.model_extra or {}}
        return "".join(choice.text for choice in choices), extra
    messages: Any = [{"role": "user", "content": prompt}]
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **common))
    assert len({(c.id, c.created) for c in chunks}) == 1  # one client stream
    extra = {k for c in chunks for k in c.model_extra or {}}
    extra |= {k for c in chunks for choice in c.choices for k in choice.model_extra or {}}
    text = "".join(choice.delta.content or "" for c in chunks for choice in c.choices)
    return text, extra


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_consumer_killed_mid_stream_is_resumed_with_the_uninterrupted_text(
    pair: Fleet, tmp_path: Path, log_dir: Path, endpoint: str
) -> None:
    prompt = unique_prompt(17, 50) if endpoint == "completions" else unique_prompt(18, 40)
    single = openai.OpenAI(base_url=pair.single.url + "/v1", api_key="unused", max_retries=0)
    reference = uninterrupted(single, endpoint, prompt)

    config = tmp_path / "narwhal-resume.toml"
    config.write_text(
        fleet_config_text(
            [pair.producer],
            [pair.consumer, pair.single],  # round robin: the first stream goes to the consumer
            routing={"decode": "round_robin"},
            recovery={"resume_streams": True, "eject_after": 2, "probe_interval_s": 60.0},
            # the resumed leg re-prefills on a CPU engine: on a loaded 2-core machine its first
            # token has come more than the suite's 10 s after the last one
            engine={"decode_read_timeout_s": 30.0},
        )
    )
    router = Narwhal(config, log_dir / "narwhal-resume.log").start()
    try:
        killer = kill_after_tokens(pair.consumer, KILL_AFTER, timeout=30)
        text, extra = streamed(router.client(), endpoint, prompt)
        killer.join(timeout=30)
        # the token ids the router asked for are its own: the client did not ask for them
        assert not extra & {"token_ids", "prompt_token_ids"}, extra
        assert not pair.consumer.alive()  # killed mid-stream, and still the stream went on
        assert text == reference
        metrics = router.metrics()
        resumed = metric_sum(metrics, "narwhal_stream_resumes_total", outcome="resumed")
        assert resumed == 1, metrics
        entry = router.engine(pair.consumer.url)
        assert entry["failure_streak"] == 1, entry  # the dead consumer is charged as ever
    finally:
        router.stop()
