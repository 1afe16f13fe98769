"""Real fleet run: the simulator's workload shapes, scaled down, through a real LiteLLM proxy in front
of real vLLM CPU replicas, routed by LiteLLM's ``simple-shuffle`` and by litellm-kv in the same run.

One real ``litellm`` proxy (LiteLLM 1.110.2) serves two model groups over the same replicas:
``tiny-default`` (``simple-shuffle``) and ``tiny-kv`` (``routing: kv``, embedded mode, defaults).
The replicas (the tiny local model, block size 32) have small KV caches (8 MiB = 256 blocks each)
so a workload's reusable prefixes overflow one replica but fit the fleet.

Workloads come from the simulator's generators (``litellm_kv/simulator/workload.py``) with block
size 32 and small sizes. Their prefix-chained block ids become text: each block id renders as its
own deterministic pseudo-word sequence (~32 tokens of the tiny model's tokenizer), so requests that
share leading blocks in the generator share a text prefix, and nothing else is shared. Message
boundaries follow the generator's structure (system prompt / question, chat turns, agent context
/ sub-task), and every length is a multiple of 32 so they fall on block boundaries.

Each workload runs twice, shuffle first, each run starting from empty prefix caches
(``POST /reset_prefix_cache``, needs ``VLLM_SERVER_DEV_MODE=1``). Requests go out in the
generator's arrival order with bounded concurrency; a chat's next turn waits for its previous
turn. Per run: the engine-reported cached-token ratio (``usage.prompt_tokens_details``), mean/p95
client latency, requests per replica (``x-litellm-model-id``), failures; for litellm-kv also the
prediction checks (predicted vs engine-reported cached tokens) from ``/litellm-kv/metrics``.

    .venv/bin/python benchmarks/bench_fleet.py [--replicas 2|3] [--concurrency 4] \\
        [--workloads shared-prefix,multi-turn,agent-fanout,unique,hot-prefix] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from litellm_kv.simulator.workload import (
    SimRequest,
    agent_fanout,
    hot_prefix,
    mix,
    multi_turn,
    shared_prefix,
    unique_prompts,
)
from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.hashing import BlockHasher, max_hit_blocks
from litellm_kv.vllm.tokenization import LocalChatTokenizer
from tools.harness.engines import (
    EngineReplica,
    ensure_model,
    reset_prefix_caches,
    start_replicas,
    stop_replicas,
)
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxy
from tools.harness.workload import Result

KV = "tiny-kv"
SHUFFLE = "tiny-default"
HEADERS = {"Authorization": f"Bearer {MASTER_KEY}"}
BLOCK = 32
DRY_RUN_BLOCKS = 256  # what 8 MiB holds for the tiny model (2 layers x 1 KV head x 64 x fp32 x K,V = 1 KiB/token)
_SYLLABLES = ("ka", "lo", "mi", "ru", "te", "son", "var", "pel", "dor", "qui", "zen", "bra", "tho", "gli", "nex")
Messages = list[dict[str, str]]


# -- workloads ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Shape:
    """One generator, its scaled-down parameters, and how its blocks split into chat messages."""

    name: str
    make: Callable[[], list[SimRequest]]
    # (role, number of blocks) segments of one request's prompt blocks, in order.
    segments: Callable[[SimRequest], list[tuple[str, int]]]
    describe: str
    sequential_sessions: bool = False  # chats: a session's next turn waits for the previous one
    # The generator's tails are identical for every request with the same head (``_chain`` ignores
    # its ``root`` when given a ``parent``), so its "distinct questions" are exact repeats. The shape
    # it documents has a distinct tail per request: render tail blocks salted with the request id.
    unique_tail: bool = False


def _two_part(head_blocks: int, head_role: str = "system") -> Callable[[SimRequest], list[tuple[str, int]]]:
    return lambda r: [(head_role, head_blocks), ("user", len(r.blocks) - head_blocks)]


def _chat_segments(sys_b: int, user_b: int, out_b: int) -> Callable[[SimRequest], list[tuple[str, int]]]:
    def seg(r: SimRequest) -> list[tuple[str, int]]:
        turn = (len(r.blocks) - sys_b - user_b) // (user_b + out_b)
        return [("system", sys_b)] + [("user", user_b), ("assistant", out_b)] * turn + [("user", user_b)]
    return seg


def shapes() -> list[Shape]:
    """The simulator's five generators at a few dozen requests and ≤ ~1,200-token prompts (block 32)."""
    return [
        Shape("shared-prefix",
              lambda: shared_prefix(groups=10, prompts_per_group=8, system_len=1024, question_len=128,
                                    output_len=16, block_size=BLOCK, seed=1),
              _two_part(1024 // BLOCK), "10 system prompts x 8 questions, 1,024 + 128 tokens, interleaved",
              unique_tail=True),
        Shape("multi-turn",
              lambda: multi_turn(sessions=12, turns=6, system_len=256, user_len=96, output_len=64,
                                 block_size=BLOCK, seed=1),
              _chat_segments(256 // BLOCK, 96 // BLOCK, 64 // BLOCK),
              "12 chats x 6 turns, shared 256-token system prompt, +96 user +64 assistant per turn",
              sequential_sessions=True),
        Shape("agent-fanout",
              lambda: agent_fanout(tasks=12, fanout=6, context_len=1024, sub_len=128, block_size=BLOCK, seed=1),
              _two_part(1024 // BLOCK), "12 tasks x 6 sibling calls sharing a fresh 1,024-token context",
              unique_tail=True),
        Shape("unique",
              lambda: unique_prompts(n=40, prompt_len=1024, block_size=BLOCK, seed=1),
              lambda r: [("user", len(r.blocks))], "40 unrelated 1,024-token prompts"),
        Shape("hot-prefix",
              lambda: hot_prefix(n=80, prefixes=12, zipf_s=1.3, prefix_len=1024, suffix_len=128,
                                 block_size=BLOCK, seed=1),
              _two_part(1024 // BLOCK), "80 requests, 12 prefixes of 1,024 tokens drawn Zipf s=1.3, +128",
              unique_tail=True),
    ]


class BlockText:
    """Deterministic text per generator block id: equal ids → equal text, so shared blocks become
    shared text prefixes. Words per block are calibrated to ~``BLOCK`` tokens of the served model."""

    def __init__(self, tok: LocalChatTokenizer, seed: int = 0) -> None:
        self.seed = seed
        self.words = 16
        self._memo: dict[int, str] = {}
        sample = [self._render(i) for i in range(64)]
        per_word = sum(len(tok.encode(" " + s)) for s in sample) / (64 * self.words)
        self.words = max(1, round(BLOCK / per_word))
        self.tokens_per_word = per_word

    def _render(self, block_id: int) -> str:
        rng = random.Random(block_id * 1_000_003 + self.seed)
        return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(self.words))

    def __call__(self, block_id: int) -> str:
        text = self._memo.get(block_id)
        if text is None:
            text = self._memo[block_id] = self._render(block_id)
        return text


@dataclass(slots=True)
class FleetRequest:
    rid: int
    session: str
    messages: Messages
    after: int | None  # index of the request this one must wait for (previous chat turn)


def to_requests(shape: Shape, sims: list[SimRequest], text: BlockText) -> list[FleetRequest]:
    out: list[FleetRequest] = []
    last_of: dict[str, int] = {}
    for i, r in enumerate(sorted(sims, key=lambda s: s.arrival_s)):
        msgs: Messages = []
        pos = 0
        for k, (role, n) in enumerate(shape.segments(r)):
            if n <= 0:
                continue
            ids = r.blocks[pos:pos + n]
            if shape.unique_tail and k > 0:
                ids = [mix(b, 1 + r.rid) for b in ids]
            msgs.append({"role": role, "content": " ".join(text(b) for b in ids)})
            pos += n
        if pos != len(r.blocks):
            raise ValueError(f"{shape.name}: segments cover {pos} of {len(r.blocks)} blocks")
        after = last_of.get(r.session) if shape.sequential_sessions else None
        last_of[r.session] = i
        out.append(FleetRequest(i, r.session, msgs, after))
    return out


@dataclass(slots=True)
class Sizing:
    requests: int
    prompt_tokens_mean: float
    prompt_tokens_max: int
    distinct_blocks: int
    reusable_blocks: int  # full blocks that appear in at least two prompts (the only ones that can hit)
    # Cached-token ratio with one infinite cache and this order (vLLM's maximum-hit rule): the ceiling.
    ceiling: float


def sizing(reqs: list[FleetRequest], tok: LocalChatTokenizer) -> Sizing:
    """Exact: the local chat template + tokenizer (the engine's) and vLLM's block hashing."""
    hasher = BlockHasher("sha256", BLOCK, hash_seed="0")
    uses: Counter[bytes] = Counter()
    lengths = []
    hit_tokens = 0
    for r in reqs:
        toks = tok.chat_tokens(r.messages)
        lengths.append(len(toks))
        hashes = hasher.block_hashes(toks)
        lead = next((i for i, h in enumerate(hashes) if h not in uses), len(hashes))
        hit_tokens += BLOCK * min(lead, max_hit_blocks(len(toks), BLOCK))
        uses.update(set(hashes))
    reusable = sum(1 for n in uses.values() if n >= 2)
    return Sizing(len(reqs), statistics.fmean(lengths), max(lengths), len(uses), reusable,
                  hit_tokens / sum(lengths))


# -- one run -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RunResult:
    routing: str
    wall_s: float
    outcomes: list[Result]
    kv_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> list[Result]:
        return [o for o in self.outcomes if o.status == 200]

    @property
    def failures(self) -> int:
        return len(self.outcomes) - len(self.ok)

    @property
    def cached_ratio(self) -> float:
        prompt = sum(o.prompt_tokens for o in self.ok)
        return sum(o.cached_tokens for o in self.ok) / prompt if prompt else 0.0

    def latency_ms(self, q: float | None = None) -> float:
        lat = sorted(o.latency_s for o in self.ok)
        if not lat:
            return float("nan")
        if q is None:
            return 1000 * statistics.fmean(lat)
        return 1000 * lat[min(len(lat) - 1, int(q * len(lat)))]

    def per_replica(self, names: dict[str, str]) -> dict[str, int]:
        c = Counter(names.get(o.deployment, o.deployment or "?") for o in self.ok)
        return dict(sorted(c.items()))

    def summary(self, names: dict[str, str]) -> dict[str, Any]:
        return {
            "routing": self.routing, "requests": len(self.outcomes), "failures": self.failures,
            "prompt_tokens": sum(o.prompt_tokens for o in self.ok),
            "cached_tokens": sum(o.cached_tokens for o in self.ok),
            "cached_ratio": round(self.cached_ratio, 6),
            "latency_mean_ms": round(self.latency_ms(), 1), "latency_p95_ms": round(self.latency_ms(0.95), 1),
            "per_replica": self.per_replica(names), "wall_s": round(self.wall_s, 1),
            **({"kv_metrics": self.kv_metrics} if self.kv_metrics else {}),
        }


async def send(client: httpx.AsyncClient, url: str, group: str, req: FleetRequest, max_tokens: int) -> Result:
    body = {"model": group, "messages": req.messages, "max_tokens": max_tokens, "temperature": 0}
    t0 = time.perf_counter()
    try:
        r = await client.post(url, json=body, headers=HEADERS)
    except httpx.HTTPError:
        return Result(time.perf_counter() - t0, 0, 0, "", 0)
    lat = time.perf_counter() - t0
    if r.status_code != 200:
        return Result(lat, 0, 0, r.headers.get("x-litellm-model-id", ""), r.status_code)
    usage = r.json().get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Result(lat, int(usage.get("prompt_tokens") or 0), int(cached),
                   r.headers.get("x-litellm-model-id", ""), 200)


async def run_once(proxy: Proxy, group: str, reqs: list[FleetRequest], concurrency: int,
                   max_tokens: int) -> RunResult:
    """Requests start in order, at most ``concurrency`` at once; a request with ``after`` starts
    only once that one has finished."""
    url = f"{proxy.url}/v1/chat/completions"
    done = [asyncio.Event() for _ in reqs]
    outcomes: list[Result | None] = [None] * len(reqs)
    sem = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=180) as client:
        async def one(r: FleetRequest) -> None:
            try:
                if r.after is not None:
                    await done[r.after].wait()
                async with sem:
                    outcomes[r.rid] = await send(client, url, group, r, max_tokens)
            finally:
                done[r.rid].set()

        tasks = []
        for r in reqs:
            tasks.append(asyncio.create_task(one(r)))
            await asyncio.sleep(0)  # let earlier requests take the semaphore first (arrival order)
        await asyncio.gather(*tasks)
    return RunResult(group, time.perf_counter() - t0, [o for o in outcomes if o is not None])


# -- fleet ---------------------------------------------------------------------------------------------


def proxy_config(replicas: Sequence[EngineReplica], tokenizer: str) -> dict[str, Any]:
    """Two groups over the same replicas; the KV group uses litellm-kv's defaults. ``tokenizer``: a
    directory (local tokenizer, verified against the engine at start-up) or ``engine``."""
    kv = {"tokenizer": "engine"} if tokenizer == "engine" else {"tokenizer_path": tokenizer}
    model_list = [
        {"model_name": group,
         "litellm_params": {"model": "hosted_vllm/tiny", "api_base": r.api_base, "api_key": "none"},
         "model_info": {"id": f"{group}-{i}"}}
        for group in (KV, SHUFFLE) for i, r in enumerate(replicas)
    ]
    return {
        "model_list": model_list,
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 1},
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"], "request_timeout": 180},
        "litellm_kv": {"mode": "embedded",
                       "model_groups": {KV: {"routing": "kv", "kv": kv}}},
    }


async def kv_counters(proxy: Proxy) -> dict[str, float]:
    """The KV group's prediction-check and decision counters (cumulative)."""
    wanted = ("litellm_kv_prediction_checks_total", "litellm_kv_routing_decisions_total",
              "litellm_kv_predicted_cached_tokens_total", "litellm_kv_actual_cached_tokens_total")
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"{proxy.url}/litellm-kv/metrics", headers=HEADERS)).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(wanted) and f'model_group="{KV}"' in line:
            name, _, value = line.rpartition(" ")
            out[name.replace(f'model_group="{KV}",', "").replace(f',model_group="{KV}"', "")
                .replace(f'{{model_group="{KV}"}}', "")] = float(value)
    return out


