"""The TTFT cost model: rates learned from engine timing histograms and measured TTFTs (RateBook), and the
choices the cost makes with them (CostModel with TtftSettings). Pure units: the engines' real /metrics bodies
are parsed in tests/vllm/test_engine_metrics.py and the simulator drives the whole loop in
tests/simulator/test_sim.py."""

from __future__ import annotations

import math

import pytest

from litellm_kv.index.base import ReplicaMatch
from litellm_kv.routing.cost import Candidate, CostModel, CostSettings
from litellm_kv.routing.ttft import EngineTimings, PredictionErrors, RateBook, ReplicaRates, TtftSettings

BS = 16


def _feed(book: RateBook, replica: str, requests: list[tuple[int, float]], per_scrape: int = 3) -> None:
    """Scrapes of cumulative figures for ``requests`` = [(computed tokens, prefill seconds)]."""
    n = tokens = secs = 0.0
    book.observe_engine(replica, EngineTimings())
    for i, (t, s) in enumerate(requests, 1):
        n, tokens, secs = n + 1, tokens + t, secs + s
        if i % per_scrape == 0:
            book.observe_engine(replica, EngineTimings(secs, n, tokens))


def test_defaults_before_any_data() -> None:
    cfg = TtftSettings()
    book = RateBook(cfg)
    r = book.rates("never-seen")
    assert (r.prefill_s_per_token, r.prefill_overhead_s, r.decode_step_s, r.correction, r.offset_s) == (
        cfg.prefill_s_per_token, cfg.prefill_overhead_s, cfg.decode_step_s, 1.0, 0.0)
    assert not r.calibrated
    book.observe_engine("a", EngineTimings(5.0, 10, 1000))  # a first scrape is only a baseline
    assert book.rates("a").prefill_s_per_token == cfg.prefill_s_per_token


def test_learns_the_per_token_rate_beyond_the_overhead() -> None:
    # A CPU-like engine: 5 ms per request + 20 ms per 1,000 tokens, requests of 200..4,000 tokens.
    book = RateBook(TtftSettings(prefill_overhead_s=0.005))
    sizes = [200 + (i * 733) % 3800 for i in range(1000)]
    _feed(book, "a", [(t, 0.005 + 2.0e-5 * t) for t in sizes])
    r = book.rates("a")
    assert r.calibrated
    assert r.prefill_s_per_token == pytest.approx(2.0e-5, rel=0.05)


def test_a_few_prefills_move_the_rate_part_of_the_way() -> None:
    cfg = TtftSettings(prior_requests=20)
    book = RateBook(cfg)
    _feed(book, "a", [(1000, cfg.prefill_overhead_s + 1e-4 * 1000)] * 21)  # 2.5× the default rate
    b = book.rates("a").prefill_s_per_token
    assert cfg.prefill_s_per_token < b < 1e-4
    assert b == pytest.approx((cfg.prefill_s_per_token + 1e-4) / 2, rel=0.05)  # 20 prior vs 20 seen (21 − baseline)


def test_one_request_size_still_predicts_that_size_right() -> None:
    book = RateBook(TtftSettings())
    _feed(book, "a", [(1000, 0.1)] * 1000)
    r = book.rates("a")
    assert r.prefill_overhead_s + 1000 * r.prefill_s_per_token == pytest.approx(0.1, rel=0.05)


def test_counter_reset_starts_a_new_baseline() -> None:
    book = RateBook(TtftSettings())
    _feed(book, "a", [(1000, 0.03)] * 60)
    before = book.rates("a")
    book.observe_engine("a", EngineTimings(0.1, 1, 10))  # engine restarted: counters went back
    assert book.rates("a") == before
    book.observe_engine("a", EngineTimings(0.1 + 0.03 * 3, 4, 10 + 3000))
    assert book.rates("a").prefill_s_per_token == pytest.approx(before.prefill_s_per_token, rel=0.1)


