"""Does routing win on time? The TTFT must-show sweep on the real fleet.

Two real vLLM CPU replicas serving the ``ttft`` model (shaped like GPU serving: prefilling 1,024 uncached
tokens costs several decode steps; ``benchmarks/bench_engine_shape.py``), one real LiteLLM proxy routing
the same replicas three ways: LiteLLM ``simple-shuffle``, LiteLLM ``least-busy`` and litellm-kv with its
defaults (``tools/harness/testbed.py``). Workloads from the field (``tools/harness/field.py``), open loop
(Poisson arrivals), streamed, TTFT at the first content chunk:

* ``chat`` (a): llm-d's capacity shape scaled down (groups of users sharing a long system prompt, multi-turn);
* ``fanout`` (b): agentic fan-out (a lead call over a fresh long context, then parallel sub-calls over it);
* ``unique`` (c): the control, where no routing can win;
* ``images`` (d), with ``--vl``: image conversations on replicas of the tiny Qwen2.5-VL model (whose text
  backbone is the ``ttft`` model's), every group with a vision section, litellm-kv routing images by cache.

Load levels are fractions of what the fleet serves without any cache hit, measured at start-up
(``--loads 0.5,0.9``: moderate and high). In every cell each routing runs ``--runs`` times in
A-B-C-C-B-A-A-B-C order with every prefix cache emptied before each run, so drift and the other work
on this machine hit all three alike. Per cell: pooled TTFT mean/p50/p95, the spread over runs (min-max
of the per-run mean and p95), end-to-end latency, output tokens/s, cached-token ratio, litellm-kv's
prediction checks, TTFT split by the engine's cached share (``hit``: at least half the prompt cached, ``miss``:
less), the CPU seconds a run cost each part of the testbed (the engines' compute, the engines' API servers, the
proxy, this load generator: on one machine they share its cores, where a GPU fleet's devices do not wait for the
proxy), and the verdict of the must-show (litellm-kv's pooled TTFT mean and p95 below both
baselines on (a) and (b), and whether beyond the noise: its run-by-run difference from each baseline below zero by
more than two standard errors; on (c) within noise of least-busy: the difference no larger than the spread of
least-busy's own per-run means). When litellm-kv predicts TTFT, the median and p90
absolute error of the prediction against the TTFT the proxy measured (decision to first content chunk), over
the cell's streamed responses one by one (``GET /litellm-kv/health?ttft_errors_since=N``). And run by run,
litellm-kv's per-run TTFT mean and p95 minus each baseline's run of the same A-B-C block (mean difference, its
sd and standard error, in how many runs litellm-kv was lower): pairing the runs takes the machine's drift
between blocks out of the comparison.

    .venv/bin/python benchmarks/bench_ttft.py [--workloads chat,fanout,unique] [--loads 0.5,0.9] \\
        [--runs 3] [--json PATH] [--markdown PATH] [--plot-dir docs/img]

``--pool A.json B.json ...`` runs nothing: it merges earlier runs' ``--json`` files by cell (workload and load
fraction, or the rate where runs were made with ``--rates``) and prints the pooled figures, run-by-run differences
and verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.hashing import BlockHasher
from litellm_kv.vllm.tokenization import LocalChatTokenizer
from tools.demo import plot
from tools.harness import field
from tools.harness.testbed import (
    CPU_PARTS,
    KV,
    LABELS,
    LEAST_BUSY,
    ROUTINGS,
    SHUFFLE,
    Comparison,
    abc_cba,
    abs_error,
    fleet_speed,
    format_cpu,
    label_counts,
    start_testbed,
)

# Workload sizes for the testbed's 16 MiB caches (512 blocks of 32 tokens per replica).
SIZES: dict[str, dict[str, Any]] = {
    "chat": {"groups": 8, "users_per_group": 2, "turns": 2, "system_tokens": 2500, "user_tokens": 120,
             "reply_tokens": 40},
    "fanout": {"tasks": 5, "fanout": 4, "context_tokens": 4000, "sub_tokens": 100},
    "unique": {"n": 16, "prompt_tokens": 2500},
    # The vision-language testbed (--vl): 8 MiB caches (256 blocks of 32 tokens per replica); ~1.1K tokens per
    # conversation, most of them the image's.
    "images": {"conversations": 12, "turns": 3, "user_tokens": 60, "reply_tokens": 30},
}
DECISIONS_METRIC = "litellm_kv_routing_decisions_total"


def decision_reasons(delta: dict[str, float]) -> dict[str, int]:
    """litellm-kv's decisions in one run by reason (cache, load, unique, imbalance, fallback), from the delta of
    its decisions counter for the KV group."""
    return dict(sorted(label_counts(delta, DECISIONS_METRIC + "{", "reason", f'model_group="{KV}"').items()))


def paired(kv: list[float], base: list[float]) -> dict[str, Any]:
    """litellm-kv's per-run figure minus a baseline's, run i against run i: the two ran in the same A-B-C block, so
    drift of the machine between blocks cancels. The mean difference, its spread (sd) and standard error, and in
    how many of the runs litellm-kv was lower."""
    d = [a - b for a, b in zip(kv, base, strict=True)]
    sd = statistics.stdev(d) if len(d) > 1 else 0.0
    return {"mean_ms": round(statistics.fmean(d), 1), "sd_ms": round(sd, 1), "se_ms": round(sd / len(d) ** 0.5, 1),
            "lower_in": sum(x < 0 for x in d), "n": len(d)}


def paired_all(runs: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """:func:`paired` of the per-run TTFT means and p95s against each baseline; ``runs[g]``: ``mean`` and ``p95``
    lists in run order."""
    kv = runs[KV]
    return {g: {"ttft_mean": paired(kv["mean"], runs[g]["mean"]), "ttft_p95": paired(kv["p95"], runs[g]["p95"])}
            for g in (SHUFFLE, LEAST_BUSY)}


def verdict(workload: str, routings: dict[str, dict[str, Any]], least_busy_run_means: list[float],
            pairs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The must-show on one cell: litellm-kv's TTFT mean and p95 (``ttft_mean_ms``, ``ttft_p95_ms`` of each routing)
    below both baselines', or on the ``unique`` control its mean within the spread of least-busy's per-run means.
    And from ``pairs`` (:func:`paired_all`), whether each is below both beyond the noise: litellm-kv's run-by-run
    difference from each baseline below zero by more than two standard errors (None with fewer than 3 runs). On the
    control, also whether litellm-kv's run-by-run difference from least-busy is away from zero by more than two
    standard errors (``differs_run_by_run``): with each round its own draw the per-run means spread with the
    draws, which the pairing takes out."""
    kv, sh, lb = (routings[g] for g in (KV, SHUFFLE, LEAST_BUSY))
    if workload == "unique":
        noise = max(least_busy_run_means) - min(least_busy_run_means)
        diff = kv["ttft_mean_ms"] - lb["ttft_mean_ms"]
        d = pairs[LEAST_BUSY]["ttft_mean"]
        return {"kind": "control", "kv_minus_least_busy_ms": round(diff, 1), "least_busy_spread_ms": round(noise, 1),
                "within_noise": abs(diff) <= noise,
                "differs_run_by_run": abs(d["mean_ms"]) > 2 * d["se_ms"] if d["n"] >= 3 else None}
    out: dict[str, Any] = {
        "kind": "win", "mean_below_both": kv["ttft_mean_ms"] < min(sh["ttft_mean_ms"], lb["ttft_mean_ms"]),
        "p95_below_both": kv["ttft_p95_ms"] < min(sh["ttft_p95_ms"], lb["ttft_p95_ms"])}
    for figure, key in (("ttft_mean", "mean_clearly_below_both"), ("ttft_p95", "p95_clearly_below_both")):
        ds = [pairs[g][figure] for g in (SHUFFLE, LEAST_BUSY)]
        out[key] = all(d["mean_ms"] + 2 * d["se_ms"] < 0 for d in ds) if all(d["n"] >= 3 for d in ds) else None
    return out


