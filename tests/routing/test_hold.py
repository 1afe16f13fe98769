"""The prefix hold of the TTFT cost (kv.ttft.hold) and the placement of new prefixes (kv.ttft.unique_by_recent_work).

Pure: the cost model and the prefix counts, with a hand-driven clock."""

from __future__ import annotations

import pytest

from litellm_kv.index.base import ReplicaMatch
from litellm_kv.routing.cost import Candidate, CostModel, CostSettings
from litellm_kv.routing.hold import PrefixDemand
from litellm_kv.routing.ttft import TtftSettings

BS = 16
HASHES = list(range(1000, 1250))  # 250 blocks: a 4,000-token prompt


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _model(**kw: float) -> CostModel:
    return CostModel(CostSettings(), seed=0, ttft=TtftSettings(**kw))


def _demand(clock: Clock | None = None, prior: float = 100.0, max_prefixes: int = 1000) -> PrefixDemand:
    return PrefixDemand(30.0, prior, max_prefixes, clock=clock or Clock())


def _fleet(holder_recent: float = 200_000.0, holder_running: int = 0) -> list[Candidate]:
    """'holder' caches 200 of the prompt's blocks but was recently sent much work; 'b' and 'c' are idle. The cost
    alone sends the request away from the holder (its recent-work term outweighs the hit)."""
    return [Candidate("holder", ReplicaMatch(gpu=200), recent_prefill_tokens=holder_recent,
                      inflight_decode=holder_running),
            Candidate("b"), Candidate("c")]


def test_a_request_stays_with_the_holder_of_its_prefix_while_the_prefix_is_not_hot() -> None:
    m = _model()
    assert m.choose(4000, BS, _fleet()).replica != "holder"  # no counts given: the cost decides
    d = m.choose(4000, BS, _fleet(), hashes=HASHES, demand=_demand())
    assert (d.replica, d.reason, d.hold) == ("holder", "cache", "held")
    # Switched off, the same counts change nothing.
    off = _model(hold=False).choose(4000, BS, _fleet(), hashes=HASHES, demand=_demand())
    assert off.replica != "holder" and off.hold == ""


def test_a_hot_prefix_is_not_held() -> None:
    """The prefix is keyed by its last cached block: the share of recent requests it draws, × 3 replicas ÷ 1
    holder, passes 0.6 once it has drawn more than a fifth of the group's traffic (prior included)."""
    m, demand = _model(), _demand(prior=10.0)
    for _ in range(5):
        demand.share(None)  # five requests that hit nowhere
    d = m.choose(4000, BS, _fleet(), hashes=HASHES, demand=demand)
    assert d.hold == "held"  # 1 / (6 + 10) × 3 = 0.19
    for _ in range(3):
        d = m.choose(4000, BS, _fleet(), hashes=HASHES, demand=demand)
    assert d.hold == "hot" and d.replica != "holder"  # 4 / (9 + 10) × 3 = 0.63
    # Another prefix (a different last block) is counted apart.
    other = m.choose(4000, BS, [Candidate("holder", ReplicaMatch(gpu=100), recent_prefill_tokens=200_000.0),
                                Candidate("b"), Candidate("c")], hashes=HASHES, demand=demand)
    assert other.hold == "held"


def test_more_holders_make_a_larger_share_fair() -> None:
    m, demand = _model(), _demand(prior=0.0)
    cands = [Candidate(r, ReplicaMatch(gpu=200), recent_prefill_tokens=200_000.0) for r in ("h1", "h2")]
    for _ in range(3):
        demand.share(None)
    # Share 1/4 × 3 replicas ÷ 2 holders = 0.375: held, at the cheaper holder.
    d = m.choose(4000, BS, [*cands, Candidate("c")], hashes=HASHES, demand=demand)
    assert d.hold == "held" and d.replica in ("h1", "h2")
    # With one holder the same share would be hot: 2/5 × 3 = 1.2.
    d = m.choose(4000, BS, [cands[0], Candidate("h2"), Candidate("c")], hashes=HASHES, demand=demand)
    assert d.hold == "hot"