def test_decode_step_and_output_length_follow_the_engine() -> None:
    book = RateBook(TtftSettings())
    book.observe_engine("a", EngineTimings())
    book.observe_engine("a", EngineTimings(itl_s_sum=0.3 * 100, itl_count=100, output_tokens_sum=640,
                                           output_count=10))
    # Before any prefill is reported (no calibrated peer either), the defaults: the first few steps of a loaded
    # machine set one replica's decode term far apart from its identical peers' (test_sdk_routing failed so).
    assert book.rates("a").decode_step_s == TtftSettings().decode_step_s
    assert book.rates("a").output_tokens == TtftSettings().output_tokens
    book.observe_engine("a", EngineTimings(prefill_s_sum=0.5, prefill_count=10, prefill_tokens_sum=10_000,
                                           itl_s_sum=0.3 * 100, itl_count=100, output_tokens_sum=640,
                                           output_count=10))
    r = book.rates("a")
    assert r.decode_step_s == pytest.approx(0.3)
    assert r.output_tokens == pytest.approx(64.0)


def test_measured_ttft_teaches_an_offset_per_request_and_a_factor() -> None:
    book = RateBook(TtftSettings())
    # 90 ms outside the engine's prefill, whatever the request's size: an offset, no factor.
    for i in range(100):
        predicted = 0.05 if i % 2 else 0.4
        book.observe_ttft("a", predicted_s=predicted, measured_s=predicted + 0.09)
    r = book.rates("a")
    assert (r.correction, r.offset_s) == (pytest.approx(1.0), pytest.approx(0.09))
    assert book.status()["a"]["ttft_offset_ms"] == pytest.approx(90.0)
    # Rates off in scale: every answer half as long as predicted, the factor learns it, no offset.
    for i in range(100):
        predicted = 0.1 if i % 2 else 0.8
        book.observe_ttft("b", predicted_s=predicted, measured_s=0.5 * predicted)
    # (the prior's 5 responses at factor 1 against ~72 decayed ones pull it up by a few hundredths)
    assert (book.rates("b").correction, book.rates("b").offset_s) == (pytest.approx(0.5, abs=0.05), 0.0)
    # Both at once (the real fleet's shape: 97 ms + 0.9 × the prediction).
    for i in range(200):
        predicted = (0.03, 0.1, 0.35)[i % 3]
        book.observe_ttft("c", predicted_s=predicted, measured_s=0.097 + 0.9 * predicted)
    r = book.rates("c")
    assert r.correction == pytest.approx(0.9, abs=0.02) and r.offset_s == pytest.approx(0.097, abs=0.005)
    # Predictions that hardly vary cannot tell a factor from an offset: the factor stays 1, an offset is learned.
    for _ in range(100):
        book.observe_ttft("d", predicted_s=0.2, measured_s=0.3)
    r = book.rates("d")
    assert (r.correction, r.offset_s) == (pytest.approx(1.0), pytest.approx(0.1))


def test_one_unforeseen_answer_does_not_set_the_offset() -> None:
    # The first request routed to a fresh replica is predicted to hit blocks the engine no longer holds (the demo's
    # fleet after a cache reset: predicted 15 ms, the whole prompt computed in 280 ms); then the replica answers
    # 30 ms after every prediction.
    def learn(clip: float) -> tuple[float, float]:
        book = RateBook(TtftSettings(correction_outlier_clip=clip))
        book.observe_ttft("a", predicted_s=0.015, measured_s=0.28)
        for i in range(40):
            predicted = 0.02 if i % 2 else 0.2
            book.observe_ttft("a", predicted_s=predicted, measured_s=predicted + 0.03)
        r = book.rates("a")
        return r.correction, r.offset_s

    correction, offset = learn(TtftSettings().correction_outlier_clip)
    assert correction == pytest.approx(1.0, abs=0.02) and offset == pytest.approx(0.03, abs=0.005)
    correction, offset = learn(0.0)  # without the clip that one answer still sets the line after 40 others
    assert offset > 0.08 and correction < 0.8


