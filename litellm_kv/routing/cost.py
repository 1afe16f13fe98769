"""The routing cost: predicted cache hits weighed against each replica's load.

Two cost models, chosen per group (``kv.cost_model``):

* ``ttft`` (:meth:`CostModel.choose` with a :class:`~litellm_kv.routing.ttft.TtftSettings`): each
  replica's cost is its *predicted time to first token* in seconds — prefill queued ahead, this
  request's uncached prefill, the slowdown of running decodes, at rates learned per replica
  (:mod:`litellm_kv.routing.ttft`) — plus ``work_weight`` × this request's own prefill seconds (the time
  it takes from later requests there), ``stall_weight`` × those seconds × the replica's running decodes (the
  stall it inflicts on them), and the decode and recent-work terms of docs/routing.md. With a TTFT target
  (``kv.ttft.slo_ttft_s``), only the replicas predicted to meet it compete, when any is.
* ``blocks`` (below): the token-equivalent cost the project shipped first.

In the ``blocks`` model every quantity is in *prefill-token equivalents*: the cost of a replica is roughly the work it
must finish before this request's first token, i.e. queued prefill tokens plus this request's
uncached tokens plus a charge for running decode sequences. Cache hits are a credit against
that work, weighted by the tier holding them. Lowest cost wins.

Differences from Dynamo's cost (which this reproduces when ``credit_decay_tokens = 0``,
``imbalance_guard = false``, ``recent_weight = 0``):

* **Anti-starvation** (on by default): a replica's cache credit decays with how much more
  loaded it is than the least-loaded candidate, so a hot prefix spreads before its queue grows
  as long as the prompt, and an empty new replica wins requests early.
* **Load that does not vanish between turns**: besides in-flight work, each replica carries a
  decayed sum of the prefill work recently sent to it (``recent_prefill_tokens``), so paced
  sessions whose in-flight count is zero between turns still see where work went.
* **Imbalance guard** (on by default): when the cost's choice is loaded beyond an absolute
  *and* relative spread over the least-loaded replica, take the least-loaded one.
* **Unique prefixes** (no predicted hit anywhere) skip the credit computation and go to the
  least-loaded replica.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from litellm_kv.config import doc
from litellm_kv.index.base import ReplicaMatch
from litellm_kv.routing.hold import PrefixDemand
from litellm_kv.routing.ttft import ReplicaRates, TtftSettings
from litellm_kv.vllm.hashing import max_hit_blocks

Reason = Literal["cache", "load", "imbalance", "unique", "fallback"]
Hold = Literal["", "held", "hot", "busy"]


@dataclass(slots=True)
class CostSettings:
    """Cost-model weights of one model group (``model_groups.<g>.kv.cost``)."""

    gpu_credit: float = doc("Credit per predicted hit token held in GPU memory.", default=1.0)
    cpu_credit: float = doc(
        "Credit per predicted hit token held only in CPU memory (offload tier): it must be copied "
        "back, which costs part of what recomputing it would.",
        default=0.75,
    )
    storage_credit: float = doc("Credit per predicted hit token held only on disk/remote storage.",
                                default=0.25)
    sibling_credit: float = doc(
        "Credit per token predicted from recent routing decisions (the sibling index) beyond what "
        "the engine has announced: the blocks of a request routed a moment ago will be cached "
        "there by the time this one runs. 0 disables sibling prediction.",
        default=1.0,
    )
    prefill_load_scale: float = doc(
        "Weight of queued and uncached prefill tokens in the cost (Dynamo's prefill_load_scale).",
        default=1.0,
    )
    decode_token_weight: float = doc(
        "Prefill-token equivalents charged per running decode sequence on a replica (decode "
        "steps share the batch with prefill and hold KV memory).",
        default=32.0,
    )
    waiting_request_tokens: float = doc(
        "Prefill tokens assumed per request the engine reports waiting "
        "(vllm:num_requests_waiting); the larger of this estimate and the router's own in-flight "
        "prefill tokens is used, so traffic from other routers is counted too.",
        default=1024.0,
    )
    recent_weight: float = doc(
        "Weight of the decayed sum of prefill tokens recently sent to a replica, beyond those "
        "still in flight. Keeps the load signal alive between turns of paced sessions, when "
        "nothing is in flight. 0 disables it.",
        default=0.25,
    )
    kv_usage_threshold: float = doc(
        "Engine KV-cache usage (vllm:kv_cache_usage_perc, 0..1) above which a replica is "
        "penalised: new blocks there evict cached ones or preempt running requests.",
        default=0.9,
    )
    kv_usage_penalty_tokens: float = doc(
        "Cost added at 100 % KV usage, scaled linearly from the threshold.", default=8192.0
    )
    credit_decay_tokens: float = doc(
        "Anti-starvation: a replica's cache credit is divided by 1 + excess/(this + "
        "credit_decay_load_factor·min_load), where excess is its load above the least-loaded "
        "candidate's (min_load), in prefill tokens. Smaller spreads hot prefixes sooner; 0 turns "
        "decay off (Dynamo's default).",
        default=8192.0,
    )
    credit_decay_load_factor: float = doc(
        "How much the least-loaded replica's own load widens the decay scale. Next to an idle "
        "(new) replica, credit decays fast; in a fleet where every queue is long, a spread of the "
        "same size matters less than the hits, so credit is kept.",
        default=10.0,
    )
    imbalance_guard: bool = doc(
        "Switch to the least-loaded replica when the chosen one is loaded beyond both spreads below (the block "
        "cost; the TTFT cost only with kv.ttft.imbalance_guard as well).",
        default=True,
    )
    imbalance_abs_tokens: float = doc(
        "Imbalance guard: minimum load excess (prefill tokens) of the chosen replica over the "
        "least-loaded one before the guard acts.",
        default=32768.0,
    )
    imbalance_ratio: float = doc(
        "Imbalance guard: minimum ratio of the chosen replica's load to the least-loaded one's.",
        default=2.0,
    )
    temperature: float = doc(
        "0 picks the lowest cost. Above 0, samples replicas with probability ∝ exp(−cost/(T·L)), "
        "L the prompt length, spreading near-ties.",
        default=0.0,
    )

    def validate(self) -> None:
        for name in ("gpu_credit", "cpu_credit", "storage_credit", "sibling_credit",
                     "prefill_load_scale", "decode_token_weight", "waiting_request_tokens",
                     "recent_weight", "kv_usage_penalty_tokens", "credit_decay_tokens", "credit_decay_load_factor",
                     "imbalance_abs_tokens", "temperature"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not 0.0 <= self.kv_usage_threshold <= 1.0:
            raise ValueError("kv_usage_threshold must be within 0..1")
        if self.imbalance_ratio < 1.0:
            raise ValueError("imbalance_ratio must be >= 1")


@dataclass(slots=True)
class Candidate:
    """One replica the request may go to, with what the router knows about it."""

    replica: str
    match: ReplicaMatch = field(default_factory=ReplicaMatch)
    inflight_prefill_tokens: int = 0  # router-tracked, all proxies
    inflight_prefill_requests: int = 0  # router-tracked requests behind inflight_prefill_tokens
    inflight_decode: int = 0  # router-tracked sequences past their first token
    engine_waiting: int | None = None  # scraped vllm:num_requests_waiting
    engine_running: int | None = None  # scraped vllm:num_requests_running
    kv_usage: float | None = None  # scraped vllm:kv_cache_usage_perc
    sibling_blocks: int = 0  # leading blocks predicted by the sibling index
    recent_prefill_tokens: float = 0.0  # decayed prefill work recently sent here
    rates: ReplicaRates | None = None  # learned timing rates (TTFT model); None: the defaults


@dataclass(slots=True)
class RoutingDecision:
    replica: str
    reason: Reason
    predicted_hit_tokens: int
    scores: dict[str, float]  # replica -> cost (lower is better)
    hit_tokens: dict[str, int] = field(default_factory=dict)  # replica -> predicted hit tokens
    ttft_s: dict[str, float] = field(default_factory=dict)  # replica -> predicted TTFT (TTFT model only)
    raw_ttft_s: float = 0.0  # the chosen replica's prediction before its measured correction and offset
    visual_tokens: int = 0  # the chosen replica's uncached visual tokens (TTFT model only)
    visual_s: float = 0.0  # their part of raw_ttft_s
    visual_extra_tokens: float = 0.0  # their cost beyond the text rate, in prefill tokens at the chosen one's rate
    slo_met: bool | None = None  # with kv.ttft.slo_ttft_s: whether any candidate was predicted to meet it
    # Prefix hold (TTFT model, a request with hits): held at a holder of its longest hit, or not held because its
    # prefix is hot or no holder was within the hold's bounds; "" when the hold did not apply.
    hold: Hold = ""


def replica_load(cfg: CostSettings, c: Candidate) -> float:
    """Work a replica has ahead of a new request, in prefill-token equivalents."""
    prefill = float(c.inflight_prefill_tokens)
    if c.engine_waiting is not None:
        prefill = max(prefill, c.engine_waiting * cfg.waiting_request_tokens)
    decode = c.inflight_decode
    if c.engine_running is not None:
        decode = max(decode, c.engine_running)
    load = cfg.prefill_load_scale * prefill + cfg.decode_token_weight * decode
    # Recent work still in flight is already counted above.
    load += cfg.recent_weight * max(0.0, c.recent_prefill_tokens - c.inflight_prefill_tokens)
    if c.kv_usage is not None and c.kv_usage > cfg.kv_usage_threshold:
        span = max(1e-9, 1.0 - cfg.kv_usage_threshold)
        load += cfg.kv_usage_penalty_tokens * min(1.0, (c.kv_usage - cfg.kv_usage_threshold) / span)
    return load


def _capped(match: ReplicaMatch, limit: int) -> tuple[int, int, int]:
    """Tier counts of the first ``limit`` matched blocks. The index reports counts, not order;
    the excess is taken from the slowest tier first (offloaded copies trail the GPU ones)."""
    gpu, cpu, sto = match.gpu, match.cpu, match.storage
    excess = gpu + cpu + sto - limit
    for _ in range(3):
        if excess <= 0:
            break
        if sto:
            cut = min(sto, excess)
            sto -= cut
        elif cpu:
            cut = min(cpu, excess)
            cpu -= cut
        else:
            cut = min(gpu, excess)
            gpu -= cut
        excess -= cut
    return gpu, cpu, sto


def _hold_ttft_bound(tc: TtftSettings) -> float:
    """The predicted TTFT a held request or a placed new prefix may face: hold_ttft_s, or the target if lower."""
    return min(tc.hold_ttft_s, tc.slo_ttft_s) if tc.slo_ttft_s > 0 else tc.hold_ttft_s


def uncached_visual(spans: Sequence[tuple[int, int]], cached_tokens: int) -> int:
    """Visual tokens of the images in ``spans`` (``(offset, tokens)`` placeholder runs) not wholly within the
    first ``cached_tokens``: the images the engine must process and encode. vLLM skips an image whose
    placeholders are all cached and encodes the whole image otherwise."""
    return sum(n for off, n in spans if off + n > cached_tokens)


class CostModel:
    """Chooses a replica for a prompt. Pure apart from the random source used for ties and
    temperature sampling (seeded for reproducible simulations)."""

    def __init__(self, cfg: CostSettings | None = None, seed: int | None = None,
                 ttft: TtftSettings | None = None) -> None:
        """``ttft``: settings of the TTFT model, which is then the cost; None: the ``blocks`` model."""
        self.cfg = cfg or CostSettings()
        self.ttft = ttft
        self._rng = random.Random(seed)
        if ttft is not None:
            self._defaults = ReplicaRates(ttft.prefill_s_per_token, ttft.prefill_overhead_s, ttft.decode_step_s,
                                          visual_s_per_token=ttft.visual_s_per_token)

    @property
    def kind(self) -> str:
        return "blocks" if self.ttft is None else "ttft"

    def least_loaded(self, candidates: Sequence[Candidate], reason: Reason = "fallback") -> RoutingDecision:
        """Load-only choice: the cheap path for unique prefixes and the fallback when the index
        or tokenizer fails."""
        if not candidates:
            raise ValueError("no candidates")
        loads = {c.replica: replica_load(self.cfg, c) for c in candidates}
        return RoutingDecision(self._argmin(loads), reason, 0, loads)

    def choose(self, prompt_tokens: int, block_size: int, candidates: Sequence[Candidate],
               visual_spans: Sequence[tuple[int, int]] = (), *, hashes: Sequence[int] = (),
               demand: PrefixDemand | None = None) -> RoutingDecision:
        """``visual_spans``: ``(offset, tokens)`` of each image's placeholder run, which the TTFT model
        charges at ``visual_s_per_token`` on top where the candidate's hits do not cover them. ``hashes`` (the
        prompt's block hashes) and ``demand`` (the group's prefix counts, which this decision adds to): the
        TTFT model's prefix hold, when ``kv.ttft.hold`` is on."""
        if not candidates:
            raise ValueError("no candidates")
        if self.ttft is not None:
            return self._choose_ttft(prompt_tokens, block_size, candidates, self.ttft, visual_spans, hashes, demand)
        cfg = self.cfg
        limit = max_hit_blocks(prompt_tokens, block_size)
        hits: dict[str, int] = {}
        credit: dict[str, float] = {}
        for c in candidates:
            gpu, cpu, sto = _capped(c.match, limit)
            matched = gpu + cpu + sto
            extra = 0
            if cfg.sibling_credit > 0 and c.sibling_blocks > matched:
                extra = min(c.sibling_blocks, limit) - matched
            blocks = matched + extra
            if blocks:
                hits[c.replica] = blocks * block_size
                credit[c.replica] = block_size * (
                    gpu * cfg.gpu_credit + cpu * cfg.cpu_credit + sto * cfg.storage_credit
                    + extra * cfg.sibling_credit
                )
        if not hits:
            return self.least_loaded(candidates, reason="unique")

        loads = {c.replica: replica_load(cfg, c) for c in candidates}
        floor = min(loads.values())
        costs: dict[str, float] = {}
        for c in candidates:
            r = c.replica
            cr = credit.get(r, 0.0)
            if cr and cfg.credit_decay_tokens > 0:
                # Relative to the least-loaded replica's load: an idle replica next to a busy one
                # decays the busy one's credit fast; in an overloaded fleet, where every queue
                # is long, the same absolute spread matters less and hits are worth keeping.
                scale = cfg.credit_decay_tokens + cfg.credit_decay_load_factor * floor
                cr /= 1.0 + (loads[r] - floor) / scale
            costs[r] = loads[r] + cfg.prefill_load_scale * max(0.0, prompt_tokens - cr)

        if cfg.temperature > 0:
            chosen = self._sample(costs, cfg.temperature * max(prompt_tokens, block_size))
        else:
            chosen = self._argmin(costs)

        reason: Reason = "cache" if hits.get(chosen, 0) == max(hits.values()) else "load"
        if cfg.imbalance_guard:
            excess = loads[chosen] - floor
            if excess > cfg.imbalance_abs_tokens and loads[chosen] > cfg.imbalance_ratio * floor:
                chosen = self._argmin(loads)
                reason = "imbalance"
        return RoutingDecision(chosen, reason, hits.get(chosen, 0), costs, hits)

    def _choose_ttft(self, prompt_tokens: int, block_size: int, candidates: Sequence[Candidate],
                     tc: TtftSettings, visual_spans: Sequence[tuple[int, int]] = (), hashes: Sequence[int] = (),
                     demand: PrefixDemand | None = None) -> RoutingDecision:
        """Lowest predicted TTFT plus ``work_weight`` × own prefill seconds (docs/routing.md), after the prefix
        hold and the placement of new prefixes."""
        cfg = self.cfg
        limit = max_hit_blocks(prompt_tokens, block_size)
        hits: dict[str, int] = {}
        ttft: dict[str, float] = {}
        costs: dict[str, float] = {}
        raw: dict[str, float] = {}
        visual: dict[str, tuple[int, float, float]] = {}  # replica -> uncached visual tokens, seconds, extra tokens
        inflight_of: dict[str, int] = {}  # requests queued for prefill or decoding, for the hold's bound
        chunk = tc.chunk_tokens
        for c in candidates:
            r = c.replica
            gpu, cpu, sto = _capped(c.match, limit)
            matched = gpu + cpu + sto
            extra = 0
            if cfg.sibling_credit > 0 and c.sibling_blocks > matched:
                extra = min(c.sibling_blocks, limit) - matched
            if matched + extra:
                hits[r] = (matched + extra) * block_size
            # GPU hits are free; offloaded ones cost a transfer, as a fraction of recomputing them.
            credit = block_size * (gpu * cfg.gpu_credit + cpu * cfg.cpu_credit + sto * cfg.storage_credit
                                   + extra * cfg.sibling_credit)
            new = max(0.0, prompt_tokens - credit)
            rt = c.rates or self._defaults
            b = rt.prefill_s_per_token
            queued = float(c.inflight_prefill_tokens)
            waiting = c.engine_waiting or 0
            if waiting:
                queued = max(queued, waiting * cfg.waiting_request_tokens)
            own = rt.prefill_overhead_s + b * new
            if visual_spans:
                vis = uncached_visual(visual_spans, (matched + extra) * block_size)
                vis_s = rt.visual_s_per_token * vis
                own += vis_s
                visual[r] = (vis, vis_s, vis_s / b)
            # Requests queued ahead: the engine's count or the router's own, whichever is larger (the
            # scrape lags a burst the router has just sent).
            ahead = rt.prefill_overhead_s * max(waiting, c.inflight_prefill_requests) + b * queued
            running = c.inflight_decode if c.engine_running is None else max(c.inflight_decode, c.engine_running)
            inflight_of[r] = max(c.inflight_prefill_requests + c.inflight_decode,
                                 (c.engine_running or 0) + waiting)
            slow = rt.decode_step_s * math.ceil((queued + new) / chunk) if running > 0 else 0.0
            base = ahead + own + slow
            raw[r] = base
            t = rt.corrected(base)
            ttft[r] = t
            extra_s = tc.recent_weight * b * max(0.0, c.recent_prefill_tokens - c.inflight_prefill_tokens)
            if c.kv_usage is not None and c.kv_usage > cfg.kv_usage_threshold:
                span = max(1e-9, 1.0 - cfg.kv_usage_threshold)
                extra_s += b * cfg.kv_usage_penalty_tokens * min(1.0, (c.kv_usage - cfg.kv_usage_threshold) / span)
            extra_s += tc.decode_weight * rt.output_tokens * rt.decode_step_s
            extra_s += tc.stall_weight * own * running  # the prefill stalls every decode running there
            costs[r] = t + tc.work_weight * rt.correction * own + extra_s
        # With a TTFT target, only the replicas predicted to meet it compete, when there are any.
        slo_met: bool | None = None
        pool = costs
        if tc.slo_ttft_s > 0:
            meet = {r: v for r, v in costs.items() if ttft[r] <= tc.slo_ttft_s}
            slo_met = bool(meet)
            pool = meet or costs
        held: Hold = ""
        chosen = ""
        if tc.hold and demand is not None:
            held, chosen = self._hold(tc, hits, block_size, hashes, demand, ttft, costs, inflight_of)
        if not chosen and not hits and tc.unique_by_recent_work:
            chosen = self._place_new(tc, candidates, ttft, costs)
        if not chosen:
            chosen = (self._sample(pool, cfg.temperature * self._defaults.prefill_s_per_token
                                   * max(prompt_tokens, block_size))
                      if cfg.temperature > 0 else self._argmin(pool))
        reason: Reason
        if not hits:
            reason = "unique"
        else:
            reason = "cache" if hits.get(chosen, 0) == max(hits.values()) else "load"
            if cfg.imbalance_guard and tc.imbalance_guard:
                loads = {c.replica: replica_load(cfg, c) for c in candidates}
                floor = min(loads.values())
                if loads[chosen] - floor > cfg.imbalance_abs_tokens and loads[chosen] > cfg.imbalance_ratio * floor:
                    chosen = min(loads, key=lambda k: (loads[k], costs[k]))
                    reason = "imbalance"
        vis, vis_s, vis_extra = visual.get(chosen, (0, 0.0, 0.0))
        return RoutingDecision(chosen, reason, hits.get(chosen, 0), costs, hits, ttft, raw[chosen], vis, vis_s,
                               vis_extra, slo_met, held)

    def _place_new(self, tc: TtftSettings, candidates: Sequence[Candidate], ttft: dict[str, float],
                   costs: dict[str, float]) -> str:
        """A request that hits nowhere: the replica recently sent the least prefill work, among those predicted to
        answer within the hold's TTFT bound (all when none is); the cost breaks ties."""
        bound = _hold_ttft_bound(tc)
        pool = [c for c in candidates if ttft[c.replica] <= bound] or list(candidates)
        least = min(c.recent_prefill_tokens for c in pool)
        return self._argmin({c.replica: costs[c.replica] for c in pool if c.recent_prefill_tokens <= least + 1e-9})

    def _hold(self, tc: TtftSettings, hits: dict[str, int], block_size: int, hashes: Sequence[int],
              demand: PrefixDemand, ttft: dict[str, float], costs: dict[str, float],
              inflight: dict[str, int]) -> tuple[Hold, str]:
        """The prefix hold: the cheapest holder of the longest hit while the prefix is not hot and a holder is
        within the TTFT bound and the bound on requests in flight (``inflight``: queued for prefill or decoding,
        per replica); ``("", "")`` for a request that hits nowhere."""
        longest = max(hits.values(), default=0) // block_size
        if not longest or longest > len(hashes):
            demand.share(None)  # the group's count includes every request
            return "", ""
        holders = [r for r, h in hits.items() if h // block_size == longest]
        share = demand.share(hashes[longest - 1])
        if share * len(costs) / len(holders) > tc.hold_fair_share:
            return "hot", ""
        bound = tc.hold_running_ratio * sum(inflight.values()) / len(inflight) + tc.hold_running_slack
        limit = _hold_ttft_bound(tc)
        keep = {r: costs[r] for r in holders if ttft[r] <= limit and inflight[r] <= bound}
        if not keep:
            return "busy", ""
        return "held", self._argmin(keep)

    def _argmin(self, values: dict[str, float]) -> str:
        best = min(values.values())
        ties = [r for r, v in values.items() if v <= best + 1e-9]
        return ties[0] if len(ties) == 1 else self._rng.choice(ties)

    def _sample(self, costs: dict[str, float], scale: float) -> str:
        best = min(costs.values())
        names = list(costs)
        weights = [math.exp(-(costs[r] - best) / scale) for r in names]
        return self._rng.choices(names, weights)[0]
