"""Reconnect delays for PSC links and the Consul watcher: capped exponential backoff with jitter."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """Reconnect delays: about ``initial`` seconds, growing by ``factor`` up to ``max_delay``.

    Each delay is spread by +/- ``jitter`` (a fraction) so that a cluster
    restarting together does not reconnect in lock step. The attempt count
    resets after a successful PSC handshake.
    """

    initial: float = 1.0
    factor: float = 1.5
    max_delay: float = 10.0
    jitter: float = 0.2

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before attempt number ``attempt`` (1-based)."""
        base = min(self.initial * self.factor ** max(0, min(attempt - 1, 64)), self.max_delay)
        return base * (1.0 - self.jitter + 2.0 * self.jitter * rand())