def test_the_clipped_fit_follows_a_replica_that_slows_down() -> None:
    book = RateBook(TtftSettings())
    for i in range(200):
        predicted = 0.02 if i % 2 else 0.2
        book.observe_ttft("a", predicted_s=predicted, measured_s=predicted + 0.03)
    # Exact for 200 responses, then three times slower: each response moves the fit a bounded step, and the
    # typical error it grows lets the next ones move it further.
    for i in range(300):
        predicted = 0.02 if i % 2 else 0.2
        book.observe_ttft("a", predicted_s=predicted, measured_s=3 * predicted + 0.03)
    r = book.rates("a")
    for predicted in (0.02, 0.2):
        assert r.corrected(predicted) == pytest.approx(3 * predicted + 0.03, rel=0.1)


def test_the_ttft_fit_is_bounded() -> None:
    book = RateBook(TtftSettings(correction_min=0.5, correction_max=4.0, offset_max_s=1.0))
    # A stalled response counts at most correction_max × its prediction + offset_max_s: one 30 s answer after
    # a steady 0.1 s offset moves the prediction by a bounded step.
    for _ in range(100):
        book.observe_ttft("a", predicted_s=0.1, measured_s=0.2)
    book.observe_ttft("a", predicted_s=0.1, measured_s=30.0)
    r = book.rates("a")
    assert 0.2 < r.correction * 0.1 + r.offset_s < 0.2 + (4 * 0.1 + 1.0) / 50
    # Far slower or far faster than predicted: the factor and the offset stay within their bounds.
    for i in range(100):
        book.observe_ttft("b", predicted_s=0.1 + 0.01 * (i % 5), measured_s=50.0)
        book.observe_ttft("c", predicted_s=0.5 + 0.1 * (i % 5), measured_s=0.01)
    assert book.rates("b").correction <= 4.0 and book.rates("b").offset_s <= 1.0
    assert book.rates("c").correction == 0.5 and book.rates("c").offset_s == 0.0
    # A near-zero prediction weighs as its corrected prediction (the offset): like one response, not a million.
    for _ in range(100):
        book.observe_ttft("e", predicted_s=0.1, measured_s=0.2)
    book.observe_ttft("e", predicted_s=1e-9, measured_s=1.0)
    assert book.rates("e").correction * 0.1 + book.rates("e").offset_s < 0.2 + 0.05
    book.observe_ttft("d", predicted_s=0.0, measured_s=1.0)  # nothing predicted: ignored
    book.observe_ttft("d", predicted_s=0.1, measured_s=math.nan)
    r = book.rates("d")
    assert (r.correction, r.offset_s, r.measured_ttfts) == (1.0, 0.0, 0.0)


def test_image_responses_teach_the_visual_rate_and_leave_the_offset_alone() -> None:
    cfg = TtftSettings(visual_s_per_token=4e-5)
    book = RateBook(cfg)
    for _ in range(30):
        book.observe_ttft("a", predicted_s=0.1, measured_s=0.2)  # text: the fit learns a 0.1 s offset
    assert book.rates("a").offset_s == pytest.approx(0.1)
    # Image responses: 0.08 s of their prediction was 2,000 visual tokens at the default; the rest (0.1 s, plus
    # the 0.1 s offset) leaves 0.2 s of a 0.4 s TTFT to the images: 1e-4 s per visual token.
    for _ in range(200):
        book.observe_ttft("a", predicted_s=0.18, measured_s=0.4, visual_tokens=2000, visual_s=0.08)
    r = book.rates("a")
    assert r.offset_s == pytest.approx(0.1)
    # (prior_requests responses at the default stay mixed in: 5 against ~72 decayed measurements)
    assert r.visual_s_per_token == pytest.approx(1e-4, rel=0.06)
    assert r.measured_visual > 30
    assert book.status()["a"]["visual_ms_per_1k_tokens"] == pytest.approx(100, rel=0.06)
    # Images that cost nothing beyond their tokens drive the rate to zero, never below.
    for _ in range(400):
        book.observe_ttft("b", predicted_s=0.1, measured_s=0.05, visual_tokens=1000, visual_s=0.04)
    assert book.rates("b").visual_s_per_token == 0.0
    # Before any image response: the default.
    assert book.rates("c").visual_s_per_token == cfg.visual_s_per_token


