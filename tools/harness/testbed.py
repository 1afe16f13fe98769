"""The TTFT testbed: real vLLM CPU replicas shaped like GPU serving behind one real LiteLLM proxy that
routes the same replicas three ways, and an A-B-C-C-B-A runner over them (shared by ``tools/demo.py``,
``benchmarks/bench_ttft.py`` and the tests).

* Replicas serve the ``ttft`` model (``tools/engine/build_model.py --variant ttft``: 16K context), chosen
  with ``benchmarks/bench_engine_shape.py`` so that prefilling 1,024 uncached tokens costs several
  single-sequence decode steps, as on a GPU (docs/kv-routing.md, "A testbed shaped like GPU serving").
  ``max_model_len`` 8192 and a KV cache of :data:`KV_CACHE` per replica (512 blocks of 32 tokens at
  1 KiB per token): the default workloads' distinct prefixes overflow one replica and fit two.
* One proxy, three model groups over the same replicas: :data:`SHUFFLE` (LiteLLM ``simple-shuffle``),
  :data:`LEAST_BUSY` (LiteLLM ``least-busy``, through ``router_settings.routing_groups``) and :data:`KV`
  (``routing: kv``, litellm-kv's defaults, no hand-set weight).
* :func:`abc_cba` runs one workload once per routing in A-B-C-C-B-A order (every routing once early and
  once late, so drift and neighbours' load hit all alike), emptying every prefix cache before each run. Each
  round (A-B-C, then C-B-A, ...) may draw its own arrivals: the routings of a round always get the same requests.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from litellm_kv.routing.ttft import error_quantiles
from tools.harness.engines import EngineReplica, reset_prefix_caches, start_replicas, start_vl_replica
from tools.harness.field import FieldRequest, OpenLoopRun, Workload, run_open_loop, unique_workload
from tools.harness.procs import group_cpu_seconds
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxy

KV = "ttft-kv"
SHUFFLE = "ttft-shuffle"
LEAST_BUSY = "ttft-least-busy"
ROUTINGS = (SHUFFLE, LEAST_BUSY, KV)
LABELS = {SHUFFLE: "LiteLLM simple-shuffle", LEAST_BUSY: "LiteLLM least-busy", KV: "litellm-kv"}
KV_CACHE = "16M"
MAX_MODEL_LEN = 8192
# POST /reset_prefix_cache (every run starts cold); one compute thread per replica, as each GPU replica has
# its own device (two replicas on two cores, not both fighting over both).
ENGINE_ENV = {"VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": "1"}


# vLLM's engine-core process (the model's compute: the testbed's stand-in for a GPU) names itself
# "VLLM::EngineCore"; Linux keeps 15 characters of a process name.
ENGINE_CORE_COMM = "VLLM::EngineCor"
CPU_PARTS = ("engine_core", "engine_front", "proxy", "client")


def proxy_config(replicas: Sequence[EngineReplica], kv_overrides: dict[str, Any] | None = None,
                 vision: dict[str, Any] | None = None) -> dict[str, Any]:
    """Three groups over the same replicas; the KV group with litellm-kv's defaults (plus ``kv_overrides``).
    ``vision``: a vision section for all three (the vision-language testbed: every routing's images are
    counted and identified alike; only the KV group routes by them)."""
    model_dir = str(replicas[0].model_dir)
    model_list = [
        {"model_name": group,
         "litellm_params": {"model": "hosted_vllm/tiny", "api_base": r.api_base, "api_key": "none"},
         "model_info": {"id": f"{group}-r{i}"}}
        for group in ROUTINGS for i, r in enumerate(replicas)
    ]
    return {
        "model_list": model_list,
        "router_settings": {
            "routing_strategy": "simple-shuffle", "num_retries": 1,
            "routing_groups": [{"group_name": "least-busy", "models": [LEAST_BUSY], "routing_strategy": "least-busy"}],
        },
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"], "request_timeout": 300},
        "litellm_kv": {"mode": "embedded",
                       "model_groups": {
                           KV: {"routing": "kv", "kv": {"tokenizer_path": model_dir, **(kv_overrides or {})},
                                **({"vision": vision} if vision else {})},
                           **({g: {"vision": vision} for g in (SHUFFLE, LEAST_BUSY)} if vision else {})}},
    }


@dataclass
class Testbed:
    replicas: list[EngineReplica]
    proxy: Proxy
    names: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        self.proxy.stop()
        for r in self.replicas:
            r.stop()


def start_testbed(replicas: int = 2, *, kv_cache: str = KV_CACHE, kv_overrides: dict[str, Any] | None = None,
                  name: str = "ttft", vl: bool = False) -> Testbed:
    """``vl``: replicas of the tiny Qwen2.5-VL model (its text backbone is the ``ttft`` model's: same widths and
    layers) with a vision section on every group, ``kv_cache`` per replica (8M: 8,192 tokens)."""
    if vl:
        reps: list[EngineReplica] = []
        try:
            for i in range(replicas):
                reps.append(start_vl_replica(kv_cache_bytes=kv_cache, name=f"{name}-vl{i}", env=ENGINE_ENV))
        except BaseException:
            for r in reps:
                r.stop()
            raise
    else:
        reps = start_replicas(replicas, kv_cache_bytes=kv_cache, model="ttft", max_model_len=MAX_MODEL_LEN,
                              env=ENGINE_ENV, name_prefix=name)
    vision = {"family": "qwen2_5_vl"} if vl else None
    try:
        # A generous start-up bound: on this shared 2-core machine a proxy beside two busy engines has taken
        # more than the harness's default 120 s to answer.
        proxy = start_proxy(proxy_config(reps, kv_overrides, vision), name=f"{name}-proxy", timeout=300)
    except BaseException:
        for r in reps:
            r.stop()
        raise
    bed = Testbed(reps, proxy, {f"{g}-r{i}": f"r{i}" for g in ROUTINGS for i in range(replicas)})
    try:
        proxy.wait_kv_exact(KV, timeout=120)
    except BaseException:
        bed.stop()
        raise
    return bed


def cpu_split(bed: Testbed) -> dict[str, float]:
    """CPU seconds used so far, by part of the testbed: the engines' compute (``engine_core``), the rest of the
    engines' processes (``engine_front``: their API servers' HTTP, tokenization and streaming), the proxy and this
    process (``client``, the load generator). Empty where the processes cannot be read (not Linux). All of them
    share this machine's cores, unlike a GPU fleet's, whose devices do not wait for the proxy."""
    engines = [r.proc.pid for r in bed.replicas if r.proc is not None]
    groups = group_cpu_seconds([bed.proxy.proc.pid, *engines])
    if groups is None:
        return {}
    parts = dict.fromkeys(CPU_PARTS, 0.0)
    parts["proxy"] = sum(groups[bed.proxy.proc.pid].values())
    for pg in engines:
        for comm, s in groups[pg].items():
            parts["engine_core" if comm.startswith(ENGINE_CORE_COMM) else "engine_front"] += s
    t = os.times()
    parts["client"] = t.user + t.system
    return parts


def cpu_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before[k], 3) for k in after if k in before}


def format_cpu(d: dict[str, float], wall_s: float) -> str:
    """One run's CPU seconds by part, and their sum as a share of what the machine's cores gave in ``wall_s``."""
    if not d:
        return ""
    cores = os.cpu_count() or 1
    busy = sum(d.values()) / max(1e-9, wall_s * cores)
    return (f"cpu s: engine cores {d['engine_core']:.2f}, engine front-ends {d['engine_front']:.2f}, proxy "
            f"{d['proxy']:.2f}, client {d['client']:.2f} ({100 * busy:.0f} % of {cores} cores over {wall_s:.1f} s)")


_SAMPLE = re.compile(r"^(litellm_kv_[a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN)$")


async def kv_metrics(proxy: Proxy,
                     prefixes: Sequence[str] = ("litellm_kv_prediction_checks_total",)) -> dict[str, float]:
    """litellm-kv's counters whose name starts with one of ``prefixes`` (cumulative; subtract two reads)."""
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{proxy.url}/litellm-kv/metrics", headers=proxy.headers())).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1).startswith(tuple(prefixes)):
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