# -- report --------------------------------------------------------------------------------------------


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def fmt_ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def print_table(name: str, size: Sizing, runs: list[RunResult], names: dict[str, str]) -> None:
    print(f"\n== {name}: {size.requests} requests, prompts {size.prompt_tokens_mean:.0f} tokens mean "
          f"(max {size.prompt_tokens_max}), {size.distinct_blocks} distinct / {size.reusable_blocks} reusable "
          f"blocks, cached-ratio ceiling (one infinite cache) {size.ceiling:.3f}")
    print(f"{'routing':<16} {'cached':>7} {'mean ms':>8} {'p95 ms':>8} {'failed':>6} {'wall s':>7}  per replica")
    for r in runs:
        per = " ".join(f"{k}={v}" for k, v in r.per_replica(names).items())
        print(f"{r.routing:<16} {r.cached_ratio:>7.3f} {r.latency_ms():>8.0f} {r.latency_ms(0.95):>8.0f} "
              f"{r.failures:>6} {r.wall_s:>7.1f}  {per}")
    base, kv = runs
    print(f"litellm-kv / shuffle: cached {fmt_ratio(ratio(kv.cached_ratio, base.cached_ratio))}, "
          f"mean latency {fmt_ratio(ratio(kv.latency_ms(), base.latency_ms()))}, "
          f"p95 {fmt_ratio(ratio(kv.latency_ms(0.95), base.latency_ms(0.95)))}")
    checks = {k.split("outcome=")[1].strip('"}'): int(v) for k, v in kv.kv_metrics.items()
              if k.startswith("litellm_kv_prediction_checks_total") and v}
    reasons = {k.split("reason=")[1].strip('"}'): int(v) for k, v in kv.kv_metrics.items()
               if k.startswith("litellm_kv_routing_decisions_total") and v}
    print(f"litellm-kv prediction checks {checks}; decisions {reasons}")


