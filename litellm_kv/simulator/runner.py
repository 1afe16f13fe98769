"""Running strategies over a workload: one run, load sweeps, fleet-size sweeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from litellm_kv.simulator.interface import Strategy
from litellm_kv.simulator.report import Summary, summarise
from litellm_kv.simulator.simulation import SimSettings, Simulation
from litellm_kv.simulator.strategies import STRATEGIES
from litellm_kv.simulator.workload import SimRequest, scale_rate

ALL = list(STRATEGIES)


@dataclass(slots=True)
class Slo:
    ttft_s: float = 2.0
    itl_s: float = 0.1


def make(name: str, seed: int) -> Strategy:
    try:
        return STRATEGIES[name](seed=seed)
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None


async def run_one(requests: Sequence[SimRequest], cfg: SimSettings, name: str, slo: Slo,
                  factory: Callable[[str, int], Strategy] = make) -> tuple[Summary, Strategy]:
    strategy = factory(name, cfg.seed)
    t0 = time.perf_counter()
    outcomes = await Simulation(cfg, list(requests), strategy).run()
    wall = time.perf_counter() - t0
    return summarise(name, outcomes, cfg.replicas, slo.ttft_s, slo.itl_s, wall), strategy


def run_all(requests: Sequence[SimRequest], cfg: SimSettings, names: Sequence[str], slo: Slo,
            progress: Callable[[Summary], None] | None = None) -> list[Summary]:
    async def go() -> list[Summary]:
        rows = []
        for n in names:
            row, _ = await run_one(requests, cfg, n, slo)
            if progress:
                progress(row)
            rows.append(row)
        return rows

    return asyncio.run(go())


def load_sweep(requests: Sequence[SimRequest], cfg: SimSettings, names: Sequence[str], slo: Slo,
               speeds: Sequence[float], progress: Callable[[Summary], None] | None = None
               ) -> dict[str, list[Summary]]:
    out: dict[str, list[Summary]] = {n: [] for n in names}
    for s in speeds:
        for row in run_all(scale_rate(list(requests), s), cfg, names, slo, progress):
            out[row.strategy].append(row)
    return out


def fleet_sweep(requests: Sequence[SimRequest], cfg: SimSettings, names: Sequence[str], slo: Slo,
                sizes: Sequence[int], scale_load: bool = True,
                progress: Callable[[Summary], None] | None = None) -> dict[str, list[Summary]]:
    """``scale_load``: the request rate grows with the fleet (same load per replica)."""
    out: dict[str, list[Summary]] = {n: [] for n in names}
    for n_rep in sizes:
        reqs = scale_rate(list(requests), n_rep / cfg.replicas) if scale_load else list(requests)
        for row in run_all(reqs, replace(cfg, replicas=n_rep), names, slo, progress):
            out[row.strategy].append(row)
    return out


def knee(requests: Sequence[SimRequest], cfg: SimSettings, slo: Slo, speeds: Sequence[float],
         factor: float = 2.0, strategy: str = "round-robin") -> tuple[float, list[tuple[float, float]]]:
    """The first speed at which ``strategy``'s p99 TTFT exceeds ``factor`` × its value at the
    first (unloaded) speed; returns it and the (speed, p99) points measured."""
    points: list[tuple[float, float]] = []
    base = None
    for s in speeds:
        (row,) = run_all(scale_rate(list(requests), s), cfg, [strategy], slo)
        points.append((s, row.ttft_p99_s))
        if base is None:
            base = row.ttft_p99_s
        elif row.ttft_p99_s > factor * base:
            return s, points
    return speeds[-1], points
