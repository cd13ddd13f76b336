"""An engine step's time from a per-operator profile: what the GPU runs for this batch.

Rule kept here: a dense decoder step runs the embedding and the final norm once, every decoder
layer's operators once per layer (its norm twice: before attention and before the MLP), each on
the step's tokens, the attention on the step's mix of prefill chunks and decodes, and the LM head
and sampler on one row per scheduled sequence (vLLM computes logits only at each sequence's last
scheduled token). Each operator's time is read from its measured table (:mod:`.tables`).
CUDA graphs, as vLLM's default ``FULL_AND_PIECEWISE`` mode runs them: a step of at most the
largest capture size runs padded to the next capture size, so its token-wise operators cost
what the padded batch costs; attention is priced at the real sequences (a padded slot holds no
KV, so it adds no attention work). Decodes of unequal contexts cost more attention than as many of
their mean context (the varlen kernel's tiles and SM imbalance): the profile measures how much,
as the share ``alpha`` of the way from the mean-context time to the longest-context time, in two
regimes that differ severalfold: decodes alone, and decodes beside a prefill chunk (LLMServingSim's
``pure`` and ``mixed`` rows). Each regime's alpha is pooled over its own rows
(:func:`skew_alphas`), and a step adds the share of its own regime: a pooled value over both
would be the mixed rows' (they are nearly all of the sweep) and overprice decode-only steps,
which are most steps. Nothing here is fitted to a run: every number is the profile's, the
capture sizes are vLLM's rule for the engine's settings (:func:`capture_sizes`).

Theory of operation: the token-wise operators are summed once into two curves (per layer, per
step), so a step costs two curve lookups, one attention lookup and two head lookups. Several
prefill chunks in one step are looked up as one chunk of their total tokens, with the cached
context that gives the same query-key pairs as the chunks have between them (the attention's
work), so no chunk mix is priced twice.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from narwhal.sim.profiles.tables import AdditiveAttention, AttentionGrid, Curve

# operators a step runs once, not once per layer (vLLM's model runner: embedding, final norm)
ONCE_PER_STEP = frozenset({"embedding", "final_layernorm"})
# the decoder layer's RMSNorm runs twice per layer: input_layernorm, post_attention_layernorm
TWICE_PER_LAYER = frozenset({"layernorm"})


def capture_sizes(max_num_seqs: int, max_size: int | None = None) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes (``CompilationConfig``): 1, 2, 4, then every 8 up
    to 256, then every 16, up to ``max_cudagraph_capture_size`` (default ``min(2 x
    max_num_seqs, 512)``)."""
    top = min(2 * max_num_seqs, 512) if max_size is None else max_size
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return tuple(s for s in sizes if s <= top)


def pooled_skew_alpha(rows: list[tuple[float, float, float]]) -> float:
    """The one ``alpha`` that best explains a set of skewed batches, from (mean-context
    time, longest-context time, measured skewed time) each: least squares of ``skewed - mean =
    alpha x (longest - mean)`` through the origin (over all of a profile's rows this is
    LLMServingSim's pooled value: 0.0543 for Llama-3.1-8B on the RTX PRO 6000, as its meta.yaml
    states)."""
    num = sum((skewed - t_mean) * (t_max - t_mean) for t_mean, t_max, skewed in rows)
    den = sum((t_max - t_mean) ** 2 for t_mean, t_max, _ in rows)
    return num / den if den > 0 else 0.0


@dataclass(frozen=True)
class SkewAlpha:
    """The skew share of each regime: a decode-only step's, and a step with a prefill chunk's
    (0: the profile measured no skew there)."""

    decode: float = 0.0
    mixed: float = 0.0


def skew_alphas(rows: list[tuple[float, float, float, float]]) -> SkewAlpha:
    """Each regime's pooled alpha from a profile's skewed batches, (prefill chunk tokens,
    mean-context time, longest-context time, measured skewed time) each: chunk 0 is a
    decode-only batch."""
    return SkewAlpha(
        decode=pooled_skew_alpha([(m, x, s) for chunk, m, x, s in rows if chunk == 0]),
        mixed=pooled_skew_alpha([(m, x, s) for chunk, m, x, s in rows if chunk > 0]),
    )


