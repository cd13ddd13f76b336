"""A model's shape as the memory and communication rules need it: sizes, not timings.

Rule kept here: every byte count of a model (its weights, its KV cache per token, the tensors an
all-reduce moves) is computed here once, from the profile's ``config`` of that model
(``data/h200_profile.json``: hidden, heads, kv_heads, head_dim, inter, layers, vocab, tp), in
bf16 (2 bytes, the dtype the profile was measured in), per tensor-parallel rank as vLLM shards it.

Theory of operation: a Llama-shaped decoder layer holds the attention projections
(``hidden x head_dim x (2 heads + 2 kv_heads)``) and the gated MLP (``3 x hidden x inter``),
both split across ``tp`` ranks; the embedding and the untied LM head (``vocab x hidden`` each)
are split by vocabulary (vLLM's ``VocabParallelEmbedding``/``ParallelLMHead``). Each rank keeps
``kv_heads / tp`` KV heads (at least one: vLLM replicates KV heads when ``tp > kv_heads``).
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal.sim.timing import load_profile

BF16_BYTES = 2


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    layers: int
    vocab: int
    tp: int
    dtype_bytes: int = BF16_BYTES

    @property
    def weight_bytes_per_rank(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.inter
        params = (self.layers * (attn + mlp) + 2 * self.vocab * self.hidden) // self.tp
        return params * self.dtype_bytes

    @property
    def kv_heads_per_rank(self) -> int:
        return max(1, self.kv_heads // self.tp)

    @property
    def kv_bytes_per_token_per_rank(self) -> int:
        """K and V of one token in every layer, on one rank."""
        return 2 * self.layers * self.kv_heads_per_rank * self.head_dim * self.dtype_bytes


def model_shape(model: str) -> ModelShape:
    """The shape of ``model`` (a key of the profile's ``models``)."""
    cfg = load_profile()["models"][model]["config"]
    return ModelShape(
        name=model,
        hidden=int(cfg["hidden"]),
        heads=int(cfg["heads"]),
        kv_heads=int(cfg["kv_heads"]),
        head_dim=int(cfg["head_dim"]),
        inter=int(cfg["inter"]),
        layers=int(cfg["layers"]),
        vocab=int(cfg["vocab"]),
        tp=int(cfg["tp"]),
    )
