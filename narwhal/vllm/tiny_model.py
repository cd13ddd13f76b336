"""A tiny Llama with seeded random weights and an in-code tokenizer: no downloads.

Usage: ``narwhal vllm tiny-model OUT_DIR [--seed 0]``. Building needs torch, transformers and
tokenizers, which only the vLLM venv has: :func:`build_in_venv` runs that command with the vLLM
venv's Python, marked (``NARWHAL_TINY_MODEL_HERE=1``) to call :func:`build` there and never
delegate again.

Rule: the model is a pure function of the seed. The same seed writes the same weights, so a
greedy (temperature 0) run gives the same text on any engine that loads it, which is what the
end-to-end tests compare: Narwhal in front of a producer/consumer pair against one plain engine.

Theory of operation:

- Tokenizer, built with the ``tokenizers`` library: a WordLevel vocabulary of six specials
  (``<unk> <s> </s> <pad> <|im_start|> <|im_end|>``, ids 0-5) followed by one token per printable
  ASCII character (space to ``~``) and ``\\t \\n \\r``: 104 tokens. A ``Split(Regex("[\\s\\S]"),
  "isolated")`` pre-tokenizer makes every character a token, a Fuse decoder glues them back, and
  a template post-processor prepends ``<s>``; so a completion prompt of N characters is N + 1
  tokens. Wrapped in ``PreTrainedTokenizerFast`` with a ChatML-like chat template.
- Model: ``LlamaConfig`` (vocab 104, hidden 256, intermediate 512, 2 layers, 4 heads, head_dim
  64, 2048 positions), weights drawn after ``torch.manual_seed(seed)`` with
  ``initializer_range`` :data:`INIT_RANGE` (0.1, not the default 0.02: at 0.02 greedy decoding
  falls into one repeated character whatever the prompt, and equal outputs would prove little;
  at 0.1 the text depends on every prompt character). The lm_head rows of the special tokens are
  zeroed, so greedy decoding never emits them (every other logit would have to be negative) and
  a temperature-0 run always goes to ``max_tokens``.
- Written with ``save_pretrained`` (safetensors, float32) plus a ``narwhal-tiny.json`` stamp;
  building again into a folder with the same stamp does nothing.

torch/transformers/tokenizers are imported inside :func:`build`, so this module imports in the
project venv too (where :data:`CHARS`, :func:`vocabulary` and :func:`build_in_venv` are used).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from narwhal.vllm.env import DEFAULT_VENV

HERE_ENV = "NARWHAL_TINY_MODEL_HERE"

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>")
CHARS = (*(chr(c) for c in range(32, 127)), "\t", "\n", "\r")
HIDDEN = 256
INIT_RANGE = 0.1
STAMP = "narwhal-tiny.json"
RECIPE_VERSION = 2
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def vocabulary() -> dict[str, int]:
    """Token -> id: the six specials, then one token per character of :data:`CHARS`."""
    tokens = list(SPECIALS) + list(CHARS)
    return {token: index for index, token in enumerate(tokens)}


def config_kwargs() -> dict[str, Any]:
    vocab = vocabulary()
    return {
        "vocab_size": len(vocab),
        "hidden_size": HIDDEN,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "max_position_embeddings": 2048,
        "bos_token_id": vocab["<s>"],
        "eos_token_id": vocab["</s>"],
        "pad_token_id": vocab["<pad>"],
        "tie_word_embeddings": False,
        "initializer_range": INIT_RANGE,
        "torch_dtype": "float32",
    }


def stamp_for(seed: int) -> dict[str, Any]:
    return {"recipe": RECIPE_VERSION, "seed": seed, "config": config_kwargs()}


def is_built(out: Path, seed: int) -> bool:
    path = out / STAMP
    if not path.exists() or not (out / "config.json").exists():
        return False
    try:
        return bool(json.loads(path.read_text()) == stamp_for(seed))
    except ValueError:
        return False


def build_tokenizer() -> Any:
    """The ``PreTrainedTokenizerFast`` described in the module docstring."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    core.add_special_tokens(list(SPECIALS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build(out: Path, seed: int = 0) -> bool:
    """Write the model and tokenizer to ``out``; False when it was already there."""
    if is_built(out, seed):
        return False
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    kwargs = config_kwargs()
    config = LlamaConfig(**kwargs)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for special in range(len(SPECIALS)):
            model.lm_head.weight[special].zero_()
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=kwargs["bos_token_id"],
        eos_token_id=kwargs["eos_token_id"],
        pad_token_id=kwargs["pad_token_id"],
    ).save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    (out / STAMP).write_text(json.dumps(stamp_for(seed), indent=1) + "\n")
    return True


def builds_here() -> bool:
    """Whether this Python builds the model itself: it was started by :func:`build_in_venv`,
    or it has torch."""
    return os.environ.get(HERE_ENV) == "1" or importlib.util.find_spec("torch") is not None


def build_in_venv(out: Path, seed: int = 0, venv: Path = DEFAULT_VENV) -> Path:
    """Build the model with ``venv``'s Python (it has torch): ``narwhal vllm tiny-model`` run
    there, from this checkout (``PYTHONPATH``), offline. ``out`` once built."""
    if is_built(out, seed):
        return out
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env[HERE_ENV] = "1"
    env.pop("VIRTUAL_ENV", None)
    command = [
        str(venv / "bin" / "python"), "-m", "narwhal.cli", "vllm", "tiny-model", str(out),
        "--seed", str(seed), "--venv", str(venv),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model failed:\n{done.stdout}\n{done.stderr}")
    return out
