"""Per-replica timing rates, learned online: what the TTFT cost model predicts with.

A replica's time to first token for a request is modelled as

    ttft = correction · (queued + own + slowdown) + offset
    queued   = prefill_overhead_s · queued_requests + prefill_s_per_token · queued_tokens
    own      = prefill_overhead_s + prefill_s_per_token · uncached_equivalent_tokens
               + visual_s_per_token · uncached_visual_tokens
    slowdown = decode_step_s · ⌈(queued_tokens + uncached tokens) / chunk_tokens⌉   (only while it decodes)

Three sources feed the rates, all bounded in memory (a few floats per replica):

* **The engine's prefill histograms.** Every scrape of ``/metrics`` gives the cumulative sums and
  counts of ``vllm:request_prefill_time_seconds`` and ``vllm:request_prefill_kv_computed_tokens`` (both
  observed by vLLM when a request finishes, so their deltas pair up). The per-token rate is the decayed
  prefill time beyond the per-request overhead (``prefill_overhead_s``) over the decayed computed tokens,
  with ``prior_requests`` requests at the default rate mixed in: the defaults before any data, the
  engine's figures as data comes.
* **The engine's inter-token latency** (``vllm:inter_token_latency_seconds``): the mean of each interval
  is the decode step the replica runs now, the slowdown a chunk of prefill pays beside running decodes.
* **The proxy's own measurements**: streamed responses give the time from the routing decision to the
  first content chunk. What the engine's prefill figures do not see is mostly a time per request, whatever
  its size (the request's way through the proxy and the engine's HTTP server, its wait for the engine's next
  step, the first decode step, the way back): the ``offset``. Rates that are off in scale (defaults far from
  the engine) make the error grow with the prediction: the ``correction`` factor. Both come from one decayed
  least-squares fit of measured on predicted TTFT (each response weighted 1 / its corrected prediction, so that
  with no offset the factor is, but for the prior, the ratio of the decayed sums of the two), the factor pulled
  toward 1 with the weight of ``correction_prior_responses`` responses (so a fleet whose predictions hardly vary
  learns an offset only), clamped to ``correction_min`` .. ``correction_max``, the offset to 0 ..
  ``offset_max_s``. A response moves the fit at most ``correction_outlier_clip`` typical relative errors away
  from its prediction (a robust fit: one answer the model could not foresee, a predicted hit the engine no
  longer held, does not set the offset for the next hundred). It is learned from the responses that computed
  no image. Those that did teach ``visual_s_per_token``: what an uncached image costs beyond its tokens at the
  text rate (the engine's image processing and vision encoder, which vLLM skips for an image whose blocks are
  cached): the decayed excess of their measured TTFT over the rest of their prediction, over their decayed
  uncached visual tokens.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from litellm_kv.config import doc


@dataclass(slots=True)
class TtftSettings:
    """Defaults and learning of the TTFT cost model (``model_groups.<g>.kv.ttft``)."""

    prefill_s_per_token: float = doc(
        "Seconds per uncached prompt token before the engine's figures are known (the default is an 8B "
        "model on one H100: about 41 ms per 1,000 tokens).",
        default=4.0e-5,
    )
    prefill_overhead_s: float = doc(
        "Seconds per request of prefill besides its tokens (scheduling, sampling the first token); the "
        "per-token rate is learned beyond it. Capped at half the engine's mean prefill time per request "
        "once the engine reports prefills (a small model's requests may prefill faster than this).",
        default=0.005,
    )
    visual_s_per_token: float = doc(
        "Seconds per uncached visual token (an image's placeholder tokens) beyond the text rate, before the "
        "proxy's measurements of image requests are known: the engine's image processing and vision encoder, "
        "which it skips when the image's blocks are cached. Learned per replica from measured TTFTs.",
        default=4.0e-5,
    )
    decode_step_s: float = doc(
        "Seconds of one engine step beside running decodes before the engine's inter-token latency is known.",
        default=0.008,
    )
    chunk_tokens: int = doc(
        "The engines' --max-num-batched-tokens: prefill advances this many tokens per engine step, and each "
        "step beside running decodes pays one decode step.",
        default=2048,
    )
    work_weight: float = doc(
        "Weight of the request's own prefill seconds added to its predicted TTFT: the time it takes from "
        "every later request on that replica. 0 picks by this request's TTFT alone; higher values favour "
        "cache hits over an idle replica when both would serve this request about as fast.",
        default=0.5,
    )
    decode_weight: float = doc(
        "Weight of the request's predicted decode time on a replica (its mean output length × that replica's "
        "current decode step) in the cost: running decodes make every step of a busy replica slower, which "
        "a TTFT alone does not see. 0 ignores decode.",
        default=0.3,
    )
    stall_weight: float = doc(
        "Weight of the stall this request's prefill inflicts on a replica's running decodes: this weight × its "
        "own prefill seconds there × the replica's running decodes is added to the cost. A replica that would "
        "answer this request sooner by recomputing its prompt slows every decode it runs meanwhile, which a TTFT "
        "does not see. 0 disables it.",
        default=0.1,
    )
    output_tokens: float = doc(
        "Output tokens per request assumed before the engines' vllm:request_generation_tokens is known.",
        default=128.0,
    )
    recent_weight: float = doc(
        "Weight of the decayed prefill work recently sent to a replica and no longer in flight, in seconds "
        "at its prefill rate: the replica's recent share of the traffic, which spreads new prefixes the way "
        "later requests will follow them, and paced sessions when nothing is in flight between turns.",
        default=1.0,
    )
    slo_ttft_s: float = doc(
        "The time to first token this group's requests are to meet, seconds (0: none). Replicas predicted to "
        "meet it are preferred: the lowest cost among them wins, so the cost's other terms (work_weight, "
        "decode_weight, recent work) never send a request to a replica predicted to miss the target while "
        "another is predicted to meet it. When none is, the lowest cost wins as without a target (counted in "
        "litellm_kv_routing_slo_unmet_total).",
        default=0.0,
    )
    imbalance_guard: bool = doc(
        "Apply kv.cost's imbalance guard (on token loads) on top of the TTFT cost as well. Off by default: the "
        "TTFT cost prices every queue in seconds itself, and past the knee the guard's overrides of it sent hits "
        "away and lowered goodput (docs/benchmarks.md). On, it is a backstop against rates that are far off; "
        "kv.cost.imbalance_guard false turns it off in both models.",
        default=False,
    )
    hold: bool = doc(
        "Prefix hold: a request stays with the replicas holding its longest predicted hit (the cheapest of them) "
        "while its prefix is not hot (hold_fair_share) and such a replica is predicted to answer within hold_ttft_s "
        "with no more requests in flight than hold_running_ratio × the group's mean + hold_running_slack; otherwise "
        "the lowest cost wins. Groups of users sharing a prompt then stay where it is cached, as SGLang's cache-aware "
        "policy keeps them, while a hot prefix still spreads (docs/routing.md). False: the lowest cost always wins.",
        default=True,
    )
    hold_ttft_s: float = doc(
        "Prefix hold: a holder is kept only while its predicted TTFT is at most this many seconds (a TTFT target, "
        "slo_ttft_s, bounds it too).",
        default=2.0,
    )
    hold_fair_share: float = doc(
        "Prefix hold: a prefix is hot, and not held, when its share of the group's recent requests × the replica "
        "count ÷ the replicas holding it is above this: 1 is exactly a fair share of the replicas that hold it.",
        default=0.6,
    )
    hold_prior_requests: float = doc(
        "Prefix hold: requests added to the group's recent count when a share is taken, so that in the first "
        "moments of traffic a prefix is not hot only because few requests came before it.",
        default=100.0,
    )
    hold_half_life_s: float = doc(
        "Prefix hold: half-life of the per-prefix and group request counts, seconds.", default=30.0
    )
    hold_running_ratio: float = doc(
        "Prefix hold: a holder is kept only while its requests in flight, queued for prefill or decoding (the larger "
        "of the router's count and the engine's running + waiting), are at most this × the group's mean plus "
        "hold_running_slack: sessions and bursts do not pile up on one replica.",
        default=1.5,
    )
    hold_running_slack: float = doc("Prefix hold: requests in flight allowed above hold_running_ratio × the mean.",
                                    default=4.0)
    hold_max_prefixes: int = doc(
        "Prefix hold: prefixes counted per group in memory; past this the least recently seen is dropped.",
        default=65536,
    )
    unique_by_recent_work: bool = doc(
        "A request predicted to hit nowhere goes to the replica with the least prefill work recently sent to it "
        "(the decayed sum of kv.load.recent_half_life_s) among those predicted to answer within the hold's TTFT "
        "bound (all when none is), the cost breaking ties: new prefixes spread over the replicas by what each was "
        "given to cache, as SGLang places them by tree size. False: the lowest cost wins.",
        default=True,
    )
    prior_requests: float = doc(
        "Weight of the defaults in the fit, in requests' worth of engine data: the learned rates take over "
        "once the engine has reported more than this many prefills.",
        default=5.0,
    )
    peer_prior_requests: float = doc(
        "Weight of the group's pooled rates (the mean of its calibrated replicas') in each replica's own, in "
        "requests' worth of that replica's engine data: replicas of one model with a few requests behind them "
        "share one estimate instead of differing by the noise of those few, and a replica's own figures take "
        "over as its data grows (a slower replica in the group then shows).",
        default=50.0,
    )
    half_life_requests: float = doc(
        "Engine observations halve in weight after this many more requests (the rates follow a replica "
        "whose speed changes).",
        default=500.0,
    )
    correction_half_life: float = doc(
        "Proxy-measured TTFTs halve in weight after this many more responses.", default=50.0
    )
    correction_min: float = doc("Smallest factor the fit of measured on predicted TTFT may apply.", default=0.5)
    correction_max: float = doc("Largest factor the fit of measured on predicted TTFT may apply.", default=4.0)
    correction_prior_responses: float = doc(
        "Weight of factor 1 in the fit of measured on predicted TTFT, in responses: while the predictions hardly "
        "vary, the fit cannot tell a factor from an offset and learns an offset only.",
        default=5.0,
    )
    correction_outlier_clip: float = doc(
        "A response moves the fit of measured on predicted TTFT at most this many typical errors away from its "
        "corrected prediction (typical error: the replica's decayed mean of |measured - predicted| / predicted, "
        "from one prior response at 100 %), so that an answer the model could not foresee (a predicted hit the "
        "engine no longer held, a stall) does not set the offset for the responses after it; 0 turns the clip off.",
        default=4.0,
    )
    offset_max_s: float = doc(
        "Largest TTFT offset (the time per request outside the engine's prefill, learned from the proxy's "
        "measured TTFTs); a response counts at most correction_max times its prediction plus this.",
        default=1.0,
    )

    def validate(self) -> None:
        for name in ("prefill_s_per_token", "decode_step_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("slo_ttft_s", "prefill_overhead_s", "visual_s_per_token", "work_weight", "decode_weight",
                     "stall_weight", "output_tokens", "recent_weight", "prior_requests", "peer_prior_requests",
                     "hold_ttft_s", "hold_fair_share", "hold_prior_requests", "hold_running_ratio",
                     "hold_running_slack", "offset_max_s", "correction_prior_responses",
                     "correction_outlier_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not self.hold_half_life_s > 0:
            raise ValueError("hold_half_life_s must be positive")
        if self.hold_max_prefixes < 1:
            raise ValueError("hold_max_prefixes must be >= 1")
        if self.chunk_tokens <= 0:
            raise ValueError("chunk_tokens must be positive")
        if not (self.half_life_requests > 0 and self.correction_half_life > 0):
            raise ValueError("half lives must be positive")
        if not 0 < self.correction_min <= 1.0 <= self.correction_max:
            raise ValueError("need 0 < correction_min <= 1 <= correction_max")


@dataclass(slots=True, frozen=True)
class EngineTimings:
    """Cumulative timing figures of one replica's ``/metrics`` (sums and counts of vLLM histograms)."""

    prefill_s_sum: float = 0.0
    prefill_count: float = 0.0
    prefill_tokens_sum: float = 0.0  # vllm:request_prefill_kv_computed_tokens (uncached tokens computed)
    itl_s_sum: float = 0.0
    itl_count: float = 0.0
    output_tokens_sum: float = 0.0  # vllm:request_generation_tokens
    output_count: float = 0.0


