"""parse_client_request: every bad shape is a BadRequest with its reason; whatever the body,
client ``kv_transfer_params`` never survive and the parsed body shares nothing with the input.
(The two leg bodies built from it are tested through the lifecycle, test_lifecycle_paths.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.requests import (
    CHAT,
    COMPLETIONS,
    BadRequest,
    decode_body,
    parse_client_request,
    prefill_body,
)

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    ["prompt", "messages", "stream", "max_tokens", "max_completion_tokens", "n",
     "kv_transfer_params", "model", "temperature"]
)  # fmt: skip


@st.composite
def routable(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A body of the right shape for its endpoint, with any extra fields (client
    ``kv_transfer_params`` among them) and nested values."""
    endpoint = draw(st.sampled_from([COMPLETIONS, CHAT]))
    body = draw(st.dictionaries(st.sampled_from(["model", "temperature", "user", "x"]), JSON))
    if endpoint == COMPLETIONS:
        body["prompt"] = draw(st.text() | st.lists(st.integers(0, 50_000), min_size=1))
    else:
        message = st.dictionaries(st.sampled_from(["role", "content"]), JSON, min_size=1)
        body["messages"] = draw(st.lists(message, min_size=1, max_size=3))
    body["kv_transfer_params"] = draw(JSON)
    if draw(st.booleans()):
        body["stream"] = draw(st.booleans())
    if draw(st.booleans()):
        body["max_tokens"] = draw(st.integers(1, 4096))
    return endpoint, body


def anything() -> st.SearchStrategy[tuple[str, Any]]:
    """Any JSON body, mostly of no routable shape."""
    return st.tuples(
        st.sampled_from([COMPLETIONS, CHAT]), st.dictionaries(FIELDS, JSON, max_size=6) | JSON
    )


def parse(body: object, endpoint: str = COMPLETIONS) -> Any:
    return parse_client_request(endpoint, body, request_id="r", arrival=0.0)


