"""Behaviour of the routing cost model (domain; plain objects, no engine needed)."""

from __future__ import annotations

from collections import Counter

import pytest

from litellm_kv.config import parse_section
from litellm_kv.errors import ConfigError
from litellm_kv.index.base import ReplicaMatch
from litellm_kv.routing.cost import Candidate, CostModel, CostSettings
from litellm_kv.vllm.hashing import max_hit_blocks

BS = 16


def test_max_hit_rule_caps_prediction() -> None:
    # L = 32 at bs 16: the last token is recomputed, so only one block can hit.
    assert max_hit_blocks(32, 16) == 1
    assert max_hit_blocks(33, 16) == 2
    m = CostModel(CostSettings(), seed=0)
    d = m.choose(32, BS, [Candidate("a", ReplicaMatch(gpu=2)), Candidate("b")])
    assert d.replica == "a"
    assert d.predicted_hit_tokens == 16
    assert d.hit_tokens == {"a": 16}


def test_tiers_rank_gpu_over_cpu_over_storage() -> None:
    m = CostModel(CostSettings(), seed=0)
    cands = [
        Candidate("disk", ReplicaMatch(storage=60)),
        Candidate("cpu", ReplicaMatch(cpu=60)),
        Candidate("gpu", ReplicaMatch(gpu=60)),
    ]
    d = m.choose(1000, BS, cands)
    assert d.replica == "gpu" and d.reason == "cache"
    assert d.scores["gpu"] < d.scores["cpu"] < d.scores["disk"]
    # A longer CPU hit beats a much shorter GPU hit.
    d = m.choose(1000, BS, [Candidate("gpu", ReplicaMatch(gpu=10)), Candidate("cpu", ReplicaMatch(cpu=60))])
    assert d.replica == "cpu"


def test_unique_prefix_goes_least_loaded() -> None:
    m = CostModel(CostSettings(), seed=0)
    d = m.choose(500, BS, [Candidate("a", inflight_prefill_tokens=900), Candidate("b", inflight_decode=2)])
    assert d.replica == "b" and d.reason == "unique" and d.predicted_hit_tokens == 0


def _simulate_hot_prefix(cfg: CostSettings, replicas: int, requests: int, prompt: int) -> Counter[str]:
    """Requests of one hot prefix arrive while earlier ones are still prefilling: each routed
    request adds its uncached tokens to its replica's in-flight prefill load, and every replica
    that served the prefix caches it."""
    m = CostModel(cfg, seed=1)
    blocks = max_hit_blocks(prompt, BS)
    inflight = {f"r{i}": 0 for i in range(replicas)}
    cached: set[str] = {"r0"}
    counts: Counter[str] = Counter()
    for _ in range(requests):
        cands = [Candidate(r, ReplicaMatch(gpu=blocks if r in cached else 0), inflight_prefill_tokens=q)
                 for r, q in inflight.items()]
        d = m.choose(prompt, BS, cands)
        inflight[d.replica] += prompt - d.predicted_hit_tokens + 64  # the suffix + decode share
        cached.add(d.replica)
        counts[d.replica] += 1
    return counts


def test_hot_prefix_at_high_load_spreads() -> None:
    counts = _simulate_hot_prefix(CostSettings(), replicas=4, requests=200, prompt=4000)
    assert len(counts) == 4
    assert max(counts.values()) < 100  # under half of all requests on the first holder
    assert min(counts.values()) >= 25


def test_new_empty_replica_gets_traffic_with_anti_starvation() -> None:
    # Three warm replicas hold the prefix and carry moderate load; a fresh one holds nothing.
    def cands() -> list[Candidate]:
        # Queued work (1,756 tokens) below the prompt's credit (1,920): Dynamo's cost still
        # prefers the warm replicas, so the fresh one never wins a shared-prefix request.
        warm = [Candidate(f"warm{i}", ReplicaMatch(gpu=120), inflight_prefill_tokens=1500,
                          inflight_decode=8) for i in range(3)]
        return [*warm, Candidate("fresh")]

    d = CostModel(CostSettings(), seed=0).choose(2000, BS, cands())
    assert d.replica == "fresh"
    # Dynamo's behaviour (credit decay off, no guard) starves it.
    dynamo = CostSettings(credit_decay_tokens=0, imbalance_guard=False, recent_weight=0)
    d = CostModel(dynamo, seed=0).choose(2000, BS, cands())
    assert d.replica != "fresh"


