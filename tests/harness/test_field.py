"""The field workloads (tools/harness/field.py): deterministic, open-loop, the shapes they claim."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from litellm_kv.vllm.hashing import BlockHasher
from litellm_kv.vllm.tokenization import LocalChatTokenizer
from tools.harness import field
from tools.harness.engines import MODEL_DIR
from tools.harness.testbed import abc_order, abs_error


def test_same_seed_same_requests_and_rate_only_moves_times() -> None:
    a, b = field.make("chat", 1.0), field.make("chat", 1.0)
    assert [r.messages for r in a.requests] == [r.messages for r in b.requests]
    fast = field.make("chat", 4.0)
    assert [r.messages for r in fast.requests] == [r.messages for r in a.requests]
    assert fast.requests[-1].at_s < a.requests[-1].at_s


@pytest.mark.parametrize("name", ["chat", "fanout", "unique"])
def test_draws_are_new_arrivals_and_prompts_of_the_same_shape(name: str) -> None:
    first, again, second = field.make(name, 2.0), field.make(name, 2.0, draw=0), field.make(name, 2.0, draw=1)
    assert [r.messages for r in again.requests] == [r.messages for r in first.requests]
    assert [r.at_s for r in second.requests] != [r.at_s for r in first.requests]
    assert [r.messages for r in second.requests] != [r.messages for r in first.requests]
    # Same shape: as many requests, sessions and dependencies.
    assert len(second.requests) == len(first.requests)
    assert len({r.session for r in second.requests}) == len({r.session for r in first.requests})
    assert sum(r.after is not None for r in second.requests) == sum(r.after is not None for r in first.requests)
    # An explicit seed wins over the draw.
    assert [r.messages for r in field.make(name, 2.0, seed=7, draw=3).requests] == \
        [r.messages for r in field.make(name, 2.0, seed=7).requests]


def test_poisson_mean_gap_is_one_over_rate() -> None:
    t = field.poisson_times(4000, 2.5, random.Random(0))
    gaps = [y - x for x, y in itertools.pairwise(t)]
    assert statistics.fmean(gaps) == pytest.approx(0.4, rel=0.05)
    assert statistics.pstdev(gaps) == pytest.approx(0.4, rel=0.08)  # exponential: sd == mean


def test_chat_turns_wait_for_the_previous_turn_and_extend_its_history() -> None:
    w = field.chat_workload(groups=3, users_per_group=2, turns=3, rate=1.0)
    by_rid = {r.rid: r for r in w.requests}
    assert len(w.requests) == 18
    systems = {r.messages[0]["content"] for r in w.requests}
    assert len(systems) == 3  # one long system prompt per group
    for r in w.requests:
        if r.after is None:
            assert len(r.messages) == 2
            continue
        prev = by_rid[r.after]
        assert prev.session == r.session and prev.at_s <= r.at_s
        assert r.messages[:len(prev.messages)] == prev.messages  # the history is resent
        assert len(r.messages) == len(prev.messages) + 2


def test_fanout_sub_calls_share_the_lead_context_and_wait_for_it() -> None:
    w = field.fanout_workload(tasks=3, fanout=4, rate=2.0)
    leads = [r for r in w.requests if r.after is None]
    assert len(leads) == 3 and len(w.requests) == 15
    for r in w.requests:
        if r.after is not None:
            lead = w.requests[r.after]
            assert lead.after is None and r.messages[0] == lead.messages[0] and r.at_s == lead.at_s
    assert len({r.messages[0]["content"] for r in leads}) == 3


def test_sizes_in_tokens_and_the_control_shares_nothing() -> None:
    tok = LocalChatTokenizer(MODEL_DIR)
    hasher = BlockHasher("sha256", 32, hash_seed="0")
    u = field.unique_workload(n=6, prompt_tokens=2000, rate=1.0)
    blocks, mean_len, _ = field.distinct_blocks(u, tok.chat_tokens, hasher)
    assert mean_len == pytest.approx(2000, rel=0.1)
    assert blocks == sum(len(tok.chat_tokens(r.messages)) // 32 for r in u.requests)  # no block shared
    c = field.chat_workload(groups=2, users_per_group=3, turns=1, system_tokens=1500, rate=1.0)
    blocks_c, _, _ = field.distinct_blocks(c, tok.chat_tokens, hasher)
    assert blocks_c < 0.5 * sum(len(tok.chat_tokens(r.messages)) // 32 for r in c.requests)  # prefixes shared


def test_quantile_and_pooling() -> None:
    assert field.quantile([3, 1, 2, 4], 0.5) == 2
    assert field.quantile([1.0] * 19 + [9.0], 0.95) == 1.0
    assert math.isnan(field.quantile([], 0.5))
    o = [field.Outcome(i, 200, ttft_s=0.1 * (i + 1), e2e_s=1.0, prompt_tokens=100, cached_tokens=50 * (i % 2),
                       output_tokens=10) for i in range(4)]
    bad = field.Outcome(9, 500)
    run = field.OpenLoopRun("chat", "x", o[:2], 2.0) + field.OpenLoopRun("chat", "x", [*o[2:], bad], 2.0)
    assert run.runs == 2 and run.failures == 1 and len(run.ok) == 4
    assert run.ttft() == pytest.approx(0.25) and run.cached_ratio == pytest.approx(0.25)
    assert run.output_tps == pytest.approx(10.0)
    # Requests 1 and 3 found half their prompt cached (hits), 0 and 2 nothing; the failure counts in neither.
    kinds = run.by_cached_share()
    assert kinds["hit"] == {"n": 2, "ttft_mean_ms": 300.0, "ttft_p95_ms": 400.0}
    assert kinds["miss"] == {"n": 2, "ttft_mean_ms": 200.0, "ttft_p95_ms": 300.0}


def test_abc_order_puts_every_routing_early_and_late() -> None:
    assert abc_order("ABC", 2) == list("ABCCBA")
    assert abc_order("ABC", 3) == list("ABCCBAABC")


def test_abs_error_takes_exact_quantiles_of_the_responses_errors() -> None:
    # Measured − predicted TTFT of ten responses, in ms, as the proxy lists them on /litellm-kv/health.
    errors = [-300.0, -50.0, -10.0, 5.0, 5.0, 30.0, 30.0, 40.0, 70.0, 3000.0]
    # |e| sorted: 5 5 10 30 30 40 50 70 300 3000 -> nearest rank: the 5th (median) and the 9th (p90).
    assert abs_error(errors) == {"n": 10, "median_ms": 30.0, "p90_ms": 300.0, "signed_median_ms": 5.0}
    assert abs_error([-7.5]) == {"n": 1, "median_ms": 7.5, "p90_ms": 7.5, "signed_median_ms": -7.5}
    assert abs_error([]) is None


def test_image_conversations_resend_their_image_and_wait_for_the_previous_turn() -> None:
    from tools.harness.field import image_chat_workload

    wl = image_chat_workload(conversations=3, turns=3, rate=5.0, seed=1)
    assert len(wl.requests) == 9
    by_session: dict[str, list[field.FieldRequest]] = {}
    for r in wl.requests:
        by_session.setdefault(r.session, []).append(r)
    images = set()
    for turns in by_session.values():
        first = turns[0].messages[0]["content"][0]["image_url"]["url"]
        images.add(first)
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.after == prev.rid and nxt.messages[: len(prev.messages)] == prev.messages
            assert nxt.messages[0]["content"][0]["image_url"]["url"] == first
    assert len(images) == 3 and all(u.startswith("data:image/png;base64,") for u in images)
    assert image_chat_workload(conversations=3, turns=3, rate=5.0, seed=1) == wl  # deterministic


def test_placement_counts_prefix_groups_per_replica_and_requests_sent_elsewhere() -> None:
    wl = field.make("chat", 5.0, groups=3, users_per_group=2, turns=2, system_tokens=50, user_tokens=5,
                    reply_tokens=5)
    assert {field.prefix_group(r.session) for r in wl.requests} == {"g0", "g1", "g2"}
    assert (field.prefix_group("task4"), field.prefix_group("img2")) == ("task4", "img2")
    # g0 and g1 on a, g2 on b; one later request of g1 goes to b.
    later_g1 = [r.rid for r in wl.requests if r.session.startswith("g1u")][1:]
    outs = [field.Outcome(r.rid, 200, ttft_s=0.1, sent_s=r.at_s,
                          deployment="b" if r.session.startswith("g2") or r.rid == later_g1[0] else "a")
            for r in wl.requests]
    got = field.placement(field.OpenLoopRun("chat", "x", outs, 1.0), wl, {"a": "r0", "b": "r1"})
    assert got == {"groups": {"r0": 2, "r1": 1}, "away": 1}
