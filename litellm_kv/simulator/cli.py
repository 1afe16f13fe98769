"""``litellm-kv bench ...``: trace replay against the field's routing strategies.

    litellm-kv bench replay --trace conversation_trace.jsonl --replicas 8 --speed 4
    litellm-kv bench replay --workload shared-prefix --strategies litellm-kv,dynamo,least-loaded
    litellm-kv bench sweep-load --trace T --speeds 1,2,4,8 --plot docs/img/load.png
    litellm-kv bench sweep-fleet --trace T --sizes 2,4,8,16 --plot docs/img/fleet.png
    litellm-kv bench knee --trace T    # load where round-robin's p99 TTFT doubles
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

from litellm_kv.simulator.model import ThroughputModel
from litellm_kv.simulator.report import Summary, plot_bars, plot_sweep, table, write_json
from litellm_kv.simulator.runner import ALL, Slo, fleet_sweep, knee, load_sweep, run_all
from litellm_kv.simulator.simulation import SimSettings
from litellm_kv.simulator.workload import GENERATORS, SimRequest, load_mooncake, scale_rate


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="litellm-kv bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("replay", "sweep-load", "sweep-fleet", "knee"):
        s = sub.add_parser(name)
        src = s.add_mutually_exclusive_group(required=True)
        src.add_argument("--trace", help="Mooncake-format JSONL trace")
        src.add_argument("--workload", choices=sorted(GENERATORS), help="synthetic workload generator")
        s.add_argument("--limit", type=int, help="first N trace requests only")
        s.add_argument("--replicas", type=int, default=8)
        s.add_argument("--block-size", type=int, default=64,
                       help="KV block size of the simulated engines (divides 512; default 64)")
        s.add_argument("--capacity-blocks", type=int, default=0,
                       help="KV blocks per replica (default: derived from the throughput model)")
        s.add_argument("--speed", type=float, default=1.0, help="arrival-rate multiplier")
        s.add_argument("--strategies", default=",".join(ALL), help="comma-separated; default: all")
        s.add_argument("--slo-ttft", type=float, default=2.0, help="goodput SLO on TTFT, seconds")
        s.add_argument("--slo-itl", type=float, default=0.1, help="goodput SLO on inter-token latency, s")
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--event-tokens", action="store_true",
                       help="put stand-in token ids into BlockStored events (as engines do; slower)")
        s.add_argument("--json", help="write the results here")
        s.add_argument("--plot", help="write a PNG here")
        if name == "sweep-load" or name == "knee":
            s.add_argument("--speeds", type=_floats, default=[1, 2, 3, 4, 6, 8])
        if name == "sweep-fleet":
            s.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")], default=[2, 4, 8, 16])
            s.add_argument("--fixed-load", action="store_true",
                           help="keep the request rate fixed instead of scaling it with the fleet")
    return p


def _requests(a: argparse.Namespace) -> list[SimRequest]:
    if a.trace:
        return load_mooncake(a.trace, a.block_size, limit=a.limit, speed=a.speed)
    reqs = GENERATORS[a.workload](block_size=a.block_size, seed=a.seed)
    return scale_rate(reqs, a.speed) if a.speed != 1.0 else reqs


def _progress(row: Summary) -> None:
    print(f"  {row.strategy:<30} hit {100 * row.hit_ratio:5.1f}%  p99 TTFT {row.ttft_p99_s:8.3f}s  "
          f"goodput {row.goodput_rps:6.2f}/s  ({row.wall_s:.1f}s)", file=sys.stderr, flush=True)


def cli_main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if getattr(a, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        # Said before the simulation runs, not after minutes of it.
        print("litellm-kv bench: --plot needs matplotlib: install litellm-kv with its `bench` extra "
              "(pip install '<checkout or wheel>[bench]', docs/install.md)", file=sys.stderr)
        return 2
    cfg = SimSettings(replicas=a.replicas, block_size=a.block_size,
                    model=ThroughputModel(capacity_blocks=a.capacity_blocks), seed=a.seed,
                    event_tokens=a.event_tokens)
    slo = Slo(a.slo_ttft, a.slo_itl)
    names = [n for n in a.strategies.split(",") if n]
    reqs = _requests(a)
    src = a.trace or a.workload
    t0 = time.perf_counter()
    print(f"{len(reqs)} requests from {src}, {a.replicas} replicas, block size {a.block_size}, "
          f"{cfg.model.blocks(a.block_size)} KV blocks per replica, speed ×{a.speed}", file=sys.stderr)
    payload: dict[str, object] = {"source": src, "replicas": a.replicas, "block_size": a.block_size,
                                  "speed": a.speed, "slo": asdict(slo), "model": asdict(cfg.model)}
    if a.cmd == "replay":
        rows = run_all(reqs, cfg, names, slo, _progress)
        print(table(rows))
        payload["results"] = rows
        if a.plot:
            plot_bars(a.plot, rows, f"{src}: {a.replicas} replicas, speed ×{a.speed}")
    elif a.cmd == "sweep-load":
        series = load_sweep(reqs, cfg, names, slo, a.speeds, _progress)
        for s, at_s in zip(a.speeds, zip(*series.values(), strict=True), strict=True):
            print(f"\nspeed ×{s * a.speed:g}\n{table(at_s)}")
        payload["speeds"] = a.speeds
        payload["results"] = series
        if a.plot:
            plot_sweep(a.plot, "arrival-rate multiplier", [s * a.speed for s in a.speeds], series,
                       f"load sweep: {src}, {a.replicas} replicas")
    elif a.cmd == "sweep-fleet":
        series = fleet_sweep(reqs, cfg, names, slo, a.sizes, not a.fixed_load, _progress)
        for n, at_n in zip(a.sizes, zip(*series.values(), strict=True), strict=True):
            print(f"\n{n} replicas\n{table(at_n)}")
        payload["sizes"] = a.sizes
        payload["results"] = series
        if a.plot:
            plot_sweep(a.plot, "replicas", a.sizes, series,
                       f"fleet sweep: {src}" + (" (fixed rate)" if a.fixed_load else " (rate ∝ replicas)"))
    else:
        speed, points = knee(reqs, cfg, slo, a.speeds)
        for s, p99 in points:
            print(f"speed ×{s * a.speed:g}: round-robin p99 TTFT {p99:.3f}s")
        print(f"knee: ×{speed * a.speed:g}")
        payload["knee"] = speed * a.speed
        payload["points"] = points
    print(f"wall time {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    if a.json:
        write_json(a.json, payload)
    return 0