def test_imbalance_guard_switches_to_least_loaded() -> None:
    cfg = CostSettings(credit_decay_tokens=0, imbalance_abs_tokens=10_000, imbalance_ratio=2.0)
    long_prompt = 60_000  # credit large enough to outweigh the queue without the guard
    cands = [Candidate("hot", ReplicaMatch(gpu=3700), inflight_prefill_tokens=30_000),
             Candidate("idle", inflight_prefill_tokens=1_000)]
    d = CostModel(cfg, seed=0).choose(long_prompt, BS, cands)
    assert d.replica == "idle" and d.reason == "imbalance"
    off = CostSettings(credit_decay_tokens=0, imbalance_guard=False)
    d = CostModel(off, seed=0).choose(long_prompt, BS, cands)
    assert d.replica == "hot" and d.reason == "cache"


def test_load_reason_when_cache_loses() -> None:
    cands = [Candidate("cached", ReplicaMatch(gpu=5), inflight_prefill_tokens=5000),
             Candidate("idle")]
    d = CostModel(CostSettings(imbalance_guard=False), seed=0).choose(1000, BS, cands)
    assert d.replica == "idle" and d.reason == "load"


def test_engine_gauges_count_as_load() -> None:
    cands = [Candidate("a", engine_waiting=10, engine_running=40, kv_usage=0.99), Candidate("b")]
    d = CostModel(CostSettings(), seed=0).choose(100, BS, cands)
    assert d.replica == "b"
    # Router-tracked counts of zero do not hide the engine's own queue.
    assert d.scores["a"] > 10 * 1024


def test_recent_work_keeps_load_between_turns() -> None:
    cands = [Candidate("a", ReplicaMatch(gpu=10), recent_prefill_tokens=200_000), Candidate("b")]
    d = CostModel(CostSettings(), seed=0).choose(200, BS, cands)
    assert d.replica == "b"
    d = CostModel(CostSettings(recent_weight=0), seed=0).choose(200, BS, cands)
    assert d.replica == "a"


def test_sibling_prediction_joins_burst() -> None:
    cands = [Candidate("a"), Candidate("b", sibling_blocks=50), Candidate("c")]
    d = CostModel(CostSettings(), seed=0).choose(1000, BS, cands)
    assert d.replica == "b" and d.reason == "cache"
    d = CostModel(CostSettings(sibling_credit=0), seed=0).choose(1000, BS, cands)
    assert d.reason == "unique"


def test_temperature_samples_near_ties() -> None:
    cfg = CostSettings(temperature=1.0)
    m = CostModel(cfg, seed=3)
    cands = [Candidate("a", ReplicaMatch(gpu=10)), Candidate("b", ReplicaMatch(gpu=9))]
    seen = Counter(m.choose(1000, BS, cands).replica for _ in range(200))
    assert seen["a"] > 20 and seen["b"] > 20
    greedy = CostModel(CostSettings(), seed=3)
    assert {greedy.choose(1000, BS, cands).replica for _ in range(50)} == {"a"}


def test_config_parses_and_rejects() -> None:
    cfg = parse_section(CostSettings, {"cpu_credit": 0.5, "imbalance_guard": False}, "kv.cost")
    assert cfg.cpu_credit == 0.5 and not cfg.imbalance_guard
    with pytest.raises(ConfigError, match=r"kv\.cost"):
        parse_section(CostSettings, {"gpu_credit": -1}, "kv.cost")
    with pytest.raises(ConfigError, match="unknown"):
        parse_section(CostSettings, {"nope": 1}, "kv.cost")