def test_a_stalled_image_response_moves_the_visual_rate_a_bounded_step() -> None:
    cfg = TtftSettings(visual_s_per_token=4e-5)
    book = RateBook(cfg)
    for _ in range(100):
        book.observe_ttft("a", predicted_s=0.18, measured_s=0.2, visual_tokens=2000, visual_s=0.08)
    before = book.rates("a").visual_s_per_token
    book.observe_ttft("a", predicted_s=0.18, measured_s=60.0, visual_tokens=2000, visual_s=0.08)
    after = book.rates("a").visual_s_per_token
    # Counted as 4 x 0.18 s = 0.72 s, not 60 s: well under twice the rate, where 60 s would make it ~20x.
    assert before < after < 2 * before
    # A replica whose images truly cost 10x the default still gets there.
    for _ in range(300):
        book.observe_ttft("b", predicted_s=0.1 + book.rates("b").visual_s_per_token * 2000,
                          measured_s=0.1 + 4e-4 * 2000, visual_tokens=2000,
                          visual_s=book.rates("b").visual_s_per_token * 2000)
    assert book.rates("b").visual_s_per_token == pytest.approx(4e-4, rel=0.1)


def test_memory_is_bounded_by_the_replicas_kept() -> None:
    book = RateBook(TtftSettings())
    for i in range(100):
        book.observe_ttft(f"r{i}", 0.1, 0.1)
    book.forget(["r1", "r2"])
    assert set(book.status()) == {"r1", "r2"}


def test_prediction_errors_are_exact_and_bounded() -> None:
    errors = PredictionErrors(window=4)
    assert errors.status() == {"responses": 0, "recent": 0}
    assert errors.since(0) == ([], 0)
    for e in (0.010, -0.030, 0.002, 0.500):
        errors.add(e)
    errors.add(math.nan)  # a clock gone wrong is not an error of the model: not counted
    errors.add(math.inf)
    # |e| sorted 2, 10, 30, 500 ms: nearest rank gives the 2nd (median) and the 4th (p90); signed: -30 2 10 500.
    assert errors.status() == {"responses": 4, "recent": 4, "abs_error_ms": {"p50": 10.0, "p90": 500.0},
                               "signed_error_ms_p50": 2.0}
    assert errors.since(2) == ([0.002, 0.500], 0)
    errors.add(0.040)
    errors.add(0.050)
    # Six recorded, four held: the first two are gone.
    assert errors.status()["responses"] == 6 and errors.status()["recent"] == 4
    assert errors.since(0) == ([0.002, 0.500, 0.040, 0.050], 2)
    assert errors.since(5) == ([0.050], 0)
    assert errors.since(6) == ([], 0)
    assert errors.since(99) == ([], 0)  # a count from the future (another process, a restart): nothing
    assert errors.since(-3) == ([0.002, 0.500, 0.040, 0.050], 2)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        TtftSettings(prefill_s_per_token=0).validate()
    with pytest.raises(ValueError):
        TtftSettings(correction_min=2.0).validate()
    with pytest.raises(ValueError):
        TtftSettings(offset_max_s=-0.1).validate()
    with pytest.raises(ValueError):
        TtftSettings(correction_prior_responses=-1).validate()
    with pytest.raises(ValueError):
        TtftSettings(correction_outlier_clip=-1).validate()
    with pytest.raises(ValueError):
        TtftSettings(work_weight=-1).validate()


# -- the cost ---------------------------------------------------------------------------------------------
def _model(**kw: float) -> CostModel:
    return CostModel(CostSettings(), seed=0, ttft=TtftSettings(**kw))


