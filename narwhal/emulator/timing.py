"""The emulator's engine timing model (pluggable).

Rule kept here: the emulator asks a :class:`TimingModel` how long each step takes and never
hard-codes a duration, so the same model can time the emulator and the simulator.

Theory of operation: :class:`LinearTiming` is the simplest useful model: a fixed overhead plus
seconds per prompt token for prefill, seconds per generated token for decode, and seconds per
token for a KV pull. Any object with these three methods can replace it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class TimingModel(Protocol):
    def prefill_s(self, prompt_tokens: int) -> float: ...

    def decode_token_s(self, context_tokens: int) -> float: ...

    def kv_transfer_s(self, tokens: int) -> float: ...


@dataclass(frozen=True)
class LinearTiming:
    """Durations linear in token counts (all zero: as fast as the event loop goes)."""

    prefill_s_per_token: float = 0.0
    decode_s_per_token: float = 0.0
    kv_s_per_token: float = 0.0
    overhead_s: float = 0.0

    def prefill_s(self, prompt_tokens: int) -> float:
        return self.overhead_s + self.prefill_s_per_token * prompt_tokens

    def decode_token_s(self, context_tokens: int) -> float:
        return self.decode_s_per_token

    def kv_transfer_s(self, tokens: int) -> float:
        return self.kv_s_per_token * tokens
