"""The replay simulator: cache model rules, strategies end to end (smoke), the CLI.

The simulated engines stand in for GPUs (none here); ``tests/simulator/test_sim_vs_engine.py`` checks the
cache model against a real vLLM engine.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from litellm_kv.routing.cost import CostSettings
from litellm_kv.routing.ttft import TtftSettings
from litellm_kv.simulator import cli_main
from litellm_kv.simulator.cache import BlockCache
from litellm_kv.simulator.interface import Strategy
from litellm_kv.simulator.model import ThroughputModel
from litellm_kv.simulator.report import Summary
from litellm_kv.simulator.runner import ALL, Slo, run_all, run_one
from litellm_kv.simulator.simulation import SimSettings, Simulation
from litellm_kv.simulator.strategies import LitellmKV
from litellm_kv.simulator.workload import agent_fanout, load_mooncake, multi_turn, shared_prefix

TRACE = Path("/work/shared/data/traces/conversation_trace.jsonl")
if not TRACE.exists():
    TRACE = Path(__file__).resolve().parents[2].parent / "shared/data/traces/conversation_trace.jsonl"


def test_cache_max_hit_rule_and_duplicate_last_block() -> None:
    c = BlockCache(capacity_blocks=16, block_size=4)
    a = c.admit([1, 2], prompt_tokens=8, output_tokens=1)
    assert a is not None and a.hit_blocks == 0 and a.stored == [1, 2]
    c.release(a, 8, 1, [])
    # Same 8-token prompt: only ⌊7/4⌋ = 1 block may hit; block 2 is recomputed as a second copy.
    b = c.admit([1, 2], prompt_tokens=8, output_tokens=1)
    assert b is not None and b.hit_blocks == 1 and b.stored == [2]
    assert c.cached_blocks() == 3
    c.release(b, 8, 1, [])
    assert c.match([1, 2, 3], 13) == 2


def test_cache_lru_evicts_tail_first_and_keeps_referenced_blocks() -> None:
    c = BlockCache(capacity_blocks=4, block_size=1)
    a = c.admit([10, 11, 12], prompt_tokens=4, output_tokens=0)  # 3 full blocks + 1 partial
    assert a is not None
    # Running requests' blocks cannot be evicted: nothing else fits.
    assert c.admit([20, 21], 3, 0) is None
    c.release(a, 4, 0, [])
    # Needs 2 blocks: the never-used one first, then the LRU cached one — the tail of the
    # finished request (12), not its head.
    b = c.admit([20, 21], prompt_tokens=3, output_tokens=0)
    assert b is not None and b.removed == [12]
    assert c.match([10, 11, 12], 4) == 2


def test_every_strategy_runs_and_exact_routers_predict_from_events() -> None:
    # 8 groups × 47 system blocks overflow one replica's 200 blocks but fit in the fleet's.
    reqs = shared_prefix(groups=8, prompts_per_group=12, system_len=3000, question_len=300,
                         output_len=50, rate=20.0, block_size=64)
    cfg = SimSettings(replicas=4, block_size=64, model=ThroughputModel(capacity_blocks=200))
    rows = {r.strategy: r for r in run_all(reqs, cfg, ALL, Slo())}
    assert set(rows) == set(ALL)
    assert all(r.requests == len(reqs) for r in rows.values())
    # Cache-aware routing beats random on a shared-prefix workload.
    assert rows["litellm-kv"].hit_ratio > rows["random"].hit_ratio + 0.15
    # Predictions come only from the engines' events through the real decoder and index.
    assert rows["litellm-kv"].prediction_exact > 0.8


def test_sibling_prediction_keeps_bursts_together_under_load() -> None:
    """Fan-out bursts arrive before the engine has computed (or announced) their shared
    context; only the sibling index can tell the router where the burst went."""
    reqs = agent_fanout(tasks=30, fanout=8, context_len=6000, rate=2.0, block_size=64)
    cfg = SimSettings(replicas=4, block_size=64, model=ThroughputModel(capacity_blocks=3000),
                    event_delay_s=0.2)

    def make(sibling_credit: float, stall_weight: float) -> Strategy:
        return LitellmKV(seed=0, cost=CostSettings(sibling_credit=sibling_credit),
                         ttft=TtftSettings(stall_weight=stall_weight))

    async def both(stall_weight: float) -> tuple[Summary, Summary]:
        with_sib, _ = await run_one(reqs, cfg, "litellm-kv", Slo(), lambda n, s: make(1.0, stall_weight))
        without, _ = await run_one(reqs, cfg, "litellm-kv", Slo(), lambda n, s: make(0.0, stall_weight))
        return with_sib, without

    # The defaults: followers wait for their context where it is being computed (more hits, more throughput;
    # their TTFT tail is that wait, docs/benchmarks.md "The stall term").
    with_sib, without = asyncio.run(both(TtftSettings().stall_weight))
    assert with_sib.hit_ratio > without.hit_ratio + 0.03
    assert with_sib.throughput_rps > 1.1 * without.throughput_rps
    # Without the stall term a follower spills to an idle replica when that is faster: the tail is shorter too.
    with_sib, without = asyncio.run(both(0.0))
    assert with_sib.hit_ratio > without.hit_ratio + 0.03
    assert with_sib.ttft_p99_s < 0.85 * without.ttft_p99_s


def test_chat_turns_hit_previous_answers() -> None:
    reqs = multi_turn(sessions=6, turns=4, think_s=2.0, block_size=64)
    cfg = SimSettings(replicas=2, block_size=64)
    (row,) = run_all(reqs, cfg, ["litellm-kv"], Slo())
    assert row.hit_ratio > 0.7


def test_trace_expansion_keeps_prefix_chaining() -> None:
    reqs = load_mooncake(TRACE, block_size=64, limit=50)
    assert len(reqs) == 50
    for r in reqs:
        assert len(r.blocks) == r.prompt_tokens // 64
    # Every conversation shares the trace's first 512-token block.
    assert all(r.blocks[:8] == reqs[0].blocks[:8] for r in reqs)


def test_cli_replay_writes_json(tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "r.json"
    rc = cli_main(["replay", "--trace", str(TRACE), "--limit", "120", "--speed", "4",
                   "--strategies", "round-robin,litellm-kv", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [r["strategy"] for r in data["results"]] == ["round-robin", "litellm-kv"]
    assert 0.0 <= data["results"][1]["hit_ratio"] <= 1.0


def test_generators_give_each_request_its_own_tail() -> None:
    """Requests that share a head (system prompt, task context, hot prefix) still differ after it;
    a generator that repeated whole prompts would inflate every hit ratio measured on it."""
    from litellm_kv.simulator.workload import agent_fanout, hot_prefix, shared_prefix

    for reqs in (shared_prefix(groups=2, prompts_per_group=3, rate=100.0),
                 agent_fanout(tasks=2, fanout=4),
                 hot_prefix(n=50, prefixes=3)):
        assert len({tuple(r.blocks) for r in reqs}) == len(reqs)
    heads = {r.blocks[0] for r in shared_prefix(groups=2, prompts_per_group=3, rate=100.0)}
    assert len(heads) == 2


def test_ttft_model_calibrates_from_the_engines_histograms_and_predicts_ttft() -> None:
    """The simulated engines publish vLLM's prefill-time, computed-token, inter-token and output-length
    histograms; litellm-kv's RateBook learns each replica's rates from them (and from the TTFTs it sees),
    and its predictions land near the simulated TTFTs. Rates start from a deliberately wrong default (10×
    the simulated H100's 41 ms per 1,000 tokens); the simulated prefill time of a short sibling call also
    carries a decode step per chunk, so the learned per-token rate sits above 41 ms."""
    from litellm_kv.routing.ttft import TtftSettings

    reqs = agent_fanout(tasks=30, fanout=6, context_len=6000, rate=1.0, block_size=64)
    cfg = SimSettings(replicas=4, block_size=64)
    wrong = TtftSettings(prefill_s_per_token=4e-4)  # 10× the simulated H100's rate

    async def go() -> tuple[Summary, LitellmKV]:
        row, strat = await run_one(reqs, cfg, "litellm-kv", Slo(), lambda n, s: LitellmKV(seed=0, ttft=wrong))
        assert isinstance(strat, LitellmKV)
        return row, strat

    row, strat = asyncio.run(go())
    rates = strat.rates.status()
    seen = [r for r in rates.values() if r["calibrated"]]  # replicas that finished requests
    assert len(seen) >= 2
    assert all(35 < r["prefill_ms_per_1k_tokens"] < 0.5 * 400 for r in seen), rates
    errs = sorted(abs(e) for e in strat.ttft_errors[len(strat.ttft_errors) // 2:])  # once calibrated
    assert errs[len(errs) // 2] < 0.1, errs[len(errs) // 2]
    assert row.requests == len(reqs)


def test_ttft_model_keeps_fanout_bursts_together_better_than_the_block_cost() -> None:
    reqs = agent_fanout(tasks=30, fanout=8, rate=2.0, block_size=64)
    cfg = SimSettings(replicas=4, block_size=64)
    rows = {r.strategy: r for r in run_all(reqs, cfg, ["litellm-kv-blocks", "litellm-kv"], Slo())}
    assert rows["litellm-kv"].hit_ratio > rows["litellm-kv-blocks"].hit_ratio + 0.05
    assert rows["litellm-kv"].goodput_rps > rows["litellm-kv-blocks"].goodput_rps


def test_a_strategy_started_again_runs_as_a_fresh_one() -> None:
    # start() begins a run: the learned rates, gauge aging, decision counts and TTFT errors of an earlier
    # run must not leak into it, or a reused strategy would route differently from a fresh one.
    reqs = agent_fanout(tasks=6, fanout=4, rate=2.0, block_size=64)
    cfg = SimSettings(replicas=2, block_size=64)

    async def go() -> tuple[Summary, Summary, LitellmKV]:
        used = LitellmKV(seed=cfg.seed)
        await Simulation(cfg, list(reqs), used).run()
        first_errors = len(used.ttft_errors)
        again, _ = await run_one(reqs, cfg, "litellm-kv", Slo(), factory=lambda n, s: used)
        assert len(used.ttft_errors) == first_errors
        fresh, _ = await run_one(reqs, cfg, "litellm-kv", Slo())
        return again, fresh, used

    again, fresh, used = asyncio.run(go())
    assert sum(used.reasons.values()) == len(reqs)
    assert (again.hit_ratio, again.goodput_rps, again.ttft_p50_s) == (fresh.hit_ratio, fresh.goodput_rps,
                                                                        fresh.ttft_p50_s)


def test_the_sglang_model_breaks_ties_in_fixed_orders_as_its_router_does() -> None:
    """SGLang's ``cache_aware`` takes the first worker with the fewest requests, the first smallest tree in its hash
    map's order, and the first tenant of the node where the match ends: orders fixed within a run. The model drew
    each tie at random before (``random_ties``), which gave SGLang a lottery its router does not have."""
    from litellm_kv.simulator.strategies import SGLangCacheAware
    from litellm_kv.simulator.workload import SimRequest

    def request(rid: int, blocks: list[int]) -> SimRequest:
        return SimRequest(rid, 0.0, 64 * len(blocks) + 10, 4, blocks)

    def run(strategy: SGLangCacheAware) -> tuple[list[int], list[int], int]:
        asyncio.run(strategy.start([f"r{i}" for i in range(4)], 64, lambda: 0.0))
        # Four new prompts of the same size: each lands on an empty tree, the next one on the emptiest left.
        new = [strategy.pick(request(i, [100 * i + 1, 100 * i + 2]), [])[0] for i in range(4)]
        # A shared prompt that every tree holds, asked again and again: a tie of best matches each time.
        for tree in strategy._trees:
            tree.update(dict.fromkeys([7, 8]))
        again = [strategy.pick(request(10 + i, [7, 8]), [])[0] for i in range(6)]
        strategy.inflight = [100, 0, 0, 200]  # imbalanced: the shortest queue, first in the list
        return new, again, strategy.pick(request(20, [55]), [])[0]

    for seed in range(4):
        new, again, shortest = run(SGLangCacheAware(seed=seed))
        assert sorted(new) == [0, 1, 2, 3]  # the smallest-tree rule spreads equal prompts
        assert len(set(again)) == 1, again  # one node, one first tenant
        assert shortest == 1
    orders = {tuple(run(SGLangCacheAware(seed=seed))[0]) for seed in range(8)}
    assert len(orders) > 1  # the map's order is the process's: it differs between runs
    drawn = [run(SGLangCacheAware(seed=seed, random_ties=True))[1] for seed in range(4)]
    assert any(len(set(a)) > 1 for a in drawn)  # the earlier model spread the repeated prompt at random
