"""What a step costs beyond the GPU work: host overhead that grows with the batch, and noise
from a stated distribution with stragglers.

Rule kept here: one step of modelled GPU time ``g`` that schedules ``n`` sequences and ``t``
tokens takes

    (g + base + per_seq * n + per_token * t) * S * (1 + j * (2 V - 1))

where ``V`` is uniform on [0, 1) and ``S`` is ``straggler_factor`` with probability
``straggler_rate`` and 1 otherwise, ``V`` independent of ``S``: a uniform ``±j`` body
(``jitter``) with a straggler tail. Both come from *one* uniform draw ``U`` per step: ``U < p``
is a straggler, and ``V`` is ``U`` rescaled within its side (``U / p`` or ``(U - p) / (1 - p)``),
itself uniform. With ``p = 0`` that is ``V = U``, so the default (2 ms base, no slopes, ``±5%``,
no stragglers) draws the same numbers and gives the same floats as a flat overhead with uniform
jitter. No draw is taken when there is no noise at all (``j = 0`` and ``p = 0``).

Theory of operation: :class:`StepCost` is built once per engine process from its
:class:`~narwhal.sim.gpu.params.EngineParams`; :meth:`StepCost.seconds` is on the hot path (one
call per step): arithmetic and at most one draw.
"""

from __future__ import annotations

import random

from narwhal.sim.gpu.params import EngineParams


class StepCost:
    """Host overhead and noise of one engine's steps (see the module docstring)."""

    def __init__(self, params: EngineParams) -> None:
        self.base_s = params.step_overhead_s
        self.per_seq_s = params.step_overhead_per_seq_s
        self.per_token_s = params.step_overhead_per_token_s
        self.jitter = params.jitter
        self.rate = params.straggler_rate
        self.factor = params.straggler_factor
        self.noisy = params.jitter > 0 or params.straggler_rate > 0

    def seconds(self, gpu_s: float, seqs: int, tokens: int, rng: random.Random) -> float:
        """The step's duration: ``gpu_s`` of modelled GPU work for ``seqs`` sequences and
        ``tokens`` tokens, plus host overhead, times the noise (one draw from ``rng``)."""
        dt = gpu_s + self.base_s + self.per_seq_s * seqs + self.per_token_s * tokens
        if not self.noisy:
            return dt
        u = rng.random()
        rate = self.rate
        if rate <= 0:
            return dt * (1.0 + self.jitter * (2.0 * u - 1.0))
        if u < rate:
            return dt * self.factor * (1.0 + self.jitter * (2.0 * (u / rate) - 1.0))
        return dt * (1.0 + self.jitter * (2.0 * ((u - rate) / (1.0 - rate)) - 1.0))
