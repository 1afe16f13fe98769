"""One routing decision: tokens → block hashes → one index round trip → cost → replica.

Pure of LiteLLM: :class:`~litellm_kv.routing.group.KVGroup` hands in token ids and candidate replica ids
and gets a :class:`RoutingResult` back, with the reason KVGroup found already (``not_exact_why``). Every
other reason the prediction could be wrong is checked here; each turns the decision into a load-only one
with a named reason (never a wrong prediction presented as exact).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from litellm_kv.index.base import KVIndex, ReplicaMatch, RidingLookup, ScriptRider
from litellm_kv.observability import counter, gauge, histogram
from litellm_kv.routing.cost import Candidate, CostModel, RoutingDecision
from litellm_kv.routing.early_lookup import EarlyAnswer
from litellm_kv.routing.hold import PrefixDemand
from litellm_kv.routing.load import TrackedLoad
from litellm_kv.routing.siblings import SiblingIndex
from litellm_kv.routing.ttft import RateBook
from litellm_kv.vllm.hashing import BlockHasher, InexactHashError, MMFeature, max_hit_blocks

DECISIONS = counter(
    "routing_decisions",
    "KV routing decisions by reason: cache, load, imbalance, unique, fallback (load-only because prediction "
    "was impossible; see litellm_kv_routing_fallbacks_total), shadow (recorded, LiteLLM routed).",
    ["model_group", "reason"],
)
FALLBACKS = counter(
    "routing_fallbacks",
    "Load-only decisions and why: not_exact, no_hasher, tokenize_failed, prompt_too_long (longer than any "
    "engine accepts), index_unavailable, multimodal (media "
    "whose identifiers or counts cannot be known exactly), multimodal_mismatch (the engine's visual-token "
    "counts disagreed), skip_prefix_cache, unknown_model.",
    ["model_group", "why"],
)
SLO_UNMET = counter(
    "routing_slo_unmet",
    "TTFT-cost decisions of a group with a TTFT target (kv.ttft.slo_ttft_s) for which no replica was predicted "
    "to meet it: the fleet is past what the target allows.",
    ["model_group"],
)
PREFIX_HOLD = counter(
    "routing_prefix_hold",
    "TTFT-cost decisions of requests with a predicted hit, by what the prefix hold did (kv.ttft.hold): held (kept "
    "at a replica holding the longest hit), hot (the prefix draws more than its fair share: the cost decided), "
    "busy (no holder within hold_ttft_s and the bound on requests in flight: the cost decided).",
    ["model_group", "outcome"],
)
DECISION_SECONDS = histogram(
    "routing_decision_seconds",
    "Time to decide one request (tokenize + hash + index lookup + cost), seconds.",
    ["model_group", "tokenizer"],
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.25, 1.0),
)
STAGE_SECONDS = histogram(
    "routing_stage_seconds",
    "Time of one stage of a routing decision, seconds: tokenize (the chat template and the encoding, or the engine's "
    "/tokenize), hash (the prompt's block hashes). The index round trip is litellm_kv_index_lookup_seconds.",
    ["model_group", "stage"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.05, 0.25),
)
DECISION_CPU_SECONDS = histogram(
    "routing_decision_cpu_seconds",
    "CPU time of the proxy's event-loop thread during one routing decision, seconds: the decision's own work and any "
    "other callback the loop ran while the decision awaited the index or the engine. Close to "
    "litellm_kv_routing_decision_seconds: the time is work; far below it: the decision waited.",
    ["model_group"],
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.25, 1.0),
)
LOOKUP_SECONDS = histogram(
    "index_lookup_seconds",
    "Index lookup time for one prompt (all replicas, one round trip), seconds.",
    ["model_group", "backend"],
    buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25),
)

PREDICTED_TTFT = gauge(
    "predicted_ttft_seconds",
    "TTFT cost model: the latest decision's predicted time to first token on each candidate replica, seconds.",
    ["model_group", "replica"],
)


LoadRead = Callable[[], Awaitable[Mapping[str, TrackedLoad]]]
"""Reads the router-tracked load of the candidates when called: as late as possible, so that concurrent
decisions see each other's load."""


@dataclass(slots=True)
class RoutingRequest:
    """What the router needs to know about one request."""

    token_ids: Sequence[int]
    lora: tuple[str, str] | None = None
    cache_salt: str | None = None
    mm: Sequence[MMFeature] = ()
    has_unhashable_media: bool = False  # images whose engine identifiers we cannot compute
    skip_prefix_cache: bool = False  # prompt_logprobs: the engine will not read the cache


@dataclass(slots=True, frozen=True)
class EngineGauges:
    """Load gauges scraped from a replica's /metrics (None when unknown)."""

    waiting: int | None = None
    running: int | None = None
    kv_usage: float | None = None