def test_hit_wins_when_queues_are_equal_and_predictions_are_in_seconds() -> None:
    m = _model()
    d = m.choose(4000, BS, [Candidate("hit", ReplicaMatch(gpu=200)), Candidate("cold")])
    assert d.replica == "hit" and d.reason == "cache"
    cfg = TtftSettings()
    # Cold: overhead + 4,000 tokens; hit: overhead + the 800 tokens past the 3,200 cached.
    assert d.ttft_s["cold"] == pytest.approx(cfg.prefill_overhead_s + 4000 * cfg.prefill_s_per_token)
    assert d.ttft_s["hit"] == pytest.approx(cfg.prefill_overhead_s + 800 * cfg.prefill_s_per_token)
    assert d.raw_ttft_s == pytest.approx(d.ttft_s["hit"])


def test_an_image_costs_its_encoding_where_it_is_not_cached() -> None:
    cfg = TtftSettings(visual_s_per_token=1e-4)
    m = CostModel(CostSettings(), seed=0, ttft=cfg)
    # 1,000 tokens; an image's 640 placeholder tokens at 160..800. "hit" holds the first 50 blocks (800 tokens).
    spans = [(160, 640)]
    d = m.choose(1000, BS, [Candidate("hit", ReplicaMatch(gpu=50)), Candidate("cold")], visual_spans=spans)
    assert d.replica == "hit"
    assert d.ttft_s["cold"] == pytest.approx(cfg.prefill_overhead_s + 1000 * cfg.prefill_s_per_token + 640 * 1e-4)
    assert d.ttft_s["hit"] == pytest.approx(cfg.prefill_overhead_s + 200 * cfg.prefill_s_per_token)
    assert (d.visual_tokens, d.visual_s, d.visual_extra_tokens) == (0, 0.0, 0.0)
    # Where the image is only partly cached, the whole image is encoded again.
    d = m.choose(1000, BS, [Candidate("part", ReplicaMatch(gpu=20))], visual_spans=spans)
    assert d.visual_tokens == 640 and d.visual_s == pytest.approx(0.064)
    assert d.visual_extra_tokens == pytest.approx(0.064 / cfg.prefill_s_per_token)
    assert d.ttft_s["part"] == pytest.approx(cfg.prefill_overhead_s + 680 * cfg.prefill_s_per_token + 0.064)
    # An idle replica without the image beats a holder whose queue holds the encoding of other images.
    queued = Candidate("hit", ReplicaMatch(gpu=50), inflight_prefill_tokens=round(3 * 0.064 / cfg.prefill_s_per_token),
                       inflight_prefill_requests=3)
    assert m.choose(1000, BS, [queued, Candidate("cold")], visual_spans=spans).replica == "cold"
    # Without images the prediction is the text model's.
    plain = m.choose(1000, BS, [Candidate("hit", ReplicaMatch(gpu=50)), Candidate("cold")])
    assert plain.ttft_s["cold"] == pytest.approx(cfg.prefill_overhead_s + 1000 * cfg.prefill_s_per_token)


def test_a_long_queue_ahead_of_the_hit_sends_the_request_to_an_idle_replica() -> None:
    m = _model()
    busy = Candidate("hit", ReplicaMatch(gpu=200), inflight_prefill_tokens=60_000)
    d = m.choose(4000, BS, [busy, Candidate("idle")])
    assert d.replica == "idle" and d.reason == "load"
    assert d.ttft_s["hit"] > d.ttft_s["idle"]