def test_a_holder_past_the_bounds_is_not_held() -> None:
    m = _model()
    # Running decodes: 9 > 1.5 × mean 9/3 + 4 = 8.5; 8 is at the bound 1.5 × 8/3 + 4.
    d = m.choose(4000, BS, _fleet(holder_running=9), hashes=HASHES, demand=_demand())
    assert (d.hold, d.replica == "holder") == ("busy", False)
    assert m.choose(4000, BS, _fleet(holder_running=8), hashes=HASHES, demand=_demand()).hold == "held"
    # Predicted TTFT over hold_ttft_s: 120K tokens queued ahead of the hit (~5 s at the default rate).
    queued = _fleet()
    queued[0].inflight_prefill_tokens = 120_000
    d = m.choose(4000, BS, queued, hashes=HASHES, demand=_demand())
    assert d.hold == "busy" and d.ttft_s["holder"] > TtftSettings().hold_ttft_s
    # A TTFT target below hold_ttft_s bounds the hold as well.
    held = m.choose(4000, BS, _fleet(), hashes=HASHES, demand=_demand())
    target = held.ttft_s["holder"] * 0.9
    d = _model(slo_ttft_s=target).choose(4000, BS, _fleet(), hashes=HASHES, demand=_demand())
    assert (held.hold, d.hold) == ("held", "busy")



def test_requests_queued_for_prefill_count_against_the_holder_as_decodes_do() -> None:
    """A burst sent at once is all queued for prefill, nothing decodes yet: the bound on requests in flight still
    stops the holder taking the whole burst (the router's count, or the engine's running + waiting)."""
    m = _model()
    burst = _fleet()
    burst[0].inflight_prefill_requests, burst[0].inflight_prefill_tokens = 9, 900
    d = m.choose(4000, BS, burst, hashes=HASHES, demand=_demand())
    assert (d.hold, d.replica == "holder") == ("busy", False)  # 9 > 1.5 × 9/3 + 4
    burst[0].inflight_prefill_requests = 8
    assert m.choose(4000, BS, burst, hashes=HASHES, demand=_demand()).hold == "held"
    scraped = _fleet()
    scraped[0].engine_running, scraped[0].engine_waiting = 1, 8
    assert m.choose(4000, BS, scraped, hashes=HASHES, demand=_demand()).hold == "busy"
    # Router and engine see the same requests: the larger count is taken, not their sum.
    both = _fleet()
    both[0].inflight_prefill_requests, both[0].engine_waiting = 8, 8
    assert m.choose(4000, BS, both, hashes=HASHES, demand=_demand()).hold == "held"

def test_demand_decays_and_is_bounded() -> None:
    clock = Clock()
    demand = _demand(clock, prior=0.0, max_prefixes=2)
    assert demand.share(1) == pytest.approx(1.0)
    assert demand.share(2) == pytest.approx(0.5)
    clock.t = 30.0  # one half-life: the counts of 1 and 2 are halved, the new request counts whole
    assert demand.share(2) == pytest.approx(1.5 / 2.0)
    demand.share(3)  # a third key drops the least recently seen (1)
    assert len(demand) == 2
    assert demand.share(1) == pytest.approx(1.0 / 4.0)  # 1 counts from nothing again
    with pytest.raises(ValueError):
        PrefixDemand(0.0, 0.0, 10)
    with pytest.raises(ValueError):
        PrefixDemand(30.0, 0.0, 0)
    for bad in ({"hold_half_life_s": 0.0}, {"hold_max_prefixes": 0}, {"hold_fair_share": -1.0}):
        with pytest.raises(ValueError):
            TtftSettings(**bad).validate()  # type: ignore[arg-type]


def test_a_new_prefix_goes_where_the_least_work_was_recently_sent() -> None:
    """A request that hits nowhere: 'b' has a short queue but was sent less work lately than the idle 'a'; by
    recent work it goes to 'b', by cost alone to 'a'."""
    def cands() -> list[Candidate]:
        return [Candidate("a", recent_prefill_tokens=50_000.0),
                Candidate("b", inflight_prefill_tokens=2000, inflight_prefill_requests=1,
                          recent_prefill_tokens=10_000.0)]
    d = _model().choose(4000, BS, cands(), hashes=HASHES, demand=_demand())
    assert (d.replica, d.reason, d.hold) == ("b", "unique", "")
    assert _model(unique_by_recent_work=False, recent_weight=0.0).choose(4000, BS, cands()).replica == "a"