def cell_summary(comp: Comparison, names: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"workload": comp.workload, "rate": comp.rate, "checks": comp.checks, "routings": {}}
    for g in ROUTINGS:
        runs = comp.runs[g]
        pooled = comp.pooled(g).summary()
        pooled["per_run_ttft_mean_ms"] = [round(1000 * r.ttft(), 1) for r in runs]
        pooled["per_run_ttft_p95_ms"] = [round(1000 * r.ttft(0.95), 1) for r in runs]
        pooled["per_run_cached_ratio"] = [round(r.cached_ratio, 3) for r in runs]
        pooled["by_kind"] = comp.pooled(g).by_cached_share()
        if comp.workloads:
            pooled["per_run_placement"] = [field.placement(r, comp.workload_of(i), names or {})
                                           for i, r in enumerate(runs)]
        cpu = comp.cpu.get(g) or []
        if cpu and all(cpu):
            pooled["per_run_cpu_s"] = cpu
            pooled["cpu_s_mean"] = {k: round(statistics.fmean(c[k] for c in cpu), 3) for k in CPU_PARTS}
            pooled["wall_s_mean"] = round(statistics.fmean(r.wall_s for r in runs), 2)
        out["routings"][g] = pooled
    out["paired"] = paired_all({g: {"mean": out["routings"][g]["per_run_ttft_mean_ms"],
                                    "p95": out["routings"][g]["per_run_ttft_p95_ms"]} for g in ROUTINGS})
    out["verdict"] = verdict(comp.workload, out["routings"], out["routings"][LEAST_BUSY]["per_run_ttft_mean_ms"],
                             out["paired"])
    out["per_run_decisions"] = [decision_reasons(d) for d in comp.kv_deltas]
    err = abs_error(comp.ttft_errors_ms)
    if err:
        out["prediction_error"] = {**err, "dropped": comp.ttft_errors_dropped}
    return out


