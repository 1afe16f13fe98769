"""In-flight attempts per deployment in this process, and when each deployment last failed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NewType

DeploymentId = NewType("DeploymentId", str)
Clock = Callable[[], float]


class InFlightCounter:
    """In-flight attempts per deployment (this process) and the time each deployment last failed."""

    def __init__(self, clock: Clock = time.monotonic, stale_after: float = 900.0) -> None:
        self.clock = clock
        self.stale_after = stale_after
        self._attempts: dict[str, tuple[DeploymentId, float]] = {}
        self._in_flight: dict[DeploymentId, int] = {}
        self._failed_at: dict[DeploymentId, float] = {}

    def start(self, attempt: str, deployment: DeploymentId) -> None:
        self.finish(attempt)
        self._attempts[attempt] = (deployment, self.clock())
        self._in_flight[deployment] = self._in_flight.get(deployment, 0) + 1
        if len(self._attempts) % 256 == 0:
            self._sweep()

    def finish(self, attempt: str) -> DeploymentId | None:
        entry = self._attempts.pop(attempt, None)
        if entry is None:
            return None
        dep = entry[0]
        self._in_flight[dep] = max(0, self._in_flight.get(dep, 0) - 1)
        return dep

    def _sweep(self) -> None:
        # An attempt whose end we never saw (a hook LiteLLM skipped) must not count forever.
        cutoff = self.clock() - self.stale_after
        for attempt in [a for a, (_, t) in self._attempts.items() if t < cutoff]:
            self.finish(attempt)

    def in_flight(self, deployment: DeploymentId) -> int:
        return self._in_flight.get(deployment, 0)

    def failed(self, deployment: DeploymentId) -> None:
        self._failed_at[deployment] = self.clock()

    def recently_failed(self, deployment: DeploymentId, window: float) -> bool:
        t = self._failed_at.get(deployment)
        return t is not None and self.clock() - t < window