@dataclass(slots=True, frozen=True)
class ReplicaRates:
    """What the cost model uses for one replica (defaults until learned)."""

    prefill_s_per_token: float
    prefill_overhead_s: float
    decode_step_s: float
    output_tokens: float = 128.0
    correction: float = 1.0  # measured TTFT per second of engine-derived prediction
    engine_prefills: float = 0.0  # prefills the fit has seen (decayed)
    measured_ttfts: float = 0.0  # proxy-measured TTFTs behind the correction and offset (decayed)
    visual_s_per_token: float = 4.0e-5  # uncached visual token beyond the text rate
    measured_visual: float = 0.0  # proxy-measured responses with uncached images behind it (decayed)
    offset_s: float = 0.0  # measured TTFT beyond the corrected prediction, per request

    @property
    def calibrated(self) -> bool:
        return self.engine_prefills > 0.0

    def corrected(self, raw_s: float) -> float:
        """A prediction of the cost model's formula (``raw_s`` seconds) corrected by the proxy's measurements."""
        return self.correction * raw_s + self.offset_s


_FIT_WEIGHT_FLOOR_S = 1e-3  # the smallest corrected prediction the TTFT fit weighs by (RateBook.observe_ttft)


class _Learner:
    """The learned state of one replica: the prefill fit's decayed sums, a decode-step average and the decayed
    sums of the fit of measured on predicted TTFT. A few floats."""

    __slots__ = ("fit_e", "fit_n", "fit_w", "fit_x", "fit_xx", "fit_xy", "fit_y", "last", "nn", "ns", "nt", "out",
                 "out_w", "rates", "step", "step_w", "vis_excess", "vis_tokens", "vis_w")

    def __init__(self, cfg: TtftSettings) -> None:
        self.last: EngineTimings | None = None
        # Decayed sums over scrape intervals: requests, computed tokens, prefill seconds.
        self.nn = self.nt = self.ns = 0.0
        self.step = cfg.decode_step_s
        self.step_w = 0.0
        self.out = cfg.output_tokens
        self.out_w = 0.0
        # Decayed count of responses, and decayed sums over them, each weighted 1 / its corrected prediction, of 1,
        # predicted (x) and measured (y) TTFT, x², x·y.
        self.fit_n = self.fit_w = self.fit_x = self.fit_y = self.fit_xx = self.fit_xy = 0.0
        # Decayed sum over the same responses of |measured - corrected prediction| / corrected prediction.
        self.fit_e = 0.0
        # Decayed sums over responses that computed images: excess seconds, uncached visual tokens, responses.
        self.vis_excess = self.vis_tokens = self.vis_w = 0.0
        self.rates = ReplicaRates(cfg.prefill_s_per_token, cfg.prefill_overhead_s, cfg.decode_step_s,
                                  cfg.output_tokens, visual_s_per_token=cfg.visual_s_per_token)


