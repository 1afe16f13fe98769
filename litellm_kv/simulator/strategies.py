"""Routing strategies compared by the simulator.

``litellm-kv`` and ``dynamo`` are exact: they learn what each replica caches only from the
replicas' KV events, through the project's own decoder (:func:`litellm_kv.vllm.events.decode_event_batch`,
:func:`~litellm_kv.vllm.events.to_block_ops`) and in-memory index. ``litellm-kv`` then decides with
the project's real :class:`~litellm_kv.routing.cost.CostModel`, :class:`SiblingIndex` and
:class:`InMemoryLoadTracker`, with the same defaults a user gets.

The others are models of the field's routers as their code and docs describe them
(``docs/benchmarks.md`` lists what each keeps and how it picks). Strategies that work on
characters (production-stack ``prefixaware``, SGLang ``cache_aware``) run on token blocks
here: traces carry no text.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from litellm_kv.index.base import KVIndex
from litellm_kv.routing.cost import Candidate, CostModel, CostSettings
from litellm_kv.routing.gauges import GaugeAging
from litellm_kv.routing.hold import PrefixDemand
from litellm_kv.routing.load import InMemoryLoadTracker, LoadSettings
from litellm_kv.routing.siblings import SiblingIndex
from litellm_kv.routing.ttft import EngineTimings, RateBook, TtftSettings
from litellm_kv.simulator.interface import Gauges, Strategy
from litellm_kv.simulator.workload import SimRequest
from litellm_kv.vllm.events import AllBlocksCleared, decode_event_batch, to_block_ops

GROUP = "sim"


class BaseStrategy:
    """Base: router-side in-flight accounting every strategy can see (requests it sent that
    have not finished, their prefill tokens before the first token, their blocks)."""

    name = "base"
    listens_to_events = False

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.replicas: list[str] = []
        self.block_size = 16
        self.clock: Callable[[], float] = lambda: 0.0
        self.inflight: list[int] = []
        self.prefill_tokens: list[int] = []
        self.active_blocks: list[int] = []
        self._pending: dict[int, int] = {}  # rid -> prefill tokens counted

    async def start(self, replicas: list[str], block_size: int, clock: Callable[[], float]) -> None:
        self.replicas = replicas
        self.block_size = block_size
        self.clock = clock
        n = len(replicas)
        self.inflight = [0] * n
        self.prefill_tokens = [0] * n
        self.active_blocks = [0] * n

    async def route(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        idx, predicted = self.pick(req, gauges)
        self.sent(req, idx, req.prompt_tokens - max(0, predicted))
        return idx, predicted

    def pick(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        raise NotImplementedError

    def sent(self, req: SimRequest, idx: int, prefill: int) -> None:
        self.inflight[idx] += 1
        self.prefill_tokens[idx] += prefill
        self.active_blocks[idx] += len(req.blocks) + 1
        self._pending[req.rid] = prefill

    async def on_kv_events(self, replica: str, payload: bytes) -> None:
        return None

    def on_scrape(self) -> None:
        return None

    async def on_first_token(self, req: SimRequest, idx: int) -> None:
        self.prefill_tokens[idx] -= self._pending.pop(req.rid, 0)

    async def on_finish(self, req: SimRequest, idx: int) -> None:
        self.inflight[idx] -= 1
        self.active_blocks[idx] -= len(req.blocks) + 1

    def least_inflight(self) -> int:
        best = min(self.inflight)
        return self.rng.choice([i for i, v in enumerate(self.inflight) if v == best])


class RandomChoice(BaseStrategy):
    """LiteLLM's default ``simple-shuffle`` (equal weights)."""

    name = "random"

    def pick(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        return self.rng.randrange(len(self.replicas)), -1


class PromptCachingNoMarkers(RandomChoice):
    """LiteLLM ``prompt_caching`` routing as it behaves without ``cache_control`` markers:
    no key, so no pin — simple-shuffle underneath."""

    name = "litellm-prompt-caching"


class RoundRobin(BaseStrategy):
    name = "round-robin"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._next = 0

    def pick(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        i = self._next % len(self.replicas)
        self._next += 1
        return i, -1


class LeastLoaded(BaseStrategy):
    """Fewest in-flight requests (LiteLLM ``least-busy``), random tie-break."""

    name = "least-loaded"

    def pick(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        return self.least_inflight(), -1


class SessionAffinity(BaseStrategy):
    """LiteLLM session affinity: the first request of a session is shuffled, later ones
    follow the pin (first writer wins, no re-pin, no load check)."""

    name = "litellm-session-affinity"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._pin: dict[str, int] = {}

    def pick(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        idx = self._pin.get(req.session)
        if idx is None:
            idx = self._pin[req.session] = self.rng.randrange(len(self.replicas))
        return idx, -1


class PrefixAware(BaseStrategy):
    """vLLM production-stack ``prefixaware``: a trie of chunks with the replicas that were sent
    each chunk; longest match wins, random tie-break among its holders, random when nothing
    matches; entries are never evicted or deleted. Chunks are token blocks here."""

    name = "production-stack-prefixaware"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._holders: dict[int, set[int]] = {}

    def pick(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        holders = self._holders
        best: set[int] | None = None
        for b in req.blocks:
            h = holders.get(b)
            if not h:
                break
            best = h
        idx = self.rng.choice(sorted(best)) if best else self.rng.randrange(len(self.replicas))
        for b in req.blocks:
            holders.setdefault(b, set()).add(idx)
        return idx, -1


class SGLangCacheAware(BaseStrategy):
    """SGLang model gateway ``cache_aware``: an approximate tree per replica of what was sent
    there (LRU-trimmed to ``max_tree_tokens`` every ``eviction_interval_s``); shortest queue
    when loads are imbalanced (max−min > 64 and max > 1.5·min in-flight requests); else the
    best match if its match rate exceeds ``cache_threshold``; else the smallest tree.

    Ties are broken as SGLang's router breaks them, in orders that are fixed, not drawn per request:
    the shortest queue is the first worker in its list with the fewest requests; the smallest tree
    is the first in the iteration order of its tenant-size hash map (fixed for a process: a
    permutation drawn once per run here); the best match is the first tenant in the hash map of
    the tree node where the match ends (fixed per node: here per deepest matched block).
    ``random_ties``: each tie drawn at random instead (this model before 2026-12-07)."""

    name = "sglang-cache-aware"

    def __init__(self, seed: int = 0, cache_threshold: float = 0.5, balance_abs: int = 64,
                 balance_rel: float = 1.5, max_tree_tokens: int = 2**24 // 4,
                 eviction_interval_s: float = 120.0, random_ties: bool = False) -> None:
        super().__init__(seed)
        self.random_ties = random_ties
        self._rank: list[int] = []  # each replica's place in the tenant-size map's iteration order
        self._salt = 0  # the per-node tenant orders
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.max_tree_tokens = max_tree_tokens
        self.eviction_interval_s = eviction_interval_s
        self._trees: list[OrderedDict[int, None]] = []
        self._next_evict = eviction_interval_s

    async def start(self, replicas: list[str], block_size: int, clock: Callable[[], float]) -> None:
        await super().start(replicas, block_size, clock)
        self._trees = [OrderedDict() for _ in replicas]
        if not self.random_ties:  # (the earlier model's random draws stay as they were)
            order = list(range(len(replicas)))
            self.rng.shuffle(order)
            self._rank = [order.index(i) for i in range(len(replicas))]
            self._salt = self.rng.getrandbits(64)

    def _break_tie(self, tied: list[int], order: Callable[[int], int]) -> int:
        """The first of ``tied`` in ``order``, as SGLang takes it; with ``random_ties`` a draw (the earlier model)."""
        return self.rng.choice(tied) if self.random_ties else min(tied, key=order)

    def pick(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        now = self.clock()
        if now >= self._next_evict:
            self._next_evict = now + self.eviction_interval_s
            cap = self.max_tree_tokens // self.block_size
            for tree in self._trees:
                while len(tree) > cap:
                    tree.popitem(last=False)
        hi, lo = max(self.inflight), min(self.inflight)
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            idx = self._break_tie([i for i, v in enumerate(self.inflight) if v == lo], int)  # the list's order
        else:
            matches = []
            for tree in self._trees:
                n = 0
                for b in req.blocks:
                    if b not in tree:
                        break
                    n += 1
                matches.append(n)
            best = max(matches)
            rate = best / max(1, len(req.blocks))
            if best and rate > self.cache_threshold:
                node = req.blocks[best - 1]
                idx = self._break_tie([i for i, m in enumerate(matches) if m == best],
                                      lambda i: hash((self._salt, node, i)))
            else:
                sizes = [len(t) for t in self._trees]
                small = min(sizes)
                idx = self._break_tie([i for i, s in enumerate(sizes) if s == small], self._rank.__getitem__)
        tree = self._trees[idx]
        for b in req.blocks:
            tree[b] = None
            tree.move_to_end(b)
        return idx, -1


class LlmdApproximate(BaseStrategy):
    """llm-d's approximate prefix scorer: a router-side LRU per pod of 64-token block keys
    recorded at routing time (capacity ``lru_blocks``), combined as llm-d's default scheduling
    profile does with a queue scorer and a KV-utilisation scorer (weights 3 : 2 : 2)."""

    name = "llm-d-approximate"

    def __init__(self, seed: int = 0, chunk_tokens: int = 64, lru_blocks: int = 31_250,
                 weights: tuple[float, float, float] = (3.0, 2.0, 2.0)) -> None:
        super().__init__(seed)
        self.chunk_tokens = chunk_tokens
        self.lru_blocks = lru_blocks
        self.weights = weights
        self._lru: list[OrderedDict[int, None]] = []

    async def start(self, replicas: list[str], block_size: int, clock: Callable[[], float]) -> None:
        await super().start(replicas, block_size, clock)
        self._lru = [OrderedDict() for _ in replicas]

    def pick(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        step = max(1, self.chunk_tokens // self.block_size)
        keys = req.blocks[step - 1::step]  # the chained id ending each 64-token chunk
        total = max(1, len(keys))
        wp, wq, wk = self.weights
        q = self.inflight
        qlo, qhi = min(q), max(q)
        best_score, ties = -1.0, [0]
        for i, lru in enumerate(self._lru):
            n = 0
            for k in keys:
                if k not in lru:
                    break
                n += 1
            queue = 1.0 if qhi == qlo else 1.0 - (q[i] - qlo) / (qhi - qlo)
            score = wp * n / total + wq * queue + wk * (1.0 - gauges[i].kv_usage)
            if score > best_score + 1e-12:
                best_score, ties = score, [i]
            elif abs(score - best_score) <= 1e-12:
                ties.append(i)
        idx = self.rng.choice(ties)
        lru = self._lru[idx]
        for k in keys:
            lru[k] = None
            lru.move_to_end(k)
        while len(lru) > self.lru_blocks:
            lru.popitem(last=False)
        return idx, -1


def _memory_index() -> KVIndex:
    from litellm_kv.index.memory import InMemoryIndex

    index: KVIndex = InMemoryIndex()
    return index


class _EventDriven(BaseStrategy):
    """Learns replica contents from KV events through the project's decoder and index."""

    listens_to_events = True

    def __init__(self, seed: int = 0, index: KVIndex | None = None) -> None:
        super().__init__(seed)
        self.index = index if index is not None else _memory_index()
        self.events_applied = 0

    async def on_kv_events(self, replica: str, payload: bytes) -> None:
        batch = decode_event_batch(payload)
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                await self.index.purge_replica(GROUP, replica)
                self.purged(replica)
                continue
            ops = to_block_ops(ev)
            if ops:
                self.events_applied += await self.index.apply(GROUP, replica, ops)

    def purged(self, replica: str) -> None:
        """The replica's cache was cleared (after its index entries were dropped)."""

    async def matches(self, req: SimRequest) -> dict[str, Any]:
        return await self.index.lookup(GROUP, req.blocks, self.replicas)


class DynamoCost(_EventDriven):
    """NVIDIA Dynamo's KV router cost with its defaults: exact overlap from events,
    ``prefill_load_scale·max(active_prefill_blocks + prompt_blocks − credit, 0)
    + active_decode_blocks + new_blocks`` (credit GPU 1.0 / CPU 0.75 / disk 0.25), lowest wins,
    temperature 0, credit decay off, a 5 s side index of its own decisions."""

    name = "dynamo"

    def __init__(self, seed: int = 0, index: KVIndex | None = None, prefill_load_scale: float = 1.0) -> None:
        super().__init__(seed, index)
        self.prefill_load_scale = prefill_load_scale
        self.siblings = SiblingIndex(ttl_s=5.0)

    async def start(self, replicas: list[str], block_size: int, clock: Callable[[], float]) -> None:
        await super().start(replicas, block_size, clock)
        self.siblings = SiblingIndex(ttl_s=5.0, clock=clock)

    async def route(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        m = await self.matches(req)
        sib = self.siblings.lookup(req.blocks)
        limit = max(0, (req.prompt_tokens - 1) // self.block_size)
        prompt_blocks = -(-req.prompt_tokens // self.block_size)
        bs = self.block_size
        best, ties, hits = float("inf"), [0], [0] * len(self.replicas)
        for i, r in enumerate(self.replicas):
            match = m.get(r)
            g, c, s = (match.gpu, match.cpu, match.storage) if match is not None else (0, 0, 0)
            if g + c + s > limit:
                g = max(0, limit - c - s)
            extra = max(0, min(sib.get(r, 0), limit) - (g + c + s))
            credit = g + extra + 0.75 * c + 0.25 * s
            hits[i] = min(limit, g + c + s + extra)
            new_blocks = max(0.0, prompt_blocks - credit)
            active_prefill = self.prefill_tokens[i] / bs
            cost = (self.prefill_load_scale * max(active_prefill + prompt_blocks - credit, 0.0)
                    + self.active_blocks[i] + new_blocks)
            if cost < best - 1e-9:
                best, ties = cost, [i]
            elif abs(cost - best) <= 1e-9:
                ties.append(i)
        idx = self.rng.choice(ties)
        self.siblings.record(self.replicas[idx], req.blocks)
        predicted = hits[idx] * bs
        self.sent(req, idx, req.prompt_tokens - predicted)
        return idx, predicted


class LitellmKV(_EventDriven):
    """litellm-kv with its defaults: the project's CostModel (TTFT model, rates learned from the simulated
    engines' prefill and inter-token histograms and the TTFTs the router sees), sibling index and load
    tracker."""

    name = "litellm-kv"
    cost_model = "ttft"

    def __init__(self, seed: int = 0, index: KVIndex | None = None, cost: CostSettings | None = None,
                 sibling_ttl_s: float = 5.0, ttft: TtftSettings | None = None,
                 load: LoadSettings | None = None, scrape_aging: bool = True) -> None:
        super().__init__(seed, index)
        tc = (ttft or TtftSettings()) if self.cost_model == "ttft" else None
        self.model = CostModel(cost or CostSettings(), seed=seed, ttft=tc)
        self.sibling_ttl_s = sibling_ttl_s
        self.load_settings = load
        self.scrape_aging = scrape_aging
        self._new_run(time.monotonic)

    def _new_run(self, clock: Callable[[], float]) -> None:
        """What one run learns and counts, from nothing: a strategy started twice does not carry the first run
        over."""
        self.rates = RateBook(self.model.ttft or TtftSettings())
        self.siblings = SiblingIndex(ttl_s=self.sibling_ttl_s, clock=clock)
        self.load = InMemoryLoadTracker(self.load_settings, clock=clock)
        self.aging = GaugeAging() if self.scrape_aging else None
        self.demand = PrefixDemand.for_settings(self.model.ttft, clock=clock)
        self.reasons: dict[str, int] = {}
        self._predicted: dict[int, float] = {}  # rid -> uncorrected predicted TTFT (TTFT model)
        self.ttft_errors: list[float] = []  # measured − predicted TTFT, seconds, per request

    async def start(self, replicas: list[str], block_size: int, clock: Callable[[], float]) -> None:
        await super().start(replicas, block_size, clock)
        self._new_run(clock)

    async def route(self, req: SimRequest, gauges: Sequence[Gauges]) -> tuple[int, int]:
        m = await self.matches(req)
        sib = self.siblings.lookup(req.blocks) if self.model.cfg.sibling_credit > 0 else {}
        loads = await self.load.snapshot(GROUP, self.replicas)
        ttft_on = self.model.ttft is not None
        cands = []
        for i, r in enumerate(self.replicas):
            ld, g = loads[r], gauges[i]
            kw: dict[str, Any] = {}
            if r in m:
                kw["match"] = m[r]
            if ttft_on:
                # What a scrape of the engine's /metrics gives (the book ignores an unchanged scrape).
                self.rates.observe_engine(r, EngineTimings(g.prefill_s_sum, g.prefill_count, g.prefill_tokens_sum,
                                                           g.itl_s_sum, g.itl_count, g.output_tokens_sum,
                                                           g.prefill_count))
                kw["rates"] = self.rates.rates(r)
            waiting, running = self.aging.adjust(r, g.waiting, g.running) if self.aging else (g.waiting, g.running)
            cands.append(Candidate(
                r, inflight_prefill_tokens=ld.prefill_tokens, inflight_prefill_requests=ld.prefill_requests,
                inflight_decode=ld.decode,
                engine_waiting=waiting, engine_running=running, kv_usage=g.kv_usage,
                sibling_blocks=sib.get(r, 0), recent_prefill_tokens=ld.recent_tokens, **kw,
            ))
        d = self.model.choose(req.prompt_tokens, self.block_size, cands, hashes=req.blocks, demand=self.demand)
        self.reasons[d.reason] = self.reasons.get(d.reason, 0) + 1
        idx = self.replicas.index(d.replica)
        if d.reason != "unique" or self.model.cfg.sibling_credit > 0:
            self.siblings.record(d.replica, req.blocks)
        if ttft_on:
            self._predicted[req.rid] = d.raw_ttft_s
        await self.load.begin(GROUP, d.replica, str(req.rid), req.prompt_tokens - d.predicted_hit_tokens)
        if self.aging:
            self.aging.begin(str(req.rid), d.replica)
        self.sent(req, idx, req.prompt_tokens - d.predicted_hit_tokens)
        return idx, d.predicted_hit_tokens

    def on_scrape(self) -> None:
        if self.aging:
            for r in self.replicas:
                self.aging.scraped(r, self.aging.scrape_started(r))

    def purged(self, replica: str) -> None:
        self.siblings.forget(replica)

    async def on_first_token(self, req: SimRequest, idx: int) -> None:
        await super().on_first_token(req, idx)
        await self.load.first_token(str(req.rid))
        if self.aging:
            self.aging.first_token(str(req.rid))
        raw = self._predicted.pop(req.rid, None)
        if raw is not None:
            r = self.replicas[idx]
            measured = self.clock() - req.arrival_s
            self.ttft_errors.append(measured - self.rates.rates(r).corrected(raw))
            self.rates.observe_ttft(r, raw, measured)

    async def on_finish(self, req: SimRequest, idx: int) -> None:
        await super().on_finish(req, idx)
        await self.load.end(str(req.rid))
        if self.aging:
            self.aging.end(str(req.rid))


class LitellmKVBlocks(LitellmKV):
    """litellm-kv with ``cost_model: blocks`` (the token-equivalent cost it shipped first)."""

    name = "litellm-kv-blocks"
    cost_model = "blocks"


STRATEGIES: dict[str, Callable[..., Strategy]] = {
    s.name: s
    for s in (RandomChoice, RoundRobin, LeastLoaded, SessionAffinity, PromptCachingNoMarkers, PrefixAware,
              SGLangCacheAware, LlmdApproximate, DynamoCost, LitellmKVBlocks, LitellmKV)
}
