"""The TTFT testbed end to end (tools/harness/testbed.py): two real vLLM CPU replicas serving the ttft
model, one real LiteLLM proxy routing them three ways, one open-loop streamed chat workload per routing.

What is checked is the testbed, not which routing wins (that is benchmarks/bench_ttft.py's job, with
repeats): every routing is really served, TTFT is measured at the first content chunk (before the end),
the engines report cached tokens, least-busy is LiteLLM's (the group exists under its routing group),
and litellm-kv's predictions are checked against the engines."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tools.harness import field
from tools.harness.testbed import KV, LEAST_BUSY, ROUTINGS, SHUFFLE, Testbed, abc_cba, start_testbed

pytestmark = [pytest.mark.engine, pytest.mark.proxy, pytest.mark.slow]


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    b = start_testbed(2, name="tbed")
    try:
        yield b
    finally:
        b.stop()


def test_three_routings_same_requests_streamed(bed: Testbed) -> None:
    def make(i: int) -> field.Workload:
        return field.chat_workload(groups=2, users_per_group=2, turns=2, system_tokens=1500, rate=4.0, seed=3 + i)

    comp = asyncio.run(abc_cba(bed, make, 4.0, runs=2, max_tokens=8))
    n = len(make(0).requests)
    for g in ROUTINGS:
        assert len(comp.runs[g]) == 2 and len(comp.cpu[g]) == 2, g
        for run, cpu in zip(comp.runs[g], comp.cpu[g], strict=True):
            assert run.failures == 0, g
            assert len(run.ok) == n
            assert all(0 < o.ttft_s <= o.e2e_s for o in run.ok)
            assert all(o.output_tokens > 0 and o.prompt_tokens > 1500 for o in run.ok)
            assert set(run.per_replica(bed.names)) <= {"r0", "r1"}
            # Second turns resend the first turn's prompt: some prefix is cached whatever the routing.
            assert run.cached_ratio > 0
            # The run's CPU by part of the testbed: the engines computed, their API servers and the proxy served.
            assert cpu["engine_core"] > 0 and cpu["engine_front"] > 0 and cpu["proxy"] > 0, (g, cpu)

    # Each round sent every routing the same prompts, and the second round its own draw.
    def prompts(g: str, i: int) -> list[int]:
        return [o.prompt_tokens for o in sorted(comp.runs[g][i].outcomes, key=lambda o: o.rid)]

    for i in (0, 1):
        assert prompts(SHUFFLE, i) == prompts(LEAST_BUSY, i) == prompts(KV, i), i
    assert [r.messages for r in comp.workload_of(1).requests] == [r.messages for r in make(1).requests]
    assert prompts(KV, 0) != prompts(KV, 1)
    assert sum(comp.checks.values()) == 2 * n  # every litellm-kv response was checked against the engine
    cfg = bed.proxy.config_path.read_text()
    assert "least-busy" in cfg and LEAST_BUSY in cfg