class RateBook:
    """Learned rates of every replica of one model group. Memory: one small learner per replica (the
    caller drops replicas that leave with :meth:`forget`)."""

    def __init__(self, cfg: TtftSettings | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg or TtftSettings()
        self._clock = clock
        self._by: dict[str, _Learner] = {}
        # Mean rates of the calibrated replicas (None: none yet) and each calibrated replica's rates shrunk
        # toward them, recomputed only when ``_peers_stale``.
        self._peers: ReplicaRates | None = None
        self._pooled: dict[str, ReplicaRates] = {}
        self._peers_stale = True
        self._default = ReplicaRates(self.cfg.prefill_s_per_token, self.cfg.prefill_overhead_s,
                                     self.cfg.decode_step_s, self.cfg.output_tokens,
                                     visual_s_per_token=self.cfg.visual_s_per_token)

    def rates(self, replica: str) -> ReplicaRates:
        """The rates the cost model uses for a replica. Once its engine has reported prefills: its own fit,
        shrunk toward the mean of the group's calibrated replicas with the weight of ``peer_prior_requests``
        requests (identical replicas with little data behind them would otherwise differ by noise, and that
        noise, not their queues or caches, would choose). Before that: its calibrated peers' mean (the same
        model on the same kind of engine), else the defaults. A new replica then competes on its queue, not
        on a prior sized for other hardware that would keep it idle and never calibrated."""
        if self._peers_stale:
            self._peers, self._pooled, self._peers_stale = self._peer_mean(), {}, False
        lr = self._by.get(replica)
        own = lr.rates if lr is not None else self._default
        if not own.calibrated:
            # Without prefill data, not its own decode step or output length either: a few noisy steps seen
            # first (a loaded machine) would set it apart from identical replicas still on the defaults.
            return self._peers or replace(own, decode_step_s=self._default.decode_step_s,
                                          output_tokens=self._default.output_tokens)
        pooled = self._pooled.get(replica)
        if pooled is None:
            pooled = self._pooled[replica] = self._shrunk(own)
        return pooled

    def _shrunk(self, own: ReplicaRates) -> ReplicaRates:
        peers, k = self._peers, self.cfg.peer_prior_requests
        if peers is None or k <= 0:
            return own
        w = own.engine_prefills / (own.engine_prefills + k)

        def mix(a: float, b: float) -> float:
            return w * a + (1.0 - w) * b

        return ReplicaRates(mix(own.prefill_s_per_token, peers.prefill_s_per_token),
                            mix(own.prefill_overhead_s, peers.prefill_overhead_s),
                            mix(own.decode_step_s, peers.decode_step_s), mix(own.output_tokens, peers.output_tokens),
                            own.correction, own.engine_prefills, own.measured_ttfts, own.visual_s_per_token,
                            own.measured_visual, own.offset_s)

    def _peer_mean(self) -> ReplicaRates | None:
        """The mean rates of the calibrated replicas, None without one; kept until a replica's rates change
        or a replica leaves (``rates`` is called per candidate per decision)."""
        peers = [x.rates for x in self._by.values() if x.rates.calibrated]
        if not peers:
            return None
        n = len(peers)
        return ReplicaRates(
            sum(p.prefill_s_per_token for p in peers) / n, sum(p.prefill_overhead_s for p in peers) / n,
            sum(p.decode_step_s for p in peers) / n, sum(p.output_tokens for p in peers) / n,
            sum(p.correction for p in peers) / n, visual_s_per_token=sum(p.visual_s_per_token for p in peers) / n,
            offset_s=sum(p.offset_s for p in peers) / n,
        )

    def _learner(self, replica: str) -> _Learner:
        lr = self._by.get(replica)
        if lr is None:
            lr = self._by[replica] = _Learner(self.cfg)
        return lr

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the learners of replicas not in ``keep``."""
        wanted = set(keep)
        for r in [r for r in self._by if r not in wanted]:
            del self._by[r]
        self._peers_stale = True

    # -- engine figures ---------------------------------------------------------------------------------
    def observe_engine(self, replica: str, now: EngineTimings) -> None:
        """One scrape's cumulative figures; the change since the previous scrape is one observation. A
        counter that went back (engine restarted) starts a new baseline."""
        lr = self._learner(replica)
        prev, lr.last = lr.last, now
        if prev is None:
            return
        n = now.prefill_count - prev.prefill_count
        tokens = now.prefill_tokens_sum - prev.prefill_tokens_sum
        secs = now.prefill_s_sum - prev.prefill_s_sum
        if n < 0 or tokens < 0 or secs < 0:
            return
        cfg = self.cfg
        if n > 0:
            keep = 0.5 ** (n / cfg.half_life_requests)
            lr.nn = lr.nn * keep + n
            lr.nt = lr.nt * keep + tokens
            lr.ns = lr.ns * keep + secs
        steps = now.itl_count - prev.itl_count
        step_secs = now.itl_s_sum - prev.itl_s_sum
        if steps > 0 and step_secs >= 0:
            keep = 0.5 ** (min(steps, cfg.half_life_requests) / cfg.half_life_requests)
            lr.step = (lr.step * lr.step_w * keep + step_secs) / (lr.step_w * keep + steps)
            lr.step_w = lr.step_w * keep + steps
        outs = now.output_count - prev.output_count
        out_tokens = now.output_tokens_sum - prev.output_tokens_sum
        if outs > 0 and out_tokens >= 0:
            keep = 0.5 ** (min(outs, cfg.half_life_requests) / cfg.half_life_requests)
            lr.out = (lr.out * lr.out_w * keep + out_tokens) / (lr.out_w * keep + outs)
            lr.out_w = lr.out_w * keep + outs
        self._refit(lr)

    def _refit(self, lr: _Learner) -> None:
        cfg = self.cfg
        # The set overhead, but at most half the engine's mean prefill time: on an engine whose requests
        # prefill in less than the overhead (a small model), the time beyond it would be nothing and the
        # per-token rate would fall to zero, pricing every cache hit at nothing.
        a = cfg.prefill_overhead_s
        if lr.nn > 0:
            a = min(a, 0.5 * lr.ns / lr.nn)
        # Seconds per computed token: the decayed time beyond the per-request overhead over the decayed tokens,
        # with prior_requests requests of the typical size at the default rate added to both (so the defaults
        # hold before data and the engine's figures take over as they come). A ratio of sums, not a
        # two-parameter fit: histogram deltas of busy intervals mix request sizes, which leaves the overhead
        # and the per-token rate poorly separable, and a ratio cannot go negative or diverge.
        mt = lr.nt / lr.nn if lr.nn > 0 else 1000.0
        prior_tokens = cfg.prior_requests * mt
        b = (max(0.0, lr.ns - a * lr.nn) + prior_tokens * cfg.prefill_s_per_token) / max(1e-9, lr.nt + prior_tokens)
        b = max(b, 1e-9)
        corr, off = self._fit_ttft(lr)
        # Seconds per uncached visual token beyond the text rate: the decayed excess over the decayed tokens, with
        # prior_requests responses of the typical image at the default mixed in, never below zero.
        mv = lr.vis_tokens / lr.vis_w if lr.vis_w > 0 else 1000.0
        prior_vis = cfg.prior_requests * mv
        v = max(0.0, (lr.vis_excess + prior_vis * cfg.visual_s_per_token) / max(1e-9, lr.vis_tokens + prior_vis))
        lr.rates = ReplicaRates(b, a, lr.step, lr.out, corr, lr.nn, lr.fit_n, v, lr.vis_w, off)
        self._peers_stale = True

    def _fit_ttft(self, lr: _Learner) -> tuple[float, float]:
        """(correction, offset): the decayed weighted least-squares line of measured on predicted TTFT, its slope
        pulled toward 1 with the weight of ``correction_prior_responses`` responses (in units of the predictions'
        weighted mean square, so the pull does not depend on their scale), then clamped; the offset is what the
        line leaves."""
        cfg = self.cfg
        w = lr.fit_w
        if w <= 0:
            return 1.0, 0.0
        mean_x, mean_y, mean_xx = lr.fit_x / w, lr.fit_y / w, lr.fit_xx / w
        var = max(0.0, mean_xx - mean_x * mean_x)
        cov = lr.fit_xy / w - mean_x * mean_y
        prior = cfg.correction_prior_responses * mean_xx * w / max(lr.fit_n, 1e-9)
        den = w * var + prior
        corr = (w * cov + prior) / den if den > 0 else 1.0
        if mean_y - corr * mean_x < 0:
            # The line would cross zero above the origin (answers sooner than predicted by more than the offset
            # could remove): no offset, the line through the origin.
            corr = (lr.fit_xy + prior) / (lr.fit_xx + prior) if lr.fit_xx > 0 else 1.0
        corr = min(cfg.correction_max, max(cfg.correction_min, corr))
        off = min(cfg.offset_max_s, max(0.0, mean_y - corr * mean_x))
        return corr, off

    # -- the proxy's own measurements ---------------------------------------------------------------
    def observe_ttft(self, replica: str, predicted_s: float, measured_s: float, *, visual_tokens: int = 0,
                     visual_s: float = 0.0) -> None:
        """A response's measured time to first token against what was predicted for it (``predicted_s``: the
        prediction before its correction and offset). Without uncached visual tokens it teaches the correction and
        offset (a point of their fit); with ``visual_tokens`` uncached visual tokens, of which ``visual_s`` seconds
        of the prediction, it teaches ``visual_s_per_token`` instead: the measured time beyond the corrected rest of
        the prediction. Either way one response counts at most ``correction_max`` times its prediction plus
        ``offset_max_s`` (a stalled one cannot throw the rates far off; rates that are truly higher still converge,
        a bounded step per response)."""
        if not (predicted_s > 0 and measured_s >= 0 and math.isfinite(measured_s)):
            return
        lr = self._learner(replica)
        cfg = self.cfg
        measured_s = min(measured_s, cfg.correction_max * predicted_s + cfg.offset_max_s)
        keep = 0.5 ** (1.0 / cfg.correction_half_life)
        if visual_tokens > 0:
            rest = lr.rates.corrected(max(0.0, predicted_s - visual_s))
            lr.vis_excess = lr.vis_excess * keep + (measured_s - rest)
            lr.vis_tokens = lr.vis_tokens * keep + visual_tokens
            lr.vis_w = lr.vis_w * keep + 1.0
            self._refit(lr)
            return
        # Each response weighs 1 / its corrected prediction (as the fit stands): the fit minimizes errors relative
        # to the prediction, so a few long prefills do not set the line for the many short ones, with no offset
        # the factor is about the ratio of the decayed sums of measured to predicted TTFT, and a near-zero prediction
        # weighs no more than the offset allows.
        x, y = predicted_s, measured_s
        p = max(lr.rates.corrected(x), _FIT_WEIGHT_FLOOR_S)
        rel = (y - p) / p
        if cfg.correction_outlier_clip > 0:
            # At most correction_outlier_clip typical errors from the prediction, the typical error counting one
            # prior response at 100 % (a fresh replica's first responses move the fit, but not all the way).
            limit = cfg.correction_outlier_clip * (lr.fit_e + 1.0) / (lr.fit_n + 1.0)
            y = p * (1.0 + max(-min(limit, 1.0), min(limit, rel)))
        lr.fit_e = lr.fit_e * keep + abs(rel)
        wi = 1.0 / p
        lr.fit_n = lr.fit_n * keep + 1.0
        lr.fit_w = lr.fit_w * keep + wi
        lr.fit_x = lr.fit_x * keep + wi * x
        lr.fit_y = lr.fit_y * keep + wi * y
        lr.fit_xx = lr.fit_xx * keep + wi * x * x
        lr.fit_xy = lr.fit_xy * keep + wi * x * y
        self._refit(lr)

    def status(self) -> dict[str, dict[str, float | bool]]:
        """Per replica: the rates in use and how much data is behind them (for /litellm-kv/health)."""
        out: dict[str, dict[str, float | bool]] = {}
        for r in self._by:
            x = self.rates(r)
            out[r] = {
                "prefill_ms_per_1k_tokens": round(x.prefill_s_per_token * 1e6, 3),
                "prefill_overhead_ms": round(x.prefill_overhead_s * 1e3, 3),
                "visual_ms_per_1k_tokens": round(x.visual_s_per_token * 1e6, 3),
                "measured_visual": round(x.measured_visual, 1),
                "decode_step_ms": round(x.decode_step_s * 1e3, 3),
                "output_tokens": round(x.output_tokens, 1),
                "correction": round(x.correction, 3),
                "ttft_offset_ms": round(x.offset_s * 1e3, 3),
                "engine_prefills": round(x.engine_prefills, 1),
                "measured_ttfts": round(x.measured_ttfts, 1),
                "calibrated": x.calibrated,
            }
        return out


def nearest_rank(sorted_xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values by nearest rank: the smallest value with at least ``q`` of them at or
    below it (no interpolation: always one of the values)."""
    return sorted_xs[max(0, math.ceil(q * len(sorted_xs)) - 1)]


