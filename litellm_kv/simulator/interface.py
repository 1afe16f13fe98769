"""What the simulated fleet and a routing strategy see of each other.

:class:`~litellm_kv.simulator.simulation.Simulation` drives a :class:`Strategy` and shows it every
replica's :class:`Gauges`; :mod:`litellm_kv.simulator.strategies` implements the strategies. Both
import this module, neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from litellm_kv.simulator.workload import SimRequest


@dataclass(slots=True)
class Gauges:
    """What a router scraping /metrics sees (refreshed every scrape interval)."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    # Cumulative histogram sums and counts, observed when a request finishes (as vLLM does):
    prefill_s_sum: float = 0.0  # vllm:request_prefill_time_seconds
    prefill_count: int = 0
    prefill_tokens_sum: int = 0  # vllm:request_prefill_kv_computed_tokens
    itl_s_sum: float = 0.0  # vllm:inter_token_latency_seconds
    itl_count: int = 0
    output_tokens_sum: int = 0  # vllm:request_generation_tokens


class Strategy(Protocol):
    """A router under test, as the simulation calls it."""

    name: str
    listens_to_events: bool
    """True: the simulation sends it every replica's KV-event batches (:meth:`on_kv_events`)."""

    async def start(self, replicas: list[str], block_size: int, clock: Callable[[], float]) -> None:
        """Before the first request: the replica names (index = replica number) and the sim clock."""

    async def route(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        """The replica number for ``req`` and the hit tokens predicted there (-1: no prediction)."""

    async def on_kv_events(self, replica: str, payload: bytes) -> None:
        """One vLLM ``KVEventBatch`` msgpack payload of ``replica``."""

    def on_scrape(self) -> None:
        """Every replica's gauges were just scraped (the ``Gauges`` given to :meth:`route` changed)."""

    async def on_first_token(self, req: SimRequest, idx: int) -> None: ...

    async def on_finish(self, req: SimRequest, idx: int) -> None: ...