def test_a_burst_on_a_hot_prefix_spreads_before_the_engine_reports_it_waiting() -> None:
    """Requests the router has just sent and the engine's scrape does not show yet each pay the per-request
    overhead ahead of the next: a burst of short suffixes on one hot prefix stops piling onto its holder."""
    m = _model()
    rates = ReplicaRates(1e-5, 0.005, 0.003)  # a small engine: 1K tokens cost 10 ms beside a 5 ms floor
    prefix = ReplicaMatch(gpu=60)  # 960 of the 1,024 tokens cached on "hold"
    sent: dict[str, int] = {"hold": 0, "other": 0}
    for _ in range(24):
        cands = [Candidate(r, prefix if r == "hold" or sent["other"] else ReplicaMatch(),
                           inflight_prefill_tokens=64 * n if r == "hold" else 1024 * min(n, 1) + 64 * max(0, n - 1),
                           inflight_prefill_requests=n, engine_waiting=0, rates=rates)
                 for r, n in sent.items()]
        sent[m.choose(1024, BS, cands).replica] += 1
    assert sent["other"] >= 6, sent
    # Ten requests ahead: by their tokens alone "hold" is still faster; their per-request overhead is what
    # the engine's (lagging) waiting figure would miss.
    def ten_ahead(counted: int) -> str:
        return m.choose(1024, BS, [
            Candidate("hold", prefix, inflight_prefill_tokens=640, inflight_prefill_requests=counted,
                      engine_waiting=0, rates=rates),
            Candidate("other", engine_waiting=0, rates=rates)]).replica
    assert (ten_ahead(0), ten_ahead(10)) == ("hold", "other")


def test_learned_rates_change_the_answer() -> None:
    """The same queue is short on a fast replica and long on a slow one."""
    fast = ReplicaRates(1e-5, 0.001, 0.005)
    slow = ReplicaRates(2e-4, 0.001, 0.005)
    cands = [Candidate("a", ReplicaMatch(gpu=100), inflight_prefill_tokens=8000, rates=fast), Candidate("b")]
    assert _model().choose(2000, BS, cands).replica == "a"
    cands[0].rates = slow
    assert _model().choose(2000, BS, cands).replica == "b"


def test_cpu_tier_hits_cost_a_transfer() -> None:
    d = _model().choose(4000, BS, [Candidate("gpu", ReplicaMatch(gpu=200)), Candidate("cpu", ReplicaMatch(cpu=200))])
    assert d.replica == "gpu"
    assert d.ttft_s["cpu"] > d.ttft_s["gpu"]


def test_running_decodes_slow_the_prefill_down() -> None:
    d = _model().choose(3000, BS, [Candidate("quiet"), Candidate("decoding", inflight_decode=8)])
    assert d.replica == "quiet" and d.reason == "unique"
    assert d.ttft_s["decoding"] - d.ttft_s["quiet"] == pytest.approx(2 * TtftSettings().decode_step_s)


def test_work_weight_keeps_siblings_together() -> None:
    """A fan-out's second call: the first's 8K context is queued on 'a' (predicted there by sibling
    prediction); 'b' is idle. By its own TTFT alone 'b' is about as fast; counting the 8K tokens it would
    recompute, 'a' is cheaper."""
    cands = lambda: [Candidate("a", sibling_blocks=500, inflight_prefill_tokens=8400), Candidate("b")]  # noqa: E731
    assert _model(work_weight=0.0).choose(8400, BS, cands()).replica == "b"
    assert _model(work_weight=0.5).choose(8400, BS, cands()).replica == "a"


def test_a_prefill_pays_for_the_decodes_it_stalls() -> None:
    """Each replica pays stall_weight × its own prefill seconds for this request × its running decodes: a
    recompute there costs the most, a hit's short prefill little, an idle replica nothing."""
    def cands() -> list[Candidate]:
        return [Candidate("cold", inflight_decode=6), Candidate("holder", ReplicaMatch(gpu=200), inflight_decode=6),
                Candidate("quiet")]
    on, off = _model().choose(4000, BS, cands()), _model(stall_weight=0.0).choose(4000, BS, cands())
    cfg = TtftSettings()
    for name, new_tokens in (("cold", 4000), ("holder", 4000 - 200 * BS)):
        own = cfg.prefill_overhead_s + cfg.prefill_s_per_token * new_tokens
        assert on.scores[name] - off.scores[name] == pytest.approx(cfg.stall_weight * own * 6)
    assert on.scores["quiet"] == off.scores["quiet"]  # no running decodes: nothing to stall
    with pytest.raises(ValueError):
        TtftSettings(stall_weight=-0.1).validate()