@dataclass(slots=True)
class RoutingResult:
    """One decision. The proxy keeps it per call until the call's last callback (up to ``inflight_ttl_s``), so it
    holds nothing per block of the prompt: its size does not grow with the prompt."""

    replica: str
    reason: str
    predicted_hit_tokens: int
    prompt_tokens: int
    hit_tokens: dict[str, int] = field(default_factory=dict)
    exact: bool = True
    fallback_why: str = ""
    tokenizer: str = "none"  # which path produced the token ids: local, engine, none (set by KVGroup.decide)
    # The hits the choice counted on, sibling predictions included: what the replica will likely not compute
    # (the load to count), where predicted_hit_tokens is only what the engine has announced (the exactness check).
    expected_hit_tokens: int = 0
    predicted_ttft_s: dict[str, float] = field(default_factory=dict)  # TTFT model: replica -> predicted TTFT
    raw_ttft_s: float = 0.0  # the chosen replica's predicted TTFT before its measured correction and offset
    block_size: int = 0  # of the hashes (0: none were computed)
    visual_tokens: int = 0  # image requests routed by cache: the visual tokens the placeholders were expanded to
    images: list[dict[str, Any]] = field(default_factory=list)  # per image: identifier, offset, tokens, blocks
    uncached_visual_tokens: int = 0  # TTFT model: the chosen replica's visual tokens of images it must encode
    raw_visual_s: float = 0.0  # their part of raw_ttft_s
    visual_extra_tokens: float = 0.0  # their cost beyond the text rate, in prefill tokens (counted as load)
    slo_met: bool | None = None  # with a TTFT target: whether any replica was predicted to meet it
    hold: str = ""  # what the prefix hold did (held, hot, busy; "" when it did not apply)


