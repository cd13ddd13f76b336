"""A prompt's content identity: written as segments in its text, read back as block keys that
agree exactly as far as two prompts' segments do."""

from __future__ import annotations

from narwhal.sim.gpu import wire
from narwhal.sim.gpu.prefix import OFFSETS, block_keys, content_text, prompt_text


def keys(text: str, tokens: int, block_size: int = 16) -> list[tuple[int, int]] | None:
    found = block_keys(text, tokens, block_size)
    return None if found is None else [divmod(key, OFFSETS) for key in found]


def test_the_text_has_the_prompts_tokens_and_its_segments_in_order() -> None:
    text = prompt_text(40, ((5, 20), (9, 20)), 0)
    assert wire.prompt_tokens({"prompt": text}) == 40  # one token per character plus BOS
    assert text == "#5;" + "x" * 16 + "#9;" + "x" * 17  # the first segment holds BOS
    unique = prompt_text(10, (), 300)
    assert unique == "~12c;xxxx" and wire.prompt_tokens({"prompt": unique}) == 10
    assert prompt_text(3, (), 300) == "~1"  # a marker longer than the prompt is cut short


def test_a_block_is_keyed_by_the_segment_holding_its_last_token_and_its_offset() -> None:
    text = prompt_text(40, ((5, 20), (9, 20)), 0)
    assert keys(text, 40) == [(5, 15), (9, 11)]  # 2 full blocks: tokens 0-15 and 16-31
    assert keys(text, 40, block_size=8) == [(5, 7), (5, 15), (9, 3), (9, 11), (9, 19)]
    assert keys(text, 40, block_size=20) == [(5, 19), (9, 19)]  # ends exactly on segments
    assert keys(text, 40, block_size=64) == []  # no full block


def test_keys_agree_exactly_as_far_as_the_segments_do() -> None:
    shared = ((7, 512), (8, 512))
    one = prompt_text(1100, (*shared, (20, 76)), 0)
    two = prompt_text(1500, (*shared, (30, 476)), 1)
    a, b = keys(one, 1100), keys(two, 1500)
    assert a is not None and b is not None
    assert a[:64] == b[:64]  # the 64 blocks inside the shared 1,024 tokens
    assert a[64] != b[64] and a[64][0] == 20 and b[64][0] == 30
    assert len(a) == 1100 // 16 and len(b) == 1500 // 16


def test_prompts_without_identity_or_with_a_cut_marker_have_no_keys_from_there_on() -> None:
    assert keys(prompt_text(500, (), 3), 500) is None  # the Azure traces, synthetic lengths
    assert keys("x" * 99, 100) is None
    cut = prompt_text(200, ((5, 100), (0xABCDEF, 3), (9, 97)), 0)  # "#abc" has no end
    assert keys(cut, 200) == [(5, 15 + 16 * i) for i in range(6)]  # blocks within segment 5
    assert keys("#zz;xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 36) == []  # not an id: no identity


def test_a_chats_single_message_carries_it_after_the_template_tokens() -> None:
    text = prompt_text(40, ((5, 20), (9, 20)), 0)
    body = {"messages": [{"role": "user", "content": text}]}
    assert content_text(body) == text
    tokens = wire.prompt_tokens(body)
    assert tokens == len(text) + 4 + 2  # the sim tokenizer's chat template: 6 tokens
    assert tokens is not None and keys(text, tokens) == [(5, 15), (9, 6)]  # segment 5: 25 tokens
    two = {"messages": [{"role": "system", "content": text}, {"role": "user", "content": "q"}]}
    assert content_text(two) is None
    assert content_text({"prompt": [1, 2, 3]}) is None