def print_cell(s: dict[str, Any]) -> None:
    print(f"\n== {s['workload']} at {s['rate']:.2f} req/s ==")
    print(f"{'routing':<24} {'TTFT mean':>10} {'(runs min-max)':>15} {'p50':>7} {'p95':>8} {'(runs min-max)':>15} "
          f"{'e2e mean':>9} {'out tok/s':>9} {'cached':>7} {'failed':>6}")
    for g in ROUTINGS:
        r = s["routings"][g]
        m, p = r["per_run_ttft_mean_ms"], r["per_run_ttft_p95_ms"]
        print(f"{LABELS[g]:<24} {r['ttft_mean_ms']:>8.0f}ms {min(m):>7.0f}-{max(m):<7.0f} {r['ttft_p50_ms']:>5.0f}ms "
              f"{r['ttft_p95_ms']:>6.0f}ms {min(p):>7.0f}-{max(p):<7.0f} {r['e2e_mean_ms']:>7.0f}ms "
              f"{r['output_tok_s']:>9.1f} {r['cached_ratio']:>7.3f} {r['failures']:>6}")
    for g in ROUTINGS:
        kinds = s["routings"][g].get("by_kind", {})
        parts = [f"{k} n={v['n']:.0f} mean {v['ttft_mean_ms']:.0f}ms p95 {v['ttft_p95_ms']:.0f}ms"
                 for k, v in kinds.items()]
        print(f"  {LABELS[g]:<22} by cached share: {'; '.join(parts)}")
    for g in ROUTINGS:
        runs = s["routings"][g].get("per_run_placement")
        if runs:
            print(f"  {LABELS[g]:<22} prefix groups per replica (later requests sent elsewhere), per run: "
                  + "; ".join(f"{p['groups']} ({p['away']})" for p in runs))
    for g in ROUTINGS:
        r = s["routings"][g]
        if "cpu_s_mean" in r:
            print(f"  {LABELS[g]:<22} per run, mean {format_cpu(r['cpu_s_mean'], r['wall_s_mean'])}")
    print_paired(s["paired"])
    if s.get("per_run_decisions"):
        print(f"  litellm-kv decisions by reason, per run: {s['per_run_decisions']}")
    print(f"litellm-kv prediction checks: {s['checks']}; verdict: {s['verdict']}")
    if "prediction_error" in s:
        e = s["prediction_error"]
        print(f"predicted vs measured TTFT (litellm-kv, per streamed response): |error| median "
              f"{e['median_ms']:.0f} ms, p90 {e['p90_ms']:.0f} ms; signed median {e['signed_median_ms']:+.0f} ms "
              f"(n={e['n']})")