class KVRouter:
    """Decides among the replicas of one model group."""

    def __init__(self, group: str, index: KVIndex, cost: CostModel, siblings: SiblingIndex,
                 backend: str = "memory", rates: RateBook | None = None, *, followed: bool = True) -> None:
        """``followed``: the requests go where the decision says. False in shadow mode (LiteLLM routes): a
        decision then records no sibling prediction, since its blocks will be computed elsewhere."""
        self.group = group
        self.followed = followed
        self.index = index
        self.cost = cost
        self.siblings = siblings
        self.backend = backend
        self.rates = rates if rates is not None else RateBook(cost.ttft) if cost.ttft is not None else None
        self.last_ttft: dict[str, float] = {}  # the latest decision's predicted TTFT per candidate
        self.demand = PrefixDemand.for_settings(cost.ttft)
        # Checked once: an index that can carry the load read in its lookup's round trip.
        self.riding: RidingLookup | None = index if isinstance(index, RidingLookup) else None

    async def decide(
        self,
        request: RoutingRequest,
        hasher: BlockHasher | None,
        candidates: Sequence[str],
        loads: LoadRead,
        gauges: dict[str, EngineGauges],
        *,
        not_exact_why: str = "",
        load_rider: ScriptRider[Mapping[str, TrackedLoad]] | None = None,
        early: EarlyAnswer | None = None,
        early_max_age_s: float = 0.0,
    ) -> RoutingResult:
        """Choose a replica. ``loads`` is called as late as possible. With ``load_rider`` (shared mode) and
        an index that can carry it (:class:`RidingLookup`), the load is read in the lookup's own round trip
        instead and ``loads`` is not called; when that round trip fails, the rider's fallback value is used
        (the Redis load tracker's: this proxy's own counts). ``early``: the same round trip made before the
        routing hook (:mod:`litellm_kv.routing.early_lookup`), taken instead of a new one when it was made for
        the same hashing inputs at most ``early_max_age_s`` ago."""
        if not candidates:
            raise ValueError("no candidate replicas")
        why = not_exact_why
        if not why and hasher is None:
            why = "no_hasher"
        if not why and request.has_unhashable_media:
            why = "multimodal"
        if not why and request.skip_prefix_cache:
            why = "skip_prefix_cache"
        if why:
            return self._load_only(request, candidates, await loads(), gauges, why)
        assert hasher is not None
        if (early is not None and load_rider is not None
                and early.answers(request.token_ids, hasher, request.lora, request.cache_salt, bool(request.mm),
                                  early_max_age_s, self.group)):
            wanted = set(candidates)
            return self._decide(request, hasher, candidates, gauges, list(early.hashes or ()),
                                {r: m for r, m in (early.matches or {}).items() if r in wanted},
                                load_rider.decode(early.load_reply))
        t0 = time.perf_counter()
        try:
            hashes = hasher.wire_hashes(request.token_ids, request.lora, request.mm, request.cache_salt)
        except InexactHashError:
            return self._load_only(request, candidates, await loads(), gauges, "not_exact")
        STAGE_SECONDS.labels(self.group, "hash").observe(time.perf_counter() - t0)
        if load_rider is not None and hashes and self.riding is not None:
            matches, ridden = await self._lookup(hashes, candidates, load_rider)
            load_map = ridden if ridden is not None else load_rider.fallback()
        else:
            load_map = await loads()
            matches, _ = await self._lookup(hashes, candidates)
        if matches is None:
            return self._load_only(request, candidates, load_map, gauges, "index_unavailable")
        return self._decide(request, hasher, candidates, gauges, hashes, matches, load_map)

    async def look_up_early(self, hashes: list[int], rider: ScriptRider[Any]) -> tuple[dict[str, ReplicaMatch], Any]:
        """The decision's round trip for every replica of the group, made before the routing hook
        (:mod:`litellm_kv.routing.early_lookup`); raises when it fails or this index cannot carry the rider."""
        if self.riding is None:
            raise TypeError("the index cannot carry the load in its lookup")
        matches, reply = await self._lookup(hashes, None, rider)
        if matches is None:
            raise RuntimeError("the index round trip failed")
        return matches, reply

    def _decide(self, request: RoutingRequest, hasher: BlockHasher, candidates: Sequence[str],
                gauges: dict[str, EngineGauges], hashes: list[int], matches: Mapping[str, ReplicaMatch],
                load_map: Mapping[str, TrackedLoad]) -> RoutingResult:
        """The decision once the index and the load are read."""
        L = len(request.token_ids)
        sib = self.siblings.lookup(hashes) if hashes else {}
        cands = [
            self._candidate(r, matches.get(r, ReplicaMatch()), load_map.get(r), gauges.get(r), sib.get(r, 0))
            for r in candidates
        ]
        if self.rates is not None and self.cost.ttft is not None:
            for c in cands:
                c.rates = self.rates.rates(c.replica)
        spans = [(f.offset, f.length) for f in request.mm]
        d: RoutingDecision = self.cost.choose(prompt_tokens=L, block_size=hasher.block_size, candidates=cands,
                                              visual_spans=spans, hashes=hashes, demand=self.demand)
        if d.hold:
            PREFIX_HOLD.labels(self.group, d.hold).inc()
        if d.ttft_s:
            self.last_ttft = d.ttft_s
            for r, t in d.ttft_s.items():
                PREDICTED_TTFT.labels(self.group, r).set(t)
        if hashes and self.followed:
            self.siblings.record(d.replica, hashes)
        DECISIONS.labels(self.group, d.reason).inc()
        if d.slo_met is False:
            SLO_UNMET.labels(self.group).inc()
        # What the engine will report as cached_tokens: only blocks the index knows (sibling
        # predictions are a routing hint, not a promise), capped by vLLM's maximum-hit rule.
        limit = max_hit_blocks(L, hasher.block_size)
        exact_hits = {r: min(m.blocks, limit) * hasher.block_size for r, m in matches.items() if m.blocks}
        return RoutingResult(
            replica=d.replica, reason=d.reason, predicted_hit_tokens=exact_hits.get(d.replica, 0), prompt_tokens=L,
            hit_tokens=exact_hits, expected_hit_tokens=d.predicted_hit_tokens,
            predicted_ttft_s=d.ttft_s, raw_ttft_s=d.raw_ttft_s, block_size=hasher.block_size,
            uncached_visual_tokens=d.visual_tokens, raw_visual_s=d.visual_s, visual_extra_tokens=d.visual_extra_tokens,
            slo_met=d.slo_met, hold=d.hold,
        )

    @staticmethod
    def _candidate(
        replica: str, match: ReplicaMatch, load: TrackedLoad | None, g: EngineGauges | None, sibling_blocks: int
    ) -> Candidate:
        ld = load or TrackedLoad()
        g = g or EngineGauges()
        return Candidate(
            replica=replica, match=match, inflight_prefill_tokens=ld.prefill_tokens,
            inflight_prefill_requests=ld.prefill_requests, inflight_decode=ld.decode,
            engine_waiting=g.waiting, engine_running=g.running, kv_usage=g.kv_usage,
            sibling_blocks=sibling_blocks, recent_prefill_tokens=ld.recent_tokens,
        )

    async def _lookup(
        self, hashes: list[int], candidates: Sequence[str] | None, rider: ScriptRider[Any] | None = None,
    ) -> tuple[dict[str, ReplicaMatch] | None, Any]:
        """The index's matches for ``candidates`` (None: every replica), or None when the index cannot answer (the
        caller routes by load); with a rider (only given when the index is a :class:`RidingLookup`), the rider's
        value too (None on failure)."""
        if not hashes:
            return {}, None
        names = list(candidates) if candidates is not None else None
        t0 = time.perf_counter()
        try:
            if rider is not None and self.riding is not None:
                matches, ridden = await self.riding.lookup_riding(self.group, hashes, names, rider)
            else:
                matches, ridden = await self.index.lookup(self.group, hashes, names), None
        except Exception:
            return None, None
        LOOKUP_SECONDS.labels(self.group, self.backend).observe(time.perf_counter() - t0)
        return matches, ridden

    def _load_only(
        self,
        request: RoutingRequest,
        candidates: Sequence[str],
        loads: Mapping[str, TrackedLoad],
        gauges: dict[str, EngineGauges],
        why: str,
    ) -> RoutingResult:
        FALLBACKS.labels(self.group, why).inc()
        DECISIONS.labels(self.group, "fallback").inc()
        cands = [self._candidate(r, ReplicaMatch(), loads.get(r), gauges.get(r), 0) for r in candidates]
        d = self.cost.least_loaded(cands, reason="fallback")
        return RoutingResult(replica=d.replica, reason="fallback", predicted_hit_tokens=0,
                             prompt_tokens=len(request.token_ids), exact=False, fallback_why=why)