def test_a_fan_out_follower_stays_with_its_context_rather_than_slow_a_busy_replicas_decodes() -> None:
    """A follower of an 8K context, two of whose calls are queued on 'a' (sibling prediction): 'b' has no queue
    but runs 8 decodes. By TTFT and work alone 'b' wins; counting the 8K-token recompute's delay to b's decodes,
    'a' does."""
    def cands() -> list[Candidate]:
        return [Candidate("a", sibling_blocks=500, inflight_prefill_tokens=16_000, inflight_decode=4),
                Candidate("b", inflight_decode=8)]
    assert _model(stall_weight=0.0).choose(8400, BS, cands()).replica == "b"
    assert _model().choose(8400, BS, cands()).replica == "a"


def test_a_ttft_target_keeps_requests_off_replicas_predicted_to_miss_it() -> None:
    """The hit's queue (45K tokens ahead, ~1.84 s) is cheaper by the cost than the idle replica, whose recent work
    charges it 2.4 s more; with a 1.5 s target only the idle replica is predicted to meet it."""
    def cands() -> list[Candidate]:
        return [Candidate("hit", ReplicaMatch(gpu=200), inflight_prefill_tokens=45_000),
                Candidate("idle", recent_prefill_tokens=60_000)]
    free = _model().choose(4000, BS, cands())
    assert (free.replica, free.slo_met) == ("hit", None)
    assert free.ttft_s["hit"] > 1.5 > free.ttft_s["idle"]
    m = CostModel(CostSettings(), seed=0, ttft=TtftSettings(slo_ttft_s=1.5))
    d = m.choose(4000, BS, cands())
    assert (d.replica, d.slo_met) == ("idle", True)
    # A target no replica is predicted to meet changes nothing but says so.
    m = CostModel(CostSettings(), seed=0, ttft=TtftSettings(slo_ttft_s=0.1))
    d = m.choose(4000, BS, cands())
    assert (d.replica, d.slo_met) == ("hit", False)
    with pytest.raises(ValueError):
        TtftSettings(slo_ttft_s=-1).validate()


def test_imbalance_guard_acts_only_when_the_ttft_cost_asks_for_it() -> None:
    """Rates far off (1e-7 s per token on the hot replica) make a 100K-token queue look free: the TTFT cost alone
    takes the hit there; with kv.ttft.imbalance_guard the token-load guard takes the cool replica."""
    cands = [Candidate("hot", ReplicaMatch(gpu=4000), inflight_prefill_tokens=100_000, inflight_decode=50,
                       rates=ReplicaRates(1e-7, 0.0, 1e-6)),
             Candidate("cool", inflight_prefill_tokens=1000)]
    assert _model().choose(64_000, BS, cands).replica == "hot"
    d = CostModel(CostSettings(), seed=0, ttft=TtftSettings(imbalance_guard=True)).choose(64_000, BS, cands)
    assert d.replica == "cool" and d.reason == "imbalance"
    off = CostModel(CostSettings(imbalance_guard=False), seed=0, ttft=TtftSettings(imbalance_guard=True))
    assert off.choose(64_000, BS, cands).replica == "hot"


def test_blocks_model_is_still_there() -> None:
    m = CostModel(CostSettings(), seed=0)
    assert m.kind == "blocks" and _model().kind == "ttft"
    d = m.choose(4000, BS, [Candidate("hit", ReplicaMatch(gpu=200)), Candidate("cold")])
    assert d.replica == "hit" and d.ttft_s == {}


def test_an_uncalibrated_replica_borrows_its_calibrated_peers_rates() -> None:
    book = RateBook(TtftSettings())
    assert book.rates("new") == book.rates("other")  # nobody calibrated: the defaults
    base = EngineTimings()
    book.observe_engine("warm", base)
    book.observe_engine("warm", EngineTimings(prefill_count=10, prefill_tokens_sum=10_000, prefill_s_sum=2.0,
                                              itl_s_sum=0.3, itl_count=100, output_tokens_sum=80, output_count=10))
    warm = book.rates("warm")
    assert warm.calibrated
    new = book.rates("new")
    assert not new.calibrated
    assert (new.prefill_s_per_token, new.decode_step_s, new.output_tokens) == (
        warm.prefill_s_per_token, warm.decode_step_s, warm.output_tokens)


