"""Trace replay: litellm-kv against the field's routers on the Mooncake conversation trace.

Finds the load where round-robin's p99 TTFT first exceeds 2× its unloaded value, replays the
whole trace there with every strategy, and prints each one's figures and its ratios to
round-robin, least-loaded and Dynamo (same run). ~5 min on 2 cores.

    .venv/bin/python benchmarks/bench_replay.py [--trace PATH] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from litellm_kv.simulator.report import table
from litellm_kv.simulator.runner import ALL, Slo, knee, run_all
from litellm_kv.simulator.simulation import SimSettings
from litellm_kv.simulator.workload import load_mooncake, scale_rate

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/data/traces/conversation_trace.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--limit", type=int)
    ap.add_argument("--replicas", type=int, default=8)
    a = ap.parse_args()
    cfg = SimSettings(replicas=a.replicas, block_size=64)
    slo = Slo()
    reqs = load_mooncake(a.trace, 64, limit=a.limit)
    speed, points = knee(reqs, cfg, slo, [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0])
    for s, p99 in points:
        print(f"round-robin at ×{s:g}: p99 TTFT {p99:.2f} s")
    print(f"knee (p99 > 2× unloaded): ×{speed:g}\n")
    rows = run_all(scale_rate(reqs, speed), cfg, ALL, slo,
                   lambda r: print(f"  {r.strategy} done ({r.wall_s:.0f} s)", file=sys.stderr))
    print(table(rows))
    by = {r.strategy: r for r in rows}
    kv = by["litellm-kv"]
    for base in ("round-robin", "least-loaded", "dynamo"):
        b = by[base]
        print(f"litellm-kv vs {base}: goodput ×{kv.goodput_rps / b.goodput_rps:.2f}, "
              f"p99 TTFT ×{kv.ttft_p99_s / b.ttft_p99_s:.2f}, hit ratio {100 * kv.hit_ratio:.1f}% vs "
              f"{100 * b.hit_ratio:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
