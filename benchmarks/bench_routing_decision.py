"""One routing decision, in process: local tokenization (segment memo) + block hashing (prefix memo) +
index lookup + cost, at 1K/8K/32K-token prompts, memory (embedded) vs Redis (shared) backends.

Two request shapes per size:

* ``first``: a conversation never seen before (every text new: tokenizer and hasher memos miss),
  whose leading half is held by one replica in the index;
* ``growing``: the next turn of a conversation whose previous turn was routed (memos hit for the
  history; only the new ~100 tokens are tokenized and hashed).

The whole decision is timed through ``KVRoutingHandler.filter_deployments`` — the code LiteLLM calls
— with the group's runtime assembled in process (no LiteLLM, no engines: replica facts are set as the
fleet would learn them from ``vllm:cache_config_info``). A second pass with fresh prompts of the same
shape times each stage alone. The index holds ``--background`` unrelated blocks per replica, and the
blocks of each routed prompt are stored on the chosen replica afterwards, as the engine's KV events
would. Redis is a real ``redis-server`` on a free port.

    .venv/bin/python benchmarks/bench_routing_decision.py [--backends memory,redis] [--profile]

``--memory N`` instead makes N decisions on never-seen prompts (embedded index) and prints what the process
holds after them, at four points, by the source line that allocated it (``tracemalloc``): whether the
request path's memos, side index and per-call records stay within their bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from litellm_kv.config import Settings, parse_section
from litellm_kv.index.base import BlockOp, KVIndex, ReplicaMatch, Tier
from litellm_kv.integration.callback import _freeze_startup_heap
from litellm_kv.integration.routing_hooks import KVRoutingHandler
from litellm_kv.routing.cost import CostModel
from litellm_kv.routing.fleet import ReplicaState, replica_id
from litellm_kv.routing.group import KVGroup
from litellm_kv.routing.router import KVRouter
from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.hashing import BlockHasher
from litellm_kv.vllm.tokenization import LocalChatTokenizer

GROUP = "bench-kv"
BLOCK = 32  # the CPU engines' block size (tests and demo)
ALGO = "sha256"  # vLLM's default prefix-caching hash
API_BASES = ["http://127.0.0.1:18001/v1", "http://127.0.0.1:18002/v1"]  # never contacted
SIZES = (1024, 8192, 32768)
TURN_USER_WORDS, TURN_ASSISTANT_WORDS = 30, 20  # ~100 tokens per turn with the tiny model's BPE
_SYLLABLES = ("ka", "lo", "mi", "ru", "te", "son", "var", "pel", "dor", "qui", "zen", "bra", "tho", "gli", "nex")


def words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n))


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


@dataclass(slots=True)
class Cell:
    backend: str
    shape: str
    size: int
    total_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # this thread's CPU time: immune to a busy machine
    tokens: list[int] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=dict)

    def stage(self, name: str, ms: float) -> None:
        self.stages.setdefault(name, []).append(ms)


class Prompts:
    """Conversations of a target token size for the tiny model's tokenizer (calibrated once)."""

    def __init__(self, tok: LocalChatTokenizer, seed: int) -> None:
        self.rng = random.Random(seed)
        sample = words(random.Random(0), 2000)
        n = len(tok.chat_tokens([{"role": "user", "content": sample}]))
        self.tokens_per_word = n / 2000

    def first(self, size: int) -> list[dict[str, Any]]:
        """A brand-new conversation of about ``size`` tokens: system prompt + one user turn."""
        system_words = max(8, int((size - 100) / self.tokens_per_word))
        return [
            {"role": "system", "content": f"You are assistant {self.rng.getrandbits(48):x}. "
             + words(self.rng, system_words)},
            {"role": "user", "content": words(self.rng, TURN_USER_WORDS)},
        ]

    def turn(self, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``history`` plus the previous reply and a new user message (~100 tokens more)."""
        return [*history, {"role": "assistant", "content": words(self.rng, TURN_ASSISTANT_WORDS)},
                {"role": "user", "content": words(self.rng, TURN_USER_WORDS)}]


class Bench:
    """The KV routing handler of one group, assembled in process over a given backend."""

    def __init__(self, backend: str, redis_url: str | None, model_dir: str) -> None:
        self.backend = backend
        settings = parse_section(Settings, {
            "mode": "embedded" if backend == "memory" else "shared", "redis_url": redis_url,
            "model_groups": {GROUP: {"routing": "kv", "kv": {"tokenizer_path": model_dir, "verify_every": 0}}},
        }, "litellm_kv")
        self.handler = KVRoutingHandler(settings)
        self.model_dir = model_dir
        self.deployments: list[dict[str, Any]] = [
            {"model_name": GROUP, "litellm_params": {"model": "hosted_vllm/tiny", "api_base": b, "api_key": "x"},
             "model_info": {"id": f"dep-{i}"}}
            for i, b in enumerate(API_BASES)
        ]
        self.replicas = [replica_id(b) for b in API_BASES]
        self.calls = 0
        self._engine_tok: LocalChatTokenizer | None = None
        self._engine_hasher = BlockHasher(ALGO, BLOCK)

    async def start(self) -> None:
        h = self.handler
        # What KVRoutingHandler.startup builds, minus LiteLLM's router and the engine discovery.
        if self.backend == "memory":
            from litellm_kv.index.memory import InMemoryIndex

            h.index = InMemoryIndex()
        else:
            from litellm_kv.index.redis import RedisIndex

            assert h.settings.redis_url
            h.index = RedisIndex(h.settings.redis_url)
        g = KVGroup(GROUP, h.options[GROUP], h.index, h.settings.redis_url, self.backend == "memory", h.backend)
        for d, rid in zip(self.deployments, self.replicas, strict=True):
            base = d["litellm_params"]["api_base"].removesuffix("/v1")
            g.fleet.replicas[rid] = ReplicaState(rid, d["model_info"]["id"], base, EngineClient(base),
                                                 block_size=BLOCK, hash_algo=ALGO, prefix_caching=True,
                                                 ready=True)
        g.fleet._refresh_exactness()
        assert g.fleet.hasher() is not None, g.fleet.not_exact_why
        g.deployment_ids = frozenset(str(d["model_info"]["id"]) for d in self.deployments)
        g.tokenizer = LocalChatTokenizer(self.model_dir)
        g.tokenizer_state = "local (benchmark)"
        h.groups[GROUP] = g

    @property
    def group(self) -> KVGroup:
        return self.handler.groups[GROUP]

    @property
    def index(self) -> KVIndex:
        assert self.handler.index is not None
        return self.handler.index

    async def background(self, blocks_per_replica: int, rng: random.Random) -> None:
        for rid in self.replicas:
            for start in range(0, blocks_per_replica, 4096):
                n = min(4096, blocks_per_replica - start)
                await self.index.apply(GROUP, rid, [BlockOp(tuple(rng.getrandbits(64) for _ in range(n)),
                                                            Tier.GPU, +1)])

    async def store(self, replica: str, messages: list[dict[str, Any]], fraction: float = 1.0) -> None:
        """The engine's BlockStored for (a leading fraction of) this prompt on ``replica``.

        Computed with the engine side's own tokenizer and hasher, so the handler's memos stay as
        cold as they would be in the proxy."""
        if self._engine_tok is None:
            self._engine_tok = LocalChatTokenizer(self.model_dir)
        ids = self._engine_tok.chat_tokens(messages)
        hashes = self._engine_hasher.wire_hashes(ids[: int(len(ids) * fraction)])
        if hashes:
            await self.index.apply(GROUP, replica, [BlockOp(tuple(hashes), Tier.GPU, +1)])

    async def decide(self, messages: list[dict[str, Any]]) -> tuple[float, float, str]:
        """One timed ``filter_deployments`` call: (wall ms, CPU ms, chosen replica); releases its load."""
        self.calls += 1
        kwargs: dict[str, Any] = {"model": GROUP, "messages": messages, "max_tokens": 8,
                                  "litellm_call_id": f"bench-{self.calls}", "metadata": {}}
        c0, t0 = time.thread_time(), time.perf_counter()
        out = await self.handler.filter_deployments(GROUP, self.deployments, messages, kwargs)
        ms, cpu = 1000 * (time.perf_counter() - t0), 1000 * (time.thread_time() - c0)
        assert out and len(out) == 1
        route = kwargs["metadata"]["litellm_kv_route"]
        assert route["fallback"] is None, route
        await self.handler.post_success_deployment(kwargs, None)
        return ms, cpu, str(route["replica"])

    async def stages(self, cell: Cell, messages: list[dict[str, Any]], tok: LocalChatTokenizer,
                     hasher: BlockHasher, cost: CostModel) -> None:
        """Each stage of one decision timed alone (own tokenizer/hasher: same memo state as the handler's)."""
        t0 = time.perf_counter()
        ids = tok.chat_tokens(messages)
        t1 = time.perf_counter()
        hashes = hasher.wire_hashes(ids)
        t2 = time.perf_counter()
        matches = await self.index.lookup(GROUP, hashes, self.replicas)
        t3 = time.perf_counter()
        loads = await self.group.load.snapshot(GROUP, self.replicas)
        t4 = time.perf_counter()
        cands = [KVRouter._candidate(r, matches.get(r, ReplicaMatch()), loads.get(r), None, 0) for r in self.replicas]
        cost.choose(prompt_tokens=len(ids), block_size=BLOCK, candidates=cands)
        t5 = time.perf_counter()
        for name, a, b in (("tokenize", t0, t1), ("hash", t1, t2), ("lookup", t2, t3), ("load", t3, t4),
                           ("cost", t4, t5)):
            cell.stage(name, 1000 * (b - a))


async def run_backend(backend: str, redis_url: str | None, model_dir: str, args: argparse.Namespace) -> list[Cell]:
    bench = Bench(backend, redis_url, model_dir)
    await bench.start()
    rng = random.Random(5)
    await bench.background(args.background, rng)
    g = bench.group
    assert g.tokenizer is not None
    prompts = Prompts(g.tokenizer, seed=1)
    stage_tok = LocalChatTokenizer(model_dir)
    stage_hasher = BlockHasher(ALGO, BLOCK)
    cost = g.router.cost  # the group's own cost model (the default: TTFT)
    if not args.no_freeze:
        _freeze_startup_heap()  # what the proxy does once its start-up is done (freeze_startup_heap)
    cells: list[Cell] = []
    for size in SIZES:
        n = {1024: args.decisions, 8192: args.decisions // 2}.get(size, max(10, args.decisions // 8))
        # first call: a new conversation whose leading half (a shared system prompt in practice) is held.
        cell = Cell(backend, "first", size)
        for i in range(n):
            msgs = prompts.first(size)
            await bench.store(bench.replicas[i % 2], msgs, 0.5)
            ms, cpu, _ = await bench.decide(msgs)
            cell.total_ms.append(ms)
            cell.cpu_ms.append(cpu)
            cell.tokens.append(len(g.tokenizer.chat_tokens(msgs)))  # memo-warm: after the timed call
            other = prompts.first(size)
            await bench.store(bench.replicas[i % 2], other, 0.5)
            await bench.stages(cell, other, stage_tok, stage_hasher, cost)
        cells.append(cell)
        # growing conversation: each call is the previous turn + ~100 tokens, previous turn routed.
        cell = Cell(backend, "growing", size)
        convs = max(2, n // args.turns)
        for _ in range(convs):
            msgs = prompts.first(size)
            _, _, chosen = await bench.decide(msgs)  # the conversation's first call, not counted
            await bench.store(chosen, msgs)
            s_msgs = prompts.first(size)
            await bench.stages(Cell(backend, "", 0), s_msgs, stage_tok, stage_hasher, cost)
            for _ in range(args.turns):
                msgs = prompts.turn(msgs)
                ms, cpu, chosen = await bench.decide(msgs)
                await bench.store(chosen, msgs)
                cell.total_ms.append(ms)
                cell.cpu_ms.append(cpu)
                cell.tokens.append(len(g.tokenizer.chat_tokens(msgs)))
                s_msgs = prompts.turn(s_msgs)
                await bench.stages(cell, s_msgs, stage_tok, stage_hasher, cost)
        cells.append(cell)
        print(f"  {backend:<6} {size:>6}-token cells done", flush=True)
    if args.profile:
        await profile(bench, prompts, args.profile_size)
    close = getattr(bench.index, "close", None)
    if close is not None:
        await close()
    return cells


async def profile(bench: Bench, prompts: Prompts, size: int) -> None:
    """cProfile of first-call decisions at ``size`` tokens (where the time goes, by function)."""
    msgs_list = [prompts.first(size) for _ in range(20)]
    for i, m in enumerate(msgs_list):
        await bench.store(bench.replicas[i % 2], m, 0.5)
    pr = cProfile.Profile()

    async def go() -> None:
        for m in msgs_list:
            await bench.decide(m)

    pr.enable()
    await go()
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(14)
    print(f"\ncProfile, {bench.backend} backend, 20 first-call decisions at {size} tokens (by own time):")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])


async def memory(model_dir: str, n: int, size: int) -> None:
    """What ``n`` never-seen decisions of ``size`` tokens leave held (the memory backend; nothing is stored in
    the index beyond the background, so the index does not grow)."""
    import gc
    import tracemalloc

    bench = Bench("memory", None, model_dir)
    await bench.start()
    assert bench.group.tokenizer is not None
    prompts = Prompts(bench.group.tokenizer, seed=1)
    for _ in range(5):
        await bench.decide(prompts.first(size))
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    print(f"\nMemory held after never-seen {size}-token decisions (tracemalloc, after a full collection):")
    print(f"{'decisions':>9} {'held MB':>8} {'KB each':>8}  largest holders by allocating line (MB)")
    marks = sorted({max(1, n // 4), max(1, n // 2), max(1, 3 * n // 4), n})
    done = 0
    for mark in marks:
        while done < mark:
            await bench.decide(prompts.first(size))
            done += 1
        gc.collect()
        diff = tracemalloc.take_snapshot().compare_to(base, "lineno")
        held = sum(d.size_diff for d in diff)
        top = sorted(diff, key=lambda d: -d.size_diff)[:4]
        where = "; ".join(f"{Path(d.traceback[0].filename).name}:{d.traceback[0].lineno} {d.size_diff / 1e6:.1f}"
                          for d in top)
        print(f"{done:>9} {held / 1e6:>8.1f} {held / done / 1e3:>8.1f}  {where}", flush=True)
    tracemalloc.stop()
    tok = bench.group.tokenizer
    print(f"tokenizer memo: {sum(map(len, tok._cache.values()))} token ids in {len(tok._cache)} segments; "
          f"calls kept for late callbacks: {len(bench.handler.routes)}; sibling entries: "
          f"{len(bench.group.router.siblings)}")


def report(cells: list[Cell]) -> None:
    print("\nWhole decision (KVRoutingHandler.filter_deployments), wall ms, and CPU ms of the proxy thread:")
    print(f"{'backend':<8} {'shape':<8} {'target':>7} {'tokens':>7} {'n':>4} {'p50':>7} {'p95':>7} {'p99':>7} "
          f"{'max':>7}  {'cpu p50':>7} {'cpu p99':>7}")
    for c in cells:
        print(f"{c.backend:<8} {c.shape:<8} {c.size:>7} {int(statistics.median(c.tokens)):>7} {len(c.total_ms):>4} "
              f"{pct(c.total_ms, .5):>7.2f} {pct(c.total_ms, .95):>7.2f} {pct(c.total_ms, .99):>7.2f} "
              f"{max(c.total_ms):>7.2f}  {pct(c.cpu_ms, .5):>7.2f} {pct(c.cpu_ms, .99):>7.2f}")
    names = ("tokenize", "hash", "lookup", "load", "cost")
    print("\nStages timed alone (same shapes, fresh prompts), p50 / p99 ms:")
    print(f"{'backend':<8} {'shape':<8} {'target':>7} " + " ".join(f"{n:>15}" for n in names))
    for c in cells:
        cols = " ".join(f"{pct(c.stages[n], .5):>7.3f}/{pct(c.stages[n], .99):>7.3f}" for n in names)
        print(f"{c.backend:<8} {c.shape:<8} {c.size:>7} {cols}")
    for c in cells:
        if c.size == 8192:
            print(f"p99 at 8K, {c.backend} {c.shape}: wall {pct(c.total_ms, .99):.2f} ms, CPU "
                  f"{pct(c.cpu_ms, .99):.2f} ms (target < 5 ms)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--backends", default="memory,redis")
    ap.add_argument("--decisions", type=int, default=200, help="decisions per 1K cell (fewer for larger sizes)")
    ap.add_argument("--turns", type=int, default=10, help="timed turns per growing conversation")
    ap.add_argument("--background", type=int, default=50_000, help="unrelated indexed blocks per replica")
    ap.add_argument("--no-freeze", action="store_true",
                    help="do not gc.freeze() after set-up (as a proxy with freeze_startup_heap: false)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile summary of 8K first-call decisions")
    ap.add_argument("--profile-size", type=int, default=8192)
    ap.add_argument("--model-dir", default=None, help="tokenizer directory (default: the tests' tiny model)")
    ap.add_argument("--memory", type=int, default=0, metavar="N",
                    help="instead of timing: what N never-seen decisions leave held in memory")
    ap.add_argument("--memory-size", type=int, default=8192, help="prompt tokens of the --memory decisions")
    args = ap.parse_args()
    from tools.harness.engines import ensure_model

    model_dir = args.model_dir or str(ensure_model())
    if args.memory:
        asyncio.run(memory(model_dir, args.memory, args.memory_size))
        return 0
    cells: list[Cell] = []
    for backend in args.backends.split(","):
        if backend == "redis":
            from tools.harness.redis_server import RedisServer

            srv = RedisServer(name="bench-decision-redis")
            try:
                cells += asyncio.run(run_backend(backend, srv.url, model_dir, args))
            finally:
                srv.stop()
        else:
            cells += asyncio.run(run_backend(backend, None, model_dir, args))
    report(cells)
    return 0

if __name__ == "__main__":
    sys.exit(main())