def error_quantiles(errors: Sequence[float]) -> tuple[float, float, float]:
    """Of signed errors (at least one): the median and p90 of their absolute values and their median, by
    :func:`nearest_rank`."""
    absolute = sorted(abs(e) for e in errors)
    return nearest_rank(absolute, 0.5), nearest_rank(absolute, 0.9), nearest_rank(sorted(errors), 0.5)


class PredictionErrors:
    """Measured minus predicted TTFT of a group's latest streamed responses, exactly (the Prometheus histogram
    ``litellm_kv_ttft_prediction_error_seconds`` only gives bucket bounds). Bounded: the last ``window``
    errors and a count of every error ever recorded, which lets a reader take exactly the errors recorded
    after a point it noted (:meth:`since`)."""

    def __init__(self, window: int = 1024) -> None:
        self._recent: deque[float] = deque(maxlen=window)
        self.total = 0

    def add(self, error_s: float) -> None:
        if math.isfinite(error_s):
            self._recent.append(error_s)
            self.total += 1

    def since(self, count: int) -> tuple[list[float], int]:
        """The errors recorded after the first ``count`` (oldest first), and how many of those are no longer
        held (more than ``window`` recorded since)."""
        wanted = max(0, self.total - max(0, count))
        held = min(wanted, len(self._recent))
        return list(self._recent)[len(self._recent) - held:], wanted - held

    def status(self) -> dict[str, Any]:
        """The count, and over the errors held: the median and p90 of |error| and the median signed error
        (positive: responses came later than predicted), in ms."""
        out: dict[str, Any] = {"responses": self.total, "recent": len(self._recent)}
        if self._recent:
            p50, p90, signed = error_quantiles(self._recent)
            out["abs_error_ms"] = {"p50": round(1e3 * p50, 1), "p90": round(1e3 * p90, 1)}
            out["signed_error_ms_p50"] = round(1e3 * signed, 1)
        return out
