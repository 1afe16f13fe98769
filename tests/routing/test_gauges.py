"""GaugeAging: the scraped waiting/running counts less this process's requests that have left them since the
scrape. Pure units; the simulator runs it inside litellm-kv's strategy (tests/simulator) and the SDK and proxy
tests route real engines with it."""

from __future__ import annotations

from litellm_kv.index.base import ReplicaMatch
from litellm_kv.routing.cost import Candidate, CostModel, CostSettings
from litellm_kv.routing.gauges import GaugeAging
from litellm_kv.routing.ttft import TtftSettings


def _scrape(aging: GaugeAging, replica: str = "a") -> None:
    aging.scraped(replica, aging.scrape_started(replica))


def test_a_request_queued_at_the_scrape_leaves_the_waiting_count_with_its_first_token() -> None:
    aging = GaugeAging()
    _scrape(aging)
    aging.begin("r1", "a")
    _scrape(aging)  # saw r1 waiting
    assert aging.adjust("a", 1, 0) == (1, 0)
    aging.first_token("r1")
    assert aging.adjust("a", 1, 0) == (0, 1)  # it is decoding now
    aging.end("r1")
    assert aging.adjust("a", 1, 0) == (0, 0)
    assert aging.adjust("a", 1, 1) == (0, 1)  # the running one is another request
    assert aging.in_flight() == 0


def test_a_request_running_at_the_scrape_leaves_the_running_count_when_it_ends() -> None:
    aging = GaugeAging()
    aging.begin("r1", "a")
    aging.first_token("r1")  # no scrape had seen it queued: nothing to take off
    assert aging.adjust("a", 0, 0) == (0, 0)
    _scrape(aging)  # saw r1 running
    aging.end("r1")
    assert aging.adjust("a", 0, 1) == (0, 0)


def test_a_response_without_a_first_token_leaves_the_queue_at_its_end() -> None:
    aging = GaugeAging()
    aging.begin("r1", "a")
    _scrape(aging)
    aging.end("r1")  # an error before the first token
    assert aging.adjust("a", 2, 3) == (1, 3)


def test_a_non_streaming_response_running_at_the_scrape_leaves_the_running_count() -> None:
    """What failed test_sdk_routing on a loaded machine: a scrape caught the previous non-streaming request
    decoding, and the stale "running" priced a decode step (tens of ms there) on the conversation's home."""
    aging = GaugeAging()
    aging.begin("r1", "a")
    _scrape(aging)  # the engine counts r1 as running
    aging.first_token("r1")  # known only with the whole response,
    aging.end("r1")  # at once before its end
    assert aging.adjust("a", 0, 1) == (0, 0)
    assert aging.adjust("a", 1, 1) == (0, 1)  # counted where it was most likely: waiting first


def test_requests_sent_after_the_scrape_started_are_not_taken_off() -> None:
    aging = GaugeAging()
    token = aging.scrape_started("a")
    aging.begin("late", "a")  # sent while the scrape was under way: the engine may not have had it yet
    aging.scraped("a", token)
    aging.first_token("late")
    aging.end("late")
    assert aging.adjust("a", 1, 1) == (1, 1)


def test_requests_leaving_while_a_scrape_is_under_way_stay_counted_until_the_next() -> None:
    aging = GaugeAging()
    aging.begin("r1", "a")
    _scrape(aging)
    token = aging.scrape_started("a")
    aging.first_token("r1")  # before or after the engine answered: unknown, so left in the new figures
    aging.scraped("a", token)
    assert aging.adjust("a", 1, 0) == (1, 0)
    _scrape(aging)
    assert aging.adjust("a", 0, 1) == (0, 1)


def test_a_new_scrape_replaces_what_was_taken_off_and_counts_never_go_below_zero() -> None:
    aging = GaugeAging()
    for rid in ("r1", "r2", "r3"):
        aging.begin(rid, "a")
    _scrape(aging)
    for rid in ("r1", "r2", "r3"):
        aging.end(rid)
    assert aging.adjust("a", 1, None) == (0, None)  # another router's request left too, or the engine moved on
    assert aging.adjust("a", None, None) == (None, None)
    _scrape(aging)
    assert aging.adjust("a", 2, 2) == (2, 2)
    # Replicas are independent; an unknown replica or request changes nothing.
    aging.begin("b1", "b")
    _scrape(aging, "b")
    aging.end("b1")
    aging.end("nobody")
    aging.first_token("nobody")
    assert aging.adjust("a", 2, 2) == (2, 2) and aging.adjust("b", 1, 0) == (0, 0)
    assert aging.adjust("unknown", 4, 5) == (4, 5)


def test_a_forgotten_replica_keeps_its_requests_from_counting_anywhere() -> None:
    aging = GaugeAging()
    aging.begin("r1", "a")
    _scrape(aging)
    aging.forget("a")
    aging.end("r1")
    assert aging.adjust("a", 1, 1) == (1, 1) and aging.in_flight() == 0


def test_a_stale_waiting_request_on_the_home_replica_no_longer_sends_a_conversation_away() -> None:
    """Why it matters: with the TTFT cost, one request counted as queued (waiting_request_tokens of prefill) on
    an idle replica outweighs a cache hit of a few hundred tokens."""
    model = CostModel(CostSettings(), ttft=TtftSettings())
    aging = GaugeAging()
    aging.begin("turn-1", "home")
    _scrape(aging, "home")  # the scrape caught turn 1 queued
    aging.end("turn-1")

    def choose(waiting: int | None) -> str:
        cands = [Candidate("home", ReplicaMatch(gpu=24), engine_waiting=waiting, engine_running=0),
                 Candidate("other", engine_waiting=0, engine_running=0)]
        return model.choose(416, 16, cands).replica

    assert choose(1) == "other"  # the scraped count as it is
    assert choose(aging.adjust("home", 1, 0)[0]) == "home"