@dataclass(frozen=True)
class LayerOps:
    """A profile's token-wise operators folded into the two sums a step needs."""

    per_layer: Curve  # every per-layer operator at T tokens, summed (seconds)
    per_step: Curve  # the once-per-step operators at T tokens (seconds)
    lm_head: Curve  # at R rows
    sampler: Curve  # at R rows


def fold_ops(dense: dict[str, Curve], per_sequence: dict[str, Curve]) -> LayerOps:
    """Sum the token-wise operators onto the union of their measured sizes (a profile that did
    not measure the sampler, as LLMServingSim's older layout, gets none: its import says so)."""
    if "lm_head" not in per_sequence:
        raise ValueError("the profile has no 'lm_head' in per_sequence")
    sizes = sorted({s for curve in dense.values() for s in curve.sizes})
    layer_points = []
    step_points = []
    for size in sizes:
        layer = 0.0
        once = 0.0
        for name, curve in dense.items():
            if name in ONCE_PER_STEP:
                once += curve.at(size)
            else:
                layer += curve.at(size) * (2 if name in TWICE_PER_LAYER else 1)
        layer_points.append((size, layer))
        step_points.append((size, once))
    return LayerOps(
        per_layer=Curve(layer_points),
        per_step=Curve(step_points),
        lm_head=per_sequence["lm_head"],
        sampler=per_sequence.get("sampler", Curve([(1.0, 0.0)])),
    )


class OperatorStepTiming:
    """A :class:`~narwhal.sim.timing.StepTiming` reading a per-operator profile."""

    def __init__(
        self,
        ops: LayerOps,
        attention: AttentionGrid | AdditiveAttention,
        layers: int,
        kv_bytes_per_token: int,
        graph_sizes: tuple[int, ...] = (),
        skew: SkewAlpha = SkewAlpha(),
    ) -> None:
        self.ops = ops
        self.skew = skew
        self.attention = attention
        self.layers = layers
        self._kv_bytes_per_token = kv_bytes_per_token
        self.graph_sizes = graph_sizes  # empty: eager (no CUDA graphs)
        self.graph_max = graph_sizes[-1] if graph_sizes else 0

    @property
    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes_per_token

    @property
    def reads_longest_context(self) -> bool:
        return self.skew.decode > 0 or self.skew.mixed > 0

    def padded(self, tokens: int) -> int:
        """The batch size a CUDA graph runs ``tokens`` at (``tokens`` itself when eager)."""
        if tokens > self.graph_max:
            return tokens
        return self.graph_sizes[bisect_left(self.graph_sizes, tokens)]

    def batch_s(
        self,
        decodes: int,
        prefill_tokens: int,
        decode_context: int,
        prefill_pairs: float,
        prefill_seqs: int = 0,
        longest_context: int = 0,
    ) -> float:
        tokens = decodes + prefill_tokens
        if tokens <= 0:
            return 0.0
        run = self.padded(tokens)
        ops = self.ops
        seconds = self.layers * ops.per_layer.at(run) + ops.per_step.at(run)
        mean_ctx = decode_context / decodes if decodes else 0.0
        if prefill_tokens:
            cached = max(0.0, prefill_pairs / prefill_tokens - prefill_tokens / 2)
        else:
            cached = 0.0
        attention = self.attention
        per_layer = attention.at(prefill_tokens, cached, decodes, mean_ctx)
        alpha = self.skew.mixed if prefill_tokens else self.skew.decode
        if alpha and longest_context > mean_ctx:
            longest = attention.at(prefill_tokens, cached, decodes, longest_context)
            if longest > per_layer:
                per_layer += alpha * (longest - per_layer)
        seconds += self.layers * per_layer
        rows = decodes + prefill_seqs
        return seconds + ops.lm_head.at(rows) + ops.sampler.at(rows)