def verdict_text(v: dict[str, Any]) -> str:
    if v["kind"] == "control":
        paired = "" if v.get("differs_run_by_run") is None else \
            f"; differs run by run beyond the noise: {v['differs_run_by_run']}"
        return (f"within noise of least-busy: {v['within_noise']} ({v['kv_minus_least_busy_ms']:+.0f} ms, spread "
                f"{v['least_busy_spread_ms']:.0f}{paired})")
    def clear(key: str) -> str:
        return "" if v.get(key) is None else f" (beyond the noise, run by run: {v[key]})"

    return (f"mean below both: {v['mean_below_both']}{clear('mean_clearly_below_both')}; p95 below both: "
            f"{v['p95_below_both']}{clear('p95_clearly_below_both')}")


def paired_text(d: dict[str, Any]) -> str:
    m, p = d["ttft_mean"], d["ttft_p95"]
    return (f"mean {m['mean_ms']:+.0f} ms (sd {m['sd_ms']:.0f}, se {m['se_ms']:.0f}; lower in {m['lower_in']}/{m['n']} "
            f"runs), p95 {p['mean_ms']:+.0f} ms (sd {p['sd_ms']:.0f}; lower in {p['lower_in']}/{p['n']})")


def print_paired(pairs: dict[str, dict[str, Any]]) -> None:
    for g, d in pairs.items():
        print(f"  litellm-kv minus {LABELS[g]}, run by run: {paired_text(d)}")


def _measured_fraction(c: dict[str, Any], capacity: float | None) -> float | None:
    """The cell's load fraction when its rate was set from the fleet speed the bench measured (not ``--rates``);
    None otherwise. Files written before ``rate_from_capacity`` existed: the rate is that fraction of the capacity."""
    f = c.get("load_fraction")
    if f is None:
        return None
    if "rate_from_capacity" in c:
        return float(f) if c["rate_from_capacity"] else None
    return float(f) if capacity and abs(float(f) * capacity - c["rate"]) <= 0.011 else None


def pool(paths: list[str]) -> dict[str, Any]:
    """Cells of several bench runs (their ``--json`` files) merged by workload and load: the load fraction where
    each bench set its rates from the fleet speed it measured (the machine's speed drifts between benches, so
    the same fraction is a slightly different rate), the rate itself where they were given (``--rates``). Each
    routing's per-run TTFT means and p95s are put together, then summarised per cell as the mean of the per-run
    means (min-max, sd), the mean of the per-run p95s, the run-by-run differences (:func:`paired`) and the
    verdict on those means."""
    cells: dict[tuple[str, str, float], dict[str, Any]] = {}
    for path in paths:
        bench = json.loads(Path(path).read_text())
        for c in bench["cells"]:
            f = _measured_fraction(c, bench.get("capacity_req_s"))
            key = (c["workload"], "load", f) if f is not None else (c["workload"], "rate", c["rate"])
            cell = cells.setdefault(key, {
                "workload": c["workload"], "rate": c["rate"], "load_fraction": f, "rates": [], "benches": 0,
                "runs": {g: {"mean": [], "p95": []} for g in ROUTINGS}})
            cell["benches"] += 1
            cell["rates"].append(c["rate"])
            for g in ROUTINGS:
                cell["runs"][g]["mean"] += c["routings"][g]["per_run_ttft_mean_ms"]
                cell["runs"][g]["p95"] += c["routings"][g]["per_run_ttft_p95_ms"]
    out = []
    for cell in cells.values():
        runs = cell.pop("runs")
        routings = {}
        for g in ROUTINGS:
            m, p = runs[g]["mean"], runs[g]["p95"]
            routings[g] = {"runs": len(m), "ttft_mean_ms": round(statistics.fmean(m), 1), "min_ms": min(m),
                           "max_ms": max(m), "sd_ms": round(statistics.stdev(m), 1) if len(m) > 1 else 0.0,
                           "ttft_p95_ms": round(statistics.fmean(p), 1)}
        pairs = paired_all(runs)
        out.append({**cell, "routings": routings, "paired": pairs,
                    "verdict": verdict(cell["workload"], routings, runs[LEAST_BUSY]["mean"], pairs)})
    return {"files": paths, "cells": out}