@pytest.mark.parametrize(
    ("endpoint", "body", "reason"),
    [
        ("/v1/embeddings", {"input": "x"}, "unsupported endpoint '/v1/embeddings'"),
        (COMPLETIONS, ["prompt"], "request body must be a JSON object"),
        (COMPLETIONS, {"max_tokens": 3}, "'prompt' is required"),
        (COMPLETIONS, {"prompt": []}, "'prompt' is required"),
        (COMPLETIONS, {"prompt": 7}, "'prompt' is required"),
        (CHAT, {"messages": "hi"}, "'messages' is required"),
        (CHAT, {"messages": []}, "'messages' is required"),
        (CHAT, {"messages": ["hi"]}, "each of 'messages' must be an object"),
        (COMPLETIONS, {"prompt": "x", "stream": "yes"}, "'stream' must be a boolean"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, "'max_tokens' must be a positive integer"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": True}, "'max_tokens' must be a positive"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": "3"}, "'max_tokens' must be a positive"),
        (CHAT, {"messages": [{}], "max_completion_tokens": -1}, "'max_completion_tokens' must"),
        (COMPLETIONS, {"prompt": "x", "n": 1.5}, "'n' must be a positive integer"),
        (COMPLETIONS, {"prompt": ["a", "b"]}, "'prompt' must be one prompt"),
        (COMPLETIONS, {"prompt": [[1, 2], [3]]}, "'prompt' must be one prompt"),
        (COMPLETIONS, {"prompt": [1, "a"]}, "'prompt' must be one prompt"),
        (
            COMPLETIONS,
            {"prompt": "x", "temperature": float("nan")},
            "'temperature' must be a finite",
        ),
        (CHAT, {"messages": [{}], "logit_bias": {"5": float("inf")}}, "'logit_bias.5' must be a"),
        (COMPLETIONS, {"prompt": "x", "x": [1.0, -float("inf")]}, "'x[1]' must be a finite"),
    ],
)
def test_bad_shapes_say_why(endpoint: str, body: object, reason: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse(body, endpoint)
    assert str(caught.value).startswith(reason)


def test_good_shapes_parse() -> None:
    chat = parse({"messages": [{"role": "user", "content": "hi"}], "stream": True}, CHAT)
    assert chat.endpoint == CHAT and chat.stream
    tokens = parse({"prompt": [1, 2, 3], "max_tokens": 4, "n": 1})
    assert tokens.body["prompt"] == [1, 2, 3] and not tokens.stream
    assert parse({"prompt": ["one"]}).body["prompt"] == ["one"]  # a batch of one
    assert parse({"prompt": [[1, 2]]}).body["prompt"] == [[1, 2]]
    assert parse({"prompt": "x", "temperature": 0.5, "top_p": 1e-300}).body["top_p"] == 1e-300


@settings(derandomize=True, max_examples=300)
@given(routable() | anything())
def test_any_body_is_parsed_or_refused_and_never_carries_client_kv_params(
    case: tuple[str, Any],
) -> None:
    endpoint, body = case
    try:
        request = parse(body, endpoint)
    except BadRequest:
        return
    assert "kv_transfer_params" not in request.body
    assert "kv_transfer_params" not in (request.body.get("vllm_xargs") or {})
    expected = {k: v for k, v in body.items() if k != "kv_transfer_params"}
    if isinstance(expected.get("vllm_xargs"), dict):
        xargs = expected["vllm_xargs"]
        expected["vllm_xargs"] = {k: v for k, v in xargs.items() if k != "kv_transfer_params"}
    assert request.body == expected
    ours = {"do_remote_decode": True}
    assert prefill_body(request, ours)["kv_transfer_params"] == ours
    assert "kv_transfer_params" not in decode_body(request, None)
    # detached: changing what the client sent changes nothing already parsed
    before = repr(request.body)
    for value in body.values():
        if isinstance(value, list | dict):
            value.clear()
    assert repr(request.body) == before


def test_an_owned_body_is_taken_as_is_and_its_legs_share_it() -> None:
    messages = [{"role": "user", "content": "x" * 1000}]
    body = {"messages": messages, "max_tokens": 3, "kv_transfer_params": {"remote_host": "evil"}}
    request = parse_client_request(CHAT, body, request_id="r", arrival=0.0, detach=False)
    assert request.body["messages"] is messages  # no copy of what the router just parsed
    assert "kv_transfer_params" not in request.body and "kv_transfer_params" in body
    before = repr(request.body)
    prefill = prefill_body(request, {"do_remote_decode": True})
    decode = decode_body(request, {"remote_engine_id": "e"})
    assert prefill["messages"] is messages and decode["messages"] is messages
    assert prefill["max_tokens"] == 1 and decode["stream"] is True
    assert repr(request.body) == before  # building the legs changed nothing of the request


def test_the_first_non_finite_number_is_named_by_its_path() -> None:
    body = {"prompt": "x", "a": [0.5, {"b": [1, 2.5, float("nan")]}], "c": float("inf")}
    with pytest.raises(BadRequest, match=r"^'a\[1\]\.b\[2\]' must be a finite number"):
        parse(body)


@pytest.mark.parametrize("detach", [True, False])
def test_kv_transfer_params_in_vllm_xargs_never_reach_a_leg(detach: bool) -> None:
    """vLLM copies ``vllm_xargs`` into a request's extra arguments, where its connector reads
    ``kv_transfer_params``: the client's are dropped there too, the other extra arguments kept,
    and the client's body left as it was."""
    evil = {"do_remote_prefill": True, "remote_host": "evil.example", "remote_port": 5600}
    xargs = {"kv_transfer_params": evil, "my_extension": 3}
    body = {"prompt": "hi", "max_tokens": 2, "vllm_xargs": xargs, "kv_transfer_params": evil}
    request = parse_client_request(COMPLETIONS, body, request_id="r", arrival=0.0, detach=detach)
    ours = {"do_remote_decode": True}
    legs = [
        prefill_body(request, ours),
        decode_body(request, None),  # same worker: no top-level parameters to override them
        decode_body(request, {"do_remote_prefill": True}),
    ]
    for leg in legs:
        assert leg["vllm_xargs"] == {"my_extension": 3}
        assert "evil.example" not in repr(leg)
    assert body["vllm_xargs"] is xargs and xargs["kv_transfer_params"] is evil  # untouched
    assert "vllm_xargs" not in parse({"prompt": "hi"}).body  # nothing added when absent
