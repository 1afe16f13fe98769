"""The agent fan-out cells' goodput against the number of tasks: where the gap to SGLang ``cache_aware`` comes from.

In the simulator's ``agent-fanout`` workload (docs/benchmarks.md) every request meets the SLO under both
litellm-kv and SGLang ``cache_aware``, so goodput there is the number of requests divided by the time from the
first arrival to the last completion: the makespan decides the cell. Both routers place the tasks (identical
8,000-token contexts with eight sub-calls each) evenly over the four replicas and keep every sub-call with its
context: litellm-kv on the replica sent the least work recently, SGLang on the smallest tree. Both break ties
between equal replicas in a fixed order, SGLang in its hash map's (the simulator's model of SGLang drew them at
random before 2026-12-07, and that lottery, not the routing, decided the cells whose last task ends a round).

This script runs the fan-out cells for several task counts (the cell itself has 40) and prints, per count and
load, litellm-kv's goodput and that of SGLang with its ties drawn at random (the earlier model) as ratios to
the better of SGLang and Dynamo, goodput averaged over the seeds as ``scan_cost_settings.py`` does, then each
router's TTFT p50 and p99 and mean end-to-end latency (means over the seeds). With ``--plot`` it draws the
ratios against the task count.

    .venv/bin/python benchmarks/fanout_task_count.py [--tasks 36-44] [--speeds 1,2,3] [--seeds 0-11] \\
        [--json PATH] [--plot PNG]

The simulator's results do not depend on the machine's speed (about 2 min with the defaults on this machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from litellm_kv.simulator.interface import Strategy
from litellm_kv.simulator.model import ThroughputModel
from litellm_kv.simulator.report import Summary, summarise
from litellm_kv.simulator.simulation import SimSettings, Simulation
from litellm_kv.simulator.strategies import STRATEGIES
from litellm_kv.simulator.workload import agent_fanout, scale_rate

REPLICAS = 4
BLOCK_SIZE = 64
SLO_TTFT_S, SLO_ITL_S = 2.0, 0.1  # the sweeps' SLO (scan_cost_settings.py)


ROUTERS: dict[str, Callable[[int], Strategy]] = {
    "sglang-cache-aware": lambda seed: STRATEGIES["sglang-cache-aware"](seed=seed),
    "dynamo": lambda seed: STRATEGIES["dynamo"](seed=seed),
    "litellm-kv": lambda seed: STRATEGIES["litellm-kv"](seed=seed),
    "sglang-random-ties": lambda seed: STRATEGIES["sglang-cache-aware"](seed=seed, random_ties=True),
}


def _span(text: str) -> list[int]:
    """``36-44`` or ``40,41,42``."""
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-", 1))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def _run(tasks: int, speed: float, seed: int) -> dict[str, Summary]:
    requests = scale_rate(agent_fanout(tasks=tasks, block_size=BLOCK_SIZE, seed=seed), speed)
    cfg = SimSettings(replicas=REPLICAS, block_size=BLOCK_SIZE, model=ThroughputModel(), seed=seed)

    async def one(name: str) -> Summary:
        outcomes = await Simulation(cfg, list(requests), ROUTERS[name](seed)).run()
        return summarise(name, outcomes, REPLICAS, SLO_TTFT_S, SLO_ITL_S, 0.0)

    async def every() -> dict[str, Summary]:
        return {name: await one(name) for name in ROUTERS}

    return asyncio.run(every())


def cell(tasks: int, speed: float, seeds: Sequence[int]) -> dict[str, Any]:
    """One (task count, load) cell over the seeds: goodput ratios and the latencies behind them."""
    runs = [_run(tasks, speed, seed) for seed in seeds]

    def mean(name: str, attr: str) -> float:
        return statistics.fmean(getattr(r[name], attr) for r in runs)

    best = max(mean("sglang-cache-aware", "goodput_rps"), mean("dynamo", "goodput_rps"))
    per_seed = [r["litellm-kv"].goodput_rps / max(r["sglang-cache-aware"].goodput_rps, r["dynamo"].goodput_rps)
                for r in runs]
    return {
        "tasks": tasks, "speed": speed, "seeds": list(seeds),
        "litellm_kv_ratio": mean("litellm-kv", "goodput_rps") / best,
        "litellm_kv_ratio_per_seed": per_seed,
        "sglang_random_ties_ratio": mean("sglang-random-ties", "goodput_rps") / best,
        "slo_attainment": {n: mean(n, "slo_attainment") for n in ("litellm-kv", "sglang-cache-aware")},
        "ttft_p50_s": {n: mean(n, "ttft_p50_s") for n in ("litellm-kv", "sglang-cache-aware")},
        "ttft_p99_s": {n: mean(n, "ttft_p99_s") for n in ("litellm-kv", "sglang-cache-aware")},
        "e2e_mean_s": {n: mean(n, "e2e_mean_s") for n in ("litellm-kv", "sglang-cache-aware")},
    }


def _plot(rows: list[dict[str, Any]], speeds: Sequence[float], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for i, speed in enumerate(speeds):
        mine = [r for r in rows if r["speed"] == speed]
        colour = f"C{i}"
        ax.plot([r["tasks"] for r in mine], [r["litellm_kv_ratio"] for r in mine], "o-", color=colour,
                label=f"litellm-kv, load ×{speed:g}")
        ax.plot([r["tasks"] for r in mine], [r["sglang_random_ties_ratio"] for r in mine], "x--", color=colour,
                alpha=0.6, label=f"SGLang, ties drawn at random, ×{speed:g}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel(f"tasks in the workload (8 sub-calls each, {REPLICAS} replicas; the sweep's cell has 40)")
    ax.set_ylabel("goodput / better of SGLang and Dynamo")
    ax.set_title("agent fan-out: SGLang's ties drawn at random win the runs that end a round")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="36-44", help="task counts: a range (36-44) or a list (40,41)")
    ap.add_argument("--speeds", default="1,2,3", help="arrival-rate multipliers (the sweep's cells: 1,2,3)")
    ap.add_argument("--seeds", default="0-11", help="workload and simulation seeds: a range or a list")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--plot", help="write a PNG of the ratios against the task count here")
    args = ap.parse_args(argv)
    counts, seeds = _span(args.tasks), _span(args.seeds)
    speeds = [float(x) for x in args.speeds.split(",")]
    if not counts or not seeds or not speeds or min(counts) < 1 or min(speeds) <= 0:
        ap.error("--tasks, --speeds and --seeds need at least one value each; tasks >= 1, speeds > 0")
    print(f"{len(counts)} task counts × {len(speeds)} loads × {len(seeds)} seeds × {len(ROUTERS)} routers; "
          f"ratios to the better of SGLang and Dynamo (goodput averaged over the seeds)", flush=True)
    print("tasks  load  litellm-kv (seeds min-max) SGLang random ties | TTFT p50 kv/SGLang  p99 kv/SGLang  "
          "e2e mean kv/SGLang (s)", flush=True)
    rows = []
    for speed in speeds:
        for tasks in counts:
            row = cell(tasks, speed, seeds)
            rows.append(row)
            lo, hi = min(row["litellm_kv_ratio_per_seed"]), max(row["litellm_kv_ratio_per_seed"])
            t50, t99, e2e = row["ttft_p50_s"], row["ttft_p99_s"], row["e2e_mean_s"]
            print(f"{tasks:5d}  ×{speed:<3g} {row['litellm_kv_ratio']:7.3f} ({lo:.3f}-{hi:.3f})"
                  f"        {row['sglang_random_ties_ratio']:7.3f}      | {t50['litellm-kv']:.3f}/"
                  f"{t50['sglang-cache-aware']:.3f}       {t99['litellm-kv']:.3f}/{t99['sglang-cache-aware']:.3f}"
                  f"    {e2e['litellm-kv']:.2f}/{e2e['sglang-cache-aware']:.2f}", flush=True)
    for speed in speeds:
        mine = [r["litellm_kv_ratio"] for r in rows if r["speed"] == speed]
        drawn = [r["sglang_random_ties_ratio"] for r in rows if r["speed"] == speed]
        print(f"load ×{speed:g}: litellm-kv mean over the task counts {statistics.fmean(mine):.3f} "
              f"(min {min(mine):.3f}, max {max(mine):.3f}); SGLang with random ties {statistics.fmean(drawn):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.plot:
        _plot(rows, speeds, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