def pool_markdown(pooled: dict[str, Any]) -> str:
    lines = [f"Pooled over {len(pooled['files'])} bench runs ({', '.join(Path(f).name for f in pooled['files'])}): "
             "per routing, the mean of the per-run TTFT means (min-max, sd over runs) and of the per-run p95s; per "
             "baseline, litellm-kv's run-by-run difference (its run minus the baseline's run of the same A-B-C "
             "block).", "",
             "| workload | load (req/s) | routing | runs | TTFT mean ms (min-max, sd) | TTFT p95 ms | litellm-kv minus "
             "this, run by run | verdict |", "|---|---|---|---|---|---|---|---|"]
    for s in pooled["cells"]:
        load = f"{s['rate']:.2f}"
        if s.get("load_fraction") is not None:
            lo, hi = min(s["rates"]), max(s["rates"])
            load = f"{s['load_fraction']:g}× ({lo:.2f}" + (f"-{hi:.2f})" if hi > lo else ")")
        for g in ROUTINGS:
            r = s["routings"][g]
            diff = paired_text(s["paired"][g]) if g in s["paired"] else ""
            judged = verdict_text(s["verdict"]) if g == KV else ""
            lines.append(f"| {s['workload']} | {load} | {LABELS[g]} | {r['runs']} | {r['ttft_mean_ms']:.0f} "
                         f"({r['min_ms']:.0f}-{r['max_ms']:.0f}, sd {r['sd_ms']:.0f}) | {r['ttft_p95_ms']:.0f} "
                         f"| {diff} | {judged} |")
    return "\n".join(lines)


def arrivals_text(results: dict[str, Any]) -> str:
    """How the bench's rounds drew their requests (files from before ``--arrivals`` replayed one draw)."""
    how, first = results.get("arrivals", "fixed"), int(results.get("first_draw", 0))
    if how == "fixed":
        return f", every run the same requests (draw {first})"
    return f", each round its own requests (draws {first}-{first + int(results['runs']) - 1})"


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Run {results['started']}, {results['replicas']} replicas, fleet without hits "
             f"~{results['capacity_req_s']:.2f} req/s, {results['runs']} runs per routing per cell "
             f"(A-B-C-C-B-A-A-B-C){arrivals_text(results)}.", "",
             "| workload | load (req/s) | routing | TTFT mean ms (runs min-max) | TTFT p50 | TTFT p95 (runs min-max) "
             "| e2e mean ms | out tok/s | cached | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in results["cells"]:
        for g in ROUTINGS:
            r = s["routings"][g]
            m, p = r["per_run_ttft_mean_ms"], r["per_run_ttft_p95_ms"]
            judged = ""
            if g == KV:
                judged = verdict_text(s["verdict"])
                if "prediction_error" in s:
                    e = s["prediction_error"]
                    judged += (f"; predicted TTFT |error| median {e['median_ms']:.0f} ms, "
                               f"p90 {e['p90_ms']:.0f} ms (n={e['n']})")
            lines.append(f"| {s['workload']} | {s['rate']:.2f} | {LABELS[g]} | {r['ttft_mean_ms']:.0f} "
                         f"({min(m):.0f}-{max(m):.0f}) | {r['ttft_p50_ms']:.0f} | {r['ttft_p95_ms']:.0f} "
                         f"({min(p):.0f}-{max(p):.0f}) | {r['e2e_mean_ms']:.0f} | {r['output_tok_s']:.1f} | "
                         f"{r['cached_ratio']:.3f} | {judged} |")
    return "\n".join(lines)


