"""Capped exponential backoff with jitter, so a fleet of agents does not reconnect in lockstep."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    initial_seconds: float = 0.5
    max_seconds: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.5  # each delay is shortened by up to this fraction, at random
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (0-based)."""
        base = min(self.max_seconds, self.initial_seconds * self.multiplier ** min(attempt, 64))
        return base * (1.0 - self.jitter * self.rng.random())