def _scraped(book: RateBook, replica: str, prefills: int, secs: float, tokens: int, itl_s: float, steps: int,
             outputs: int) -> None:
    book.observe_engine(replica, EngineTimings())
    book.observe_engine(replica, EngineTimings(prefill_s_sum=secs, prefill_count=prefills, prefill_tokens_sum=tokens,
                                               itl_s_sum=itl_s, itl_count=steps, output_tokens_sum=outputs * 4,
                                               output_count=outputs))


def test_a_small_engines_capped_overheads_are_pooled_too() -> None:
    """Requests that prefill in 2 and 6 ms cap the 5 ms overhead at 1 and 3 ms: noise of two requests each,
    pulled to the group's mean like the other rates."""
    book = RateBook(TtftSettings())
    _scraped(book, "a", 2, 0.004, 500, itl_s=0.012, steps=6, outputs=2)
    _scraped(book, "b", 2, 0.012, 500, itl_s=0.012, steps=6, outputs=2)
    a, b = book.rates("a"), book.rates("b")
    assert b.prefill_overhead_s / a.prefill_overhead_s < 1.1
    assert a.prefill_overhead_s == pytest.approx(0.002, rel=0.05)


def test_replicas_with_little_data_share_the_groups_rates() -> None:
    # Two replicas of one model, two small requests each: the noise of those few sets their own fits
    # apart (3× in per-token rate, 2× in decode step), and that noise must not decide between them.
    book = RateBook(TtftSettings())
    _scraped(book, "a", 2, 0.010 + 2 * 0.005, 500, itl_s=0.012, steps=6, outputs=2)
    _scraped(book, "b", 2, 0.030 + 2 * 0.005, 500, itl_s=0.024, steps=6, outputs=2)
    a, b = book.rates("a"), book.rates("b")
    assert a.calibrated and b.calibrated
    assert b.prefill_s_per_token / a.prefill_s_per_token < 1.05
    assert b.decode_step_s / a.decode_step_s < 1.05
    # So an idle replica holding the conversation's blocks wins over the one whose few requests ran faster.
    model = _model()
    cands = [Candidate("b", ReplicaMatch(gpu=200 // BS), recent_prefill_tokens=400, rates=b),
             Candidate("a", recent_prefill_tokens=400, rates=a)]
    assert model.choose(250, BS, cands).replica == "b"


def test_a_replica_with_enough_data_keeps_its_own_rates() -> None:
    # The same two replicas after a thousand requests each: "b" really is slower, and its rates show it.
    book = RateBook(TtftSettings())
    _scraped(book, "a", 1000, 1000 * (0.005 + 0.01), 1_000_000, itl_s=3.0, steps=1000, outputs=1000)
    _scraped(book, "b", 1000, 1000 * (0.005 + 0.03), 1_000_000, itl_s=6.0, steps=1000, outputs=1000)
    a, b = book.rates("a"), book.rates("b")
    assert b.prefill_s_per_token / a.prefill_s_per_token > 2.5
    assert b.decode_step_s / a.decode_step_s > 1.8


def test_an_engine_faster_than_the_overhead_still_prices_its_tokens() -> None:
    # A small model: 1 ms + 4 µs per token, requests of 200..800 tokens, all under the 5 ms set overhead.
    book = RateBook(TtftSettings())
    sizes = [200 + (i * 137) % 600 for i in range(1000)]
    _feed(book, "a", [(t, 0.001 + 4e-6 * t) for t in sizes])
    r = book.rates("a")
    assert r.prefill_overhead_s < 0.005
    assert r.prefill_s_per_token > 1e-6  # not zero: a hit of 400 tokens is worth something
    mean_tokens = sum(sizes) / len(sizes)
    predicted = r.prefill_overhead_s + r.prefill_s_per_token * mean_tokens
    assert predicted == pytest.approx(0.001 + 4e-6 * mean_tokens, rel=0.1)  # the mean request still right (prior aside)