def print_sizing(workloads: list[tuple[Shape, list[FleetRequest], Sizing]], text: BlockText, blocks: int, bs: int,
                 args: argparse.Namespace) -> None:
    print(f"[fleet] {args.replicas} replicas x {blocks} blocks of {bs} tokens ({args.kv_cache} each): one "
          f"replica holds {blocks * bs} tokens, the fleet {blocks * bs * args.replicas}; block text = "
          f"{text.words} pseudo-words ({text.tokens_per_word:.2f} tokens/word)", flush=True)
    for s, _, size in workloads:
        fits = ("overflows one replica" if size.reusable_blocks > blocks else "fits one replica") + ", " + (
            "fits the fleet" if size.reusable_blocks <= blocks * args.replicas else "overflows the fleet")
        print(f"[fleet] {s.name}: {size.requests} requests, prompts {size.prompt_tokens_mean:.0f} tokens mean "
              f"(max {size.prompt_tokens_max}), {size.reusable_blocks} reusable / {size.distinct_blocks} distinct "
              f"blocks -> reusable set {fits}; ceiling (one infinite cache) {size.ceiling:.3f}", flush=True)


def markdown(results: dict[str, Any]) -> str:
    lines = ["| workload (ceiling) | routing | cached ratio | mean ms | p95 ms | failed | per replica "
             "| kv / shuffle: cached, mean, p95 |",
             "|---|---|---|---|---|---|---|---|"]
    for name, w in results["workloads"].items():
        for run in w["runs"]:
            per = " ".join(f"{k}={v}" for k, v in run["per_replica"].items())
            rat = ""
            if run["routing"] == "litellm-kv":
                r = w["ratios"]
                rat = f"{fmt_ratio(r['cached'])}, {fmt_ratio(r['latency_mean'])}, {fmt_ratio(r['latency_p95'])}"
            lines.append(f"| {name} ({w['sizing']['ceiling']:.2f}) | {run['routing']} | {run['cached_ratio']:.3f} | "
                         f"{run['latency_mean_ms']:.0f} | "
                         f"{run['latency_p95_ms']:.0f} | {run['failures']} | {per} | {rat} |")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    chosen = [s for s in shapes() if s.name in args.workloads.split(",")]
    if not chosen:
        raise SystemExit(f"no workload among {args.workloads!r}")
    load_before = os.getloadavg()
    tok_dir = ensure_model()  # its tokenizer.json is the engine's own (tools/engine/build_model.py checks)
    tok = LocalChatTokenizer(tok_dir)
    text = BlockText(tok)
    workloads = [(s, reqs, sizing(reqs, tok)) for s in chosen for reqs in [to_requests(s, s.make(), text)]]
    if args.dry_run:
        print_sizing(workloads, text, DRY_RUN_BLOCKS, BLOCK, args)
        return 0
    replicas = start_replicas(args.replicas, kv_cache_bytes=args.kv_cache, block_size=BLOCK,
                              env={"VLLM_SERVER_DEV_MODE": "1"}, name_prefix="fleet")
    proxy: Proxy | None = None
    try:
        async with EngineClient(replicas[0].url) as ec:
            info = await ec.metrics()
        blocks, bs = int(info.num_gpu_blocks or 0), int(info.block_size or 0)
        print_sizing(workloads, text, blocks, bs, args)
        proxy = start_proxy(proxy_config(replicas, "engine" if args.tokenizer == "engine" else str(tok_dir)),
                            name="bench-fleet-proxy")
        path_used = proxy.wait_kv_exact(KV, timeout=90).get("tokenizer", "?")
        print(f"[fleet] litellm-kv tokenizer path: {path_used}", flush=True)
        names = {f"{g}-{i}": f"r{i}" for g in (KV, SHUFFLE) for i in range(len(replicas))}
        out: dict[str, Any] = {
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "command": "benchmarks/bench_fleet.py " + " ".join(sys.argv[1:]),
            "replicas": args.replicas, "kv_cache_bytes": args.kv_cache, "blocks_per_replica": blocks,
            "block_size": bs, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
            "kv_tokenizer": path_used, "order": "litellm-kv first" if args.kv_first else "shuffle first",
            "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
            "block_text_words": text.words, "workloads": {},
        }
        failures = 0
        for s, reqs, size in workloads:
            runs = []
            order = [("shuffle", SHUFFLE), ("litellm-kv", KV)]
            for label, group in (order[::-1] if args.kv_first else order):
                reset_prefix_caches(replicas, settle_s=1.0)  # AllBlocksCleared reaches the index
                before = await kv_counters(proxy) if group == KV else {}
                print(f"[fleet] {s.name}: {len(reqs)} requests via {label}", flush=True)
                run = await run_once(proxy, group, reqs, args.concurrency, args.max_tokens)
                run.routing = label
                if group == KV:
                    await asyncio.sleep(0.5)  # success callbacks record the checks after the response
                    after = await kv_counters(proxy)
                    run.kv_metrics = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
                runs.append(run)
                failures += run.failures
            runs.sort(key=lambda r: r.routing != "shuffle")  # tables: shuffle first whatever the order
            print_table(s.name, size, runs, names)
            base, kv = runs
            out["workloads"][s.name] = {
                "shape": s.describe, "sizing": asdict(size),
                "runs": [r.summary(names) for r in runs],
                "ratios": {"cached": ratio(kv.cached_ratio, base.cached_ratio),
                           "latency_mean": ratio(kv.latency_ms(), base.latency_ms()),
                           "latency_p95": ratio(kv.latency_ms(0.95), base.latency_ms(0.95))},
            }
        out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        out["total_wall_s"] = round(time.monotonic() - t_start, 1)
        print("\n" + markdown(out))
        print(f"\n[fleet] total wall time {out['total_wall_s']} s; load average before {out['loadavg_before']}, "
              f"after {out['loadavg_after']} ({out['cpus']} CPUs)")
        suffix = "" if args.replicas == 2 else f"-r{args.replicas}"
        path = Path(args.json or f"docs/bench/fleet-{dt.date.today().isoformat()}{suffix}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"[fleet] wrote {path}")
        return 0 if failures == 0 else 1
    finally:
        if proxy is not None:
            proxy.stop()
        stop_replicas(replicas)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=2, choices=(2, 3))
    ap.add_argument("--kv-cache", default="8M", help="KV cache bytes per replica (8M = 256 blocks of 32 tokens)")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight at most")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--workloads", default=",".join(s.name for s in shapes()))
    ap.add_argument("--tokenizer", choices=("local", "engine"), default="local",
                    help="litellm-kv's tokenizer: local (engine-matching tokenizer.json) or the engine's /tokenize")
    ap.add_argument("--kv-first", action="store_true",
                    help="run each workload through litellm-kv before shuffle (checks order effects on latency)")
    ap.add_argument("--dry-run", action="store_true", help="print the workloads' sizing only (no engines)")
    ap.add_argument("--json", default="", help="output path (default docs/bench/fleet-<date>[-r3].json)")
    return asyncio.run(main_async(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
