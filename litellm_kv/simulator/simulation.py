"""Discrete-event simulator of a vLLM fleet driven by a list of requests.

Per replica: a FCFS waiting queue; one prefill at a time (admission = the moment vLLM would
schedule the request: its cache lookup happens then, and its blocks are allocated then);
decoding sequences run concurrently with an inter-token latency from the throughput model.
A request that does not fit in the free KV blocks waits at the head of the queue until a
running one finishes (no preemption). Each cache change is published as a vLLM
``KVEventBatch`` msgpack payload to every strategy that listens (after ``event_delay_s``),
so a strategy under test sees exactly what a real subscriber would.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field

import msgpack

from litellm_kv.simulator.cache import Allocation, BlockCache
from litellm_kv.simulator.interface import Gauges, Strategy
from litellm_kv.simulator.model import ThroughputModel
from litellm_kv.simulator.workload import SimRequest

_ARRIVE, _EVENTS, _FIRST, _FINISH, _SCRAPE = range(5)


@dataclass(slots=True)
class SimSettings:
    replicas: int = 8
    block_size: int = 16
    model: ThroughputModel = field(default_factory=ThroughputModel)
    event_delay_s: float = 0.005  # engine step → ZMQ → subscriber → index
    scrape_interval_s: float = 1.0  # engine /metrics gauges as the router sees them
    rho_half_life_s: float = 5.0  # smoothing of each replica's prefill-busy fraction
    event_tokens: bool = False  # BlockStored carries (stand-in) token ids, as engines do; slower
    seed: int = 0


@dataclass(slots=True)
class Outcome:
    rid: int
    replica: int
    prompt_tokens: int
    hit_tokens: int
    output_tokens: int
    arrival_s: float
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    itl_s: float = math.nan
    predicted_hit_tokens: int = -1


class Replica:
    def __init__(self, idx: int, cfg: SimSettings) -> None:
        self.idx = idx
        self.name = f"replica-{idx}"
        self.cache = BlockCache(cfg.model.blocks(cfg.block_size), cfg.block_size)
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: SimRequest | None = None
        self.running = 0
        self.context = 0.0  # tokens of KV read per decode step
        self.busy_until = 0.0
        self.rho = 0.0  # smoothed fraction of time spent prefilling
        self.rho_t = 0.0
        self.seq = 0
        self.gauges = Gauges()
        self.totals = Gauges()  # the cumulative timing figures, copied to ``gauges`` at each scrape
        self.prefill_s: dict[int, float] = {}  # rid -> prefill duration, observed at finish


class Simulation:
    def __init__(self, cfg: SimSettings, requests: list[SimRequest], strategy: Strategy) -> None:
        self.cfg = cfg
        self.requests = requests
        self.strategy = strategy
        self.replicas = [Replica(i, cfg) for i in range(cfg.replicas)]
        self.now = 0.0
        self._heap: list[tuple[float, int, int, object]] = []
        self._tie = itertools.count()
        self.outcomes: dict[int, Outcome] = {}
        self._alloc: dict[int, Allocation] = {}
        self._rng = random.Random(cfg.seed)
        self._listen = strategy.listens_to_events

    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self._heap, (t, next(self._tie), kind, payload))

    async def run(self) -> list[Outcome]:
        await self.strategy.start([r.name for r in self.replicas], self.cfg.block_size, lambda: self.now)
        for r in self.requests:
            self._push(r.arrival_s, _ARRIVE, r)
        self._push(0.0, _SCRAPE, None)
        pending = len(self.requests)
        while self._heap and pending:
            t, _, kind, payload = heapq.heappop(self._heap)
            self.now = t
            if kind == _ARRIVE:
                assert isinstance(payload, SimRequest)
                await self._arrive(payload)
            elif kind == _EVENTS:
                assert isinstance(payload, tuple)
                await self.strategy.on_kv_events(payload[0], payload[1])
            elif kind == _FIRST:
                assert isinstance(payload, SimRequest)
                await self._first_token(payload)
            elif kind == _FINISH:
                assert isinstance(payload, SimRequest)
                await self._finish(payload)
                pending -= 1
            elif kind == _SCRAPE:
                self._scrape()
                self._push(t + self.cfg.scrape_interval_s, _SCRAPE, None)
        return [self.outcomes[r.rid] for r in self.requests]

    def _scrape(self) -> None:
        for rep in self.replicas:
            g = rep.gauges
            g.waiting = len(rep.waiting) + (1 if rep.prefilling else 0)
            g.running = rep.running
            g.kv_usage = rep.cache.used_fraction
            t = rep.totals
            g.prefill_s_sum, g.prefill_count = t.prefill_s_sum, t.prefill_count
            g.prefill_tokens_sum = t.prefill_tokens_sum
            g.itl_s_sum, g.itl_count, g.output_tokens_sum = t.itl_s_sum, t.itl_count, t.output_tokens_sum
        self.strategy.on_scrape()

    async def _arrive(self, req: SimRequest) -> None:
        view = [r.gauges for r in self.replicas]
        idx, predicted = await self.strategy.route(req, view)
        rep = self.replicas[idx]
        self.outcomes[req.rid] = Outcome(req.rid, idx, req.prompt_tokens, 0, req.output_tokens,
                                         req.arrival_s, predicted_hit_tokens=predicted)
        rep.waiting.append(req)
        self._try_admit(rep)

    def _update_rho(self, rep: Replica, busy: bool) -> None:
        dt = self.now - rep.rho_t
        if dt > 0:
            a = math.exp(-dt * math.log(2) / self.cfg.rho_half_life_s)
            rep.rho = rep.rho * a + (1.0 - a) * (1.0 if busy else 0.0)
            rep.rho_t = self.now

    def _try_admit(self, rep: Replica) -> None:
        if rep.prefilling is not None or not rep.waiting or rep.running >= self.cfg.model.max_num_seqs:
            return
        req = rep.waiting[0]
        alloc = rep.cache.admit(req.blocks, req.prompt_tokens, req.output_tokens)
        if alloc is None:
            if rep.running == 0:  # can never fit: serve it uncached rather than deadlock
                raise RuntimeError(f"request {req.rid} needs more KV blocks than a replica has")
            return
        rep.waiting.popleft()
        self._update_rho(rep, False)
        self._alloc[req.rid] = alloc
        hit = alloc.hit_blocks * self.cfg.block_size
        self.outcomes[req.rid].hit_tokens = hit
        dur = self.cfg.model.prefill_s(req.prompt_tokens - hit, hit, rep.running, rep.context)
        rep.prefilling = req
        rep.prefill_s[req.rid] = dur
        rep.busy_until = self.now + dur
        self._push(self.now + dur, _FIRST, req)
        if self._listen and (alloc.stored or alloc.removed):
            parent = req.blocks[alloc.hit_blocks - 1] if alloc.hit_blocks else None
            self._publish(rep, alloc.stored, alloc.removed, parent)

    def _publish(self, rep: Replica, stored: list[int], removed: list[int], parent: int | None) -> None:
        bs = self.cfg.block_size
        # vLLM sends one BlockRemoved per evicted hash; one event carrying all of a step's
        # evictions has the same effect on any index and keeps long traces fast.
        events: list[dict[str, object]] = (
            [{"type": "BlockRemoved", "block_hashes": removed, "medium": "GPU"}] if removed else []
        )
        if stored:
            # Deterministic stand-in tokens: each block's id repeated (the index keys on hashes).
            tokens = ([t for h in stored for t in (h & 0x7FFF,) * bs]
                      if self.cfg.event_tokens else [])
            events.append({
                "type": "BlockStored", "block_hashes": stored, "parent_block_hash": parent,
                "token_ids": tokens, "block_size": bs, "lora_id": None, "medium": "GPU",
                "lora_name": None, "extra_keys": [None] * len(stored), "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            })
        payload = msgpack.packb([self.now, events, 0])
        rep.seq += 1
        self._push(self.now + self.cfg.event_delay_s, _EVENTS, (rep.name, payload))

    async def _first_token(self, req: SimRequest) -> None:
        out = self.outcomes[req.rid]
        rep = self.replicas[out.replica]
        out.ttft_s = self.now - req.arrival_s
        self._update_rho(rep, True)
        rep.prefilling = None
        ctx = req.prompt_tokens + req.output_tokens / 2
        rep.running += 1
        rep.context += ctx
        model = self.cfg.model
        itl = model.decode_step_s(rep.running, rep.context) + rep.rho * model.chunk_s()
        out.itl_s = itl
        if req.output_tokens > 1:
            # vLLM observes each step's inter-token latency as it runs; this model fixes a request's ITL
            # when it starts decoding, so its steps are counted then.
            t = rep.totals
            t.itl_s_sum += itl * (req.output_tokens - 1)
            t.itl_count += req.output_tokens - 1
        self._push(self.now + itl * max(0, req.output_tokens - 1), _FINISH, req)
        await self.strategy.on_first_token(req, out.replica)
        self._try_admit(rep)

    async def _finish(self, req: SimRequest) -> None:
        out = self.outcomes[req.rid]
        rep = self.replicas[out.replica]
        out.e2e_s = self.now - req.arrival_s
        rep.running -= 1
        rep.context -= req.prompt_tokens + req.output_tokens / 2
        alloc = self._alloc.pop(req.rid)
        t = rep.totals
        t.prefill_s_sum += rep.prefill_s.pop(req.rid, 0.0)
        t.prefill_count += 1
        t.prefill_tokens_sum += req.prompt_tokens - out.hit_tokens
        t.output_tokens_sum += req.output_tokens
        stored = rep.cache.release(alloc, req.prompt_tokens, req.output_tokens, req.output_blocks)
        if self._listen and stored:
            parent = req.blocks[alloc.n_full_prompt - 1] if alloc.n_full_prompt else None
            self._publish(rep, stored, [], parent)
        await self.strategy.on_finish(req, out.replica)
        self._try_admit(rep)