async def kv_ttft_errors(proxy: Proxy, since: int | None = None) -> dict[str, Any]:
    """The ``ttft_error`` section of the KV group on ``GET /litellm-kv/health``: ``responses`` counts every error
    recorded; with ``since`` (an earlier ``responses``), ``since.errors_ms`` lists those recorded after it."""
    params = {"ttft_errors_since": str(since)} if since is not None else {}
    health = await asyncio.to_thread(proxy.kv_health, KV, **params)
    return dict(health.get("ttft_error") or {})


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def label_counts(d: dict[str, float], metric: str, label: str, where: str = "") -> dict[str, int]:
    """``{value of label: count}`` from a delta of counter ``metric``, over the series whose line contains
    ``where`` (e.g. ``model_group="g"``)."""
    out: dict[str, int] = {}
    for k, v in d.items():
        m = re.search(rf'{label}="([a-z_]+)"', k)
        if k.startswith(metric) and where in k and m:
            out[m.group(1)] = out.get(m.group(1), 0) + int(v)
    return out


def prediction_checks(d: dict[str, float]) -> dict[str, int]:
    """``{outcome: count}`` from a delta of ``litellm_kv_prediction_checks_total``."""
    return label_counts(d, "litellm_kv_prediction_checks_total", "outcome")


@dataclass
class Comparison:
    """Every routing's runs of one workload at one rate, pooled; and litellm-kv's prediction checks."""

    workload: str
    rate: float
    runs: dict[str, list[OpenLoopRun]]
    checks: dict[str, int] = field(default_factory=dict)
    kv_deltas: list[dict[str, float]] = field(default_factory=list)
    ttft_errors_ms: list[float] = field(default_factory=list)  # litellm-kv's measured - predicted TTFT, per response
    ttft_errors_dropped: int = 0  # errors the proxy no longer held when read (none unless a run outgrows its window)
    cpu: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # routing -> per run, cpu_split's delta
    workloads: list[Workload] = field(default_factory=list)  # per round: the requests every routing was sent

    def workload_of(self, run: int) -> Workload:
        """The requests of every routing's ``run``-th run (its round's)."""
        return self.workloads[run]

    def pooled(self, routing: str) -> OpenLoopRun:
        rs = self.runs[routing]
        out = rs[0]
        for r in rs[1:]:
            out = out + r
        return out