def _mean_p95(cell: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """A cell's plotted figures: each routing's TTFT mean and p95 (ms)."""
    return {g: (cell["routings"][g]["ttft_mean_ms"], cell["routings"][g]["ttft_p95_ms"]) for g in ROUTINGS}


def plots(results: dict[str, Any], out_dir: Path) -> None:
    """ttft_<workload>.png: TTFT mean and p95 against load, one line per routing."""
    for name in dict.fromkeys(c["workload"] for c in results["cells"]):
        pts = [(c["rate"], _mean_p95(c)) for c in results["cells"] if c["workload"] == name]
        model = "tiny Qwen2.5-VL" if results.get("vl") else "ttft"
        title = (f"{field.make(name, 1.0, **SIZES[name]).describe}\n{results['replicas']} vLLM CPU replicas, {model} "
                 f"model; each point pools {results['runs']} runs per routing (A-B-C-C-B-A-A-B-C)")
        plot(pts, out_dir / f"ttft_{name}.png", title)


def pool_plots(pooled: dict[str, Any], out_dir: Path) -> list[Path]:
    """ttft_<workload>-pooled.png: each routing's pooled TTFT mean and mean per-run p95 against load (the load
    fraction where every cell of the workload has one, else the rate), from :func:`pool`'s result."""
    out = []
    for name in dict.fromkeys(c["workload"] for c in pooled["cells"]):
        cells = [c for c in pooled["cells"] if c["workload"] == name]
        by_fraction = all(c.get("load_fraction") is not None for c in cells)
        pts = sorted(((c["load_fraction"] if by_fraction else c["rate"], _mean_p95(c)) for c in cells),
                     key=lambda pt: pt[0])
        runs, benches = min(c["routings"][KV]["runs"] for c in cells), min(c["benches"] for c in cells)
        title = (f"{field.make(name, 1.0, **SIZES[name]).describe}\npooled over {benches} benches, "
                 f"{runs} runs per routing per load (p95: the mean of the per-run p95s)")
        xlabel = ("load (fraction of what the fleet serves without cache hits)" if by_fraction
                  else "offered load (requests/s)")
        path = out_dir / f"ttft_{name}-pooled.png"
        plot(pts, path, title, xlabel)
        out.append(path)
    return out


async def main_async(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    bed = start_testbed(args.replicas, name="bttft", kv_overrides=json.loads(args.kv_overrides or "{}"),
                        vl=args.vl, **({"kv_cache": "8M"} if args.vl else {}))
    cells: list[dict[str, Any]] = []
    try:
        async with EngineClient(bed.replicas[0].url) as client:
            info = await client.metrics()
        bs, blocks = int(info.block_size or 0), int(info.num_gpu_blocks or 0)
        tok = LocalChatTokenizer(bed.replicas[0].model_dir, content_format="openai" if args.vl else "string")
        hasher = BlockHasher("sha256", bs, hash_seed="0")
        names = args.workloads.split(",")
        for name in names:
            wl = field.make(name, 1.0, **SIZES[name])
            need, mean_len, max_len = (_distinct_vl(wl, tok, hasher) if args.vl
                                       else field.distinct_blocks(wl, tok.chat_tokens, hasher))
            print(f"[bench] {wl.describe}: prompts {mean_len} tokens on average "
                  f"(max {max_len}), {need} distinct blocks vs {blocks} per replica", flush=True)
        unit = await fleet_speed(bed)
        capacity = args.replicas / unit
        print(f"[bench] one uncached request {1000 * unit:.0f} ms -> ~{capacity:.2f} req/s without hits", flush=True)
        for name in names:
            fractions = (args.control_loads or args.loads) if name == "unique" else args.loads
            fixed = (args.control_rates or args.rates) if name == "unique" else args.rates
            for f, rate in zip(fractions, fixed or [round(f * capacity, 2) for f in fractions], strict=False):
                def make(i: int, n: str = name, r: float = rate) -> field.Workload:
                    return field.make(n, r, draw=args.first_draw + (0 if args.arrivals == "fixed" else i),
                                      **SIZES[n])

                comp = await abc_cba(bed, make, rate, runs=args.runs, max_tokens=args.max_tokens,
                                     metric_prefixes=(DECISIONS_METRIC,))
                s = cell_summary(comp, bed.names)
                s["load_fraction"] = f
                s["rate_from_capacity"] = not fixed
                cells.append(s)
                print_cell(s)
        results = {"started": started, "replicas": args.replicas, "vl": args.vl, "capacity_req_s": round(capacity, 3),
                   "unit_s": round(unit, 3), "runs": args.runs, "arrivals": args.arrivals,
                   "first_draw": args.first_draw,
                   "kv_overrides": args.kv_overrides, "cells": cells,
                   "wall_s": round(time.monotonic() - t0)}
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        if args.plot_dir:
            plots(results, Path(args.plot_dir))
        md = markdown(results)
        print("\n" + md)
        if args.markdown:
            Path(args.markdown).write_text(md + "\n")
        load1, load5, _ = os.getloadavg()
        print(f"\n[bench] {time.monotonic() - t0:.0f} s; load average at the end {load1:.1f} (1 min), {load5:.1f} "
              f"(5 min), with {os.cpu_count()} CPUs: the run itself keeps the CPUs busy, more means other work ran")
        return 0
    finally:
        bed.stop()


def _distinct_vl(wl: field.Workload, tok: LocalChatTokenizer, hasher: BlockHasher) -> tuple[int, int, int]:
    """:func:`field.distinct_blocks` for chats with inline images: each placeholder expanded to the image's
    count and the blocks hashed with the image identifiers, as the engine holds them."""
    import base64

    from litellm_kv.governance.images import image_info
    from litellm_kv.governance.vision import visual_tokens
    from litellm_kv.vllm.multimodal import ImageItem, expand_images, image_identifier

    (pad,) = tok.encode("<|image_pad|>")
    seen: set[bytes] = set()
    lengths = []
    for r in wl.requests:
        items = []
        for m in r.messages:
            for part in m["content"] if isinstance(m["content"], list) else []:
                if part.get("type") == "image_url":
                    raw = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                    info = image_info(raw)
                    items.append(ImageItem(image_identifier(raw), visual_tokens("qwen2_5_vl", info.width, info.height)))
        prompt = expand_images(tok.chat_tokens(r.messages), pad, items)
        lengths.append(len(prompt.token_ids))
        seen.update(hasher.block_hashes(prompt.token_ids, mm=prompt.features))
    return len(seen), round(statistics.fmean(lengths)), max(lengths)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--vl", action="store_true",
                    help="the vision-language testbed (.venv-engine-vl): use with --workloads images,unique")
    ap.add_argument("--workloads", default="chat,fanout,unique")
    ap.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 0.9])
    ap.add_argument("--control-loads", type=lambda s: [float(x) for x in s.split(",")], default=None,
                    help="load levels for the unique control (default: --loads)")
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=None,
                    help="fixed request rates instead of --loads x the measured speed (to compare two runs)")
    ap.add_argument("--control-rates", type=lambda s: [float(x) for x in s.split(",")], default=None)
    ap.add_argument("--runs", type=int, default=3, help="runs per routing per cell (>= 3 for the must-show)")
    ap.add_argument("--arrivals", choices=("vary", "fixed"), default="vary",
                    help="vary: each round of runs draws new Poisson arrivals and prompts (the same for every "
                         "routing in the round), so repeats sample the workload; fixed: every run replays one draw")
    ap.add_argument("--first-draw", type=int, default=0,
                    help="the first round's draw of each workload (draw 0: the generators' default seeds); benches "
                         "to be pooled with --pool take disjoint draws, e.g. 0, 5, 10 with --runs 5")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--kv-overrides", default="", help="JSON merged into the KV group's kv settings (A-B of settings)")
    ap.add_argument("--json", default="")
    ap.add_argument("--markdown", default="")
    ap.add_argument("--plot-dir", default="",
                    help="write ttft_<workload>.png (TTFT against load) here; with --pool, ttft_<workload>-pooled.png")
    ap.add_argument("--replot", default="", help="only re-render --markdown/--plot-dir from this --json file")
    ap.add_argument("--pool", nargs="+", default=[], metavar="JSON",
                    help="only pool these --json files of earlier runs by cell and print (and --markdown, --json) "
                         "the pooled figures and the run-by-run differences")
    args = ap.parse_args(argv)
    if args.pool:
        pooled = pool(args.pool)
        md = pool_markdown(pooled)
        print(md)
        if args.markdown:
            Path(args.markdown).write_text(md + "\n")
        if args.json:
            Path(args.json).write_text(json.dumps(pooled, indent=1))
        if args.plot_dir:
            for path in pool_plots(pooled, Path(args.plot_dir)):
                print(f"[bench] wrote {path}")
        return 0
    if args.replot:
        results = json.loads(Path(args.replot).read_text())
        if args.plot_dir:
            plots(results, Path(args.plot_dir))
        md = markdown(results)
        print(md)
        if args.markdown:
            Path(args.markdown).write_text(md + "\n")
        return 0
    signal.signal(signal.SIGTERM, _interrupt)  # stop the replicas and the proxy (main_async's finally)
    return asyncio.run(main_async(args))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