def abc_order(order: Sequence[str], runs: int) -> list[str]:
    """``runs`` rounds over ``order``, every other round reversed: A-B-C-C-B-A(-A-B-C...)."""
    seq: list[str] = []
    for i in range(runs):
        seq += list(order) if i % 2 == 0 else list(reversed(order))
    return seq


async def abc_cba(bed: Testbed, make: Callable[[int], Workload], rate: float, *, runs: int = 2,
                  max_tokens: int = 32, order: Sequence[str] = ROUTINGS,
                  log: Callable[[str], None] = print, metric_prefixes: Sequence[str] = ()) -> Comparison:
    """Each routing runs ``runs`` times in A-B-C-C-B-A order (:func:`abc_order`), every prefix cache emptied
    before each run. ``make(i)`` gives round ``i``'s requests (0-based), sent to every routing in that round: the
    same each round for one arrival pattern replayed, or a new draw per round so that the repeats sample the
    arrival process as well as the machine's noise."""
    seq = abc_order(order, runs)
    by_routing: dict[str, list[OpenLoopRun]] = {g: [] for g in order}
    workloads = [make(i) for i in range(runs)]
    comp = Comparison(workloads[0].name, rate, by_routing, workloads=workloads)
    wl = workloads[0]
    prefixes = ("litellm_kv_prediction_checks_total", *metric_prefixes)
    for i, g in enumerate(seq, 1):
        await asyncio.to_thread(reset_prefix_caches, bed.replicas)
        before = await kv_metrics(bed.proxy, prefixes) if g == KV else {}
        errors_before = (await kv_ttft_errors(bed.proxy)).get("responses", 0) if g == KV else 0
        cpu_before = cpu_split(bed)
        run = await run_open_loop(bed.proxy.url, MASTER_KEY, g, workloads[(i - 1) // len(order)],
                                  max_tokens=max_tokens)
        cpu = cpu_delta(cpu_split(bed), cpu_before)
        comp.cpu.setdefault(g, []).append(cpu)
        by_routing[g].append(run)
        if g == KV:
            since = (await kv_ttft_errors(bed.proxy, since=errors_before)).get("since") or {}
            comp.ttft_errors_ms += since.get("errors_ms", [])
            comp.ttft_errors_dropped += since.get("dropped", 0)
            d = delta(await kv_metrics(bed.proxy, prefixes), before)
            comp.kv_deltas.append(d)
            for k, v in prediction_checks(d).items():
                comp.checks[k] = comp.checks.get(k, 0) + v
        log(f"  [{wl.name} @ {rate:.2f} req/s] run {i}/{len(seq)} {LABELS[g]:<22} TTFT mean "
            f"{1000 * run.ttft():7.0f} ms  p95 {1000 * run.ttft(0.95):7.0f} ms  cached {run.cached_ratio:.2f}  "
            f"failed {run.failures}  {run.per_replica(bed.names)}  {format_cpu(cpu, run.wall_s)}")
    return comp


async def fleet_speed(bed: Testbed, n: int = 3) -> float:
    """Seconds one uncached ~2.7K-token request with 32 output tokens takes on an idle replica (median of ``n``,
    one at a time, each prompt new): the unit the load levels are set in."""
    wl = unique_workload(n=n, prompt_tokens=2700, rate=1000.0, seed=99)
    times = []
    for r in wl.requests:
        one = Workload("probe", "", [FieldRequest(0, 0.0, r.messages, "p")])
        run = await run_open_loop(bed.proxy.url, MASTER_KEY, SHUFFLE, one)
        times.append(run.outcomes[0].e2e_s)
    return statistics.median(times)


def abs_error(errors_ms: Sequence[float]) -> dict[str, Any] | None:
    """Median and p90 (nearest rank) of |measured - predicted| TTFT and the median signed error, in ms, over
    the errors litellm-kv recorded for a cell's responses (:attr:`Comparison.ttft_errors_ms`)."""
    if not errors_ms:
        return None
    median, p90, signed = error_quantiles(errors_ms)
    return {"n": len(errors_ms), "median_ms": median, "p90_ms": p90, "signed_median_ms": signed}


def format_abs_error(c: Comparison) -> str:
    """One line: litellm-kv's TTFT prediction error over a comparison's streamed responses."""
    err = abs_error(c.ttft_errors_ms)
    if err is None:
        return "litellm-kv predicted TTFT vs measured: no streamed response recorded an error"
    dropped = f", {c.ttft_errors_dropped} more not held by the proxy" if c.ttft_errors_dropped else ""
    return (f"litellm-kv predicted TTFT vs measured (decision to first content chunk, at the proxy): |error| "
            f"median {err['median_ms']:.0f} ms, p90 {err['p90_ms']:.0f} ms; signed median "
            f"{err['signed_median_ms']:+.0f} ms ({err['n']} streamed responses{dropped})")


def format_comparison(c: Comparison) -> str:
    """The demo's table: one row per routing, all its runs pooled."""
    head = (f"{'routing':<24} {'TTFT mean':>9} {'p50':>7} {'p95':>7} {'e2e mean':>9} {'e2e p95':>8} "
            f"{'out tok/s':>9} {'cached':>7} {'failed':>6}")
    lines = [head]
    for g in c.runs:
        p = c.pooled(g)
        lines.append(f"{LABELS[g]:<24} {1000 * p.ttft():>7.0f}ms {1000 * p.ttft(0.5):>5.0f}ms "
                     f"{1000 * p.ttft(0.95):>5.0f}ms {1000 * p.e2e():>7.0f}ms {1000 * p.e2e(0.95):>6.0f}ms "
                     f"{p.output_tps:>9.1f} {p.cached_ratio:>7.3f} {p.failures:>6}")
    return "\n".join(lines)
