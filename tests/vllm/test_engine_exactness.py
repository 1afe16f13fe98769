"""The index predicts vLLM's prefix-cache hits exactly, proven against two real vLLM CPU replicas.

Engines: the session fixture ``engines`` (tests/conftest.py): 2 replicas of the tiny local
model, block size 32, sha256, an 8 MiB KV cache (256 blocks) each, so the workload below
overflows both and forces eviction. Everything crosses real parts: chat templates through
``/tokenize``, requests through ``/v1/chat/completions`` with ``kv_cache_report_mode=full``,
KV events over ZMQ (ipc) with the engines' replay sockets, ``cached_tokens`` from the engines.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from litellm_kv.index.memory import InMemoryIndex
from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.hashing import BlockHasher, predicted_hit_tokens
from litellm_kv.vllm.subscriber import KVEventSubscriber, ReplicaSubscribers, start_replica_subscribers
from litellm_kv.vllm.wire import connectable
from tools.harness.engines import SERVED_NAME, EngineReplica

pytestmark = [pytest.mark.engine]

GROUP = "tiny"
_WORD_TEXT = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu cache block token prefix router "
    "replica engine model request prompt budget reasoning vision index hash chain event stream queue"
)
WORDS = _WORD_TEXT.split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class Fleet:
    """The two engines as the test sees them: HTTP clients, index, subscribers, hasher."""

    engines: list[EngineReplica]
    clients: list[EngineClient]
    http: httpx.AsyncClient
    index: InMemoryIndex
    subs: list[ReplicaSubscribers]
    hasher: BlockHasher

    def rid(self, i: int) -> str:
        return self.engines[i].url

    async def settle(self) -> None:
        """Wait until every subscriber has been quiet for a moment: the events of the last
        request have been published and applied."""
        for rs in self.subs:
            for s in rs.subscribers:
                assert await s.wait_settled(quiet_s=0.15, timeout_s=15), s.stats

    async def chat(self, i: int, messages: list[dict[str, Any]], max_tokens: int = 8,
                   report_mode: str = "full") -> dict[str, Any]:
        resp = await self.http.post(
            self.engines[i].url + "/v1/chat/completions",
            json={
                "model": SERVED_NAME, "messages": messages, "max_tokens": max_tokens,
                "vllm_xargs": {"kv_cache_report_mode": report_mode},
            },
        )
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    async def predict(self, i: int, messages: list[dict[str, Any]]) -> tuple[int, int]:
        """(predicted cached tokens on replica i, prompt length) for a chat request."""
        tokens = await self.clients[i].tokenize_chat(messages)
        hashes = self.hasher.wire_hashes(tokens)
        match = (await self.index.lookup(GROUP, hashes, [self.rid(i)])).get(self.rid(i))
        return predicted_hit_tokens(match.blocks if match else 0, len(tokens), self.hasher.block_size), len(tokens)


async def make_fleet(engines: list[EngineReplica], sample_every: int = 1) -> Fleet:
    clients = [EngineClient(e.url, timeout=30) for e in engines]
    m = await clients[0].metrics()
    assert m.block_size == 32 and m.hash_algo == "sha256" and m.prefix_caching
    hasher = BlockHasher(algo=m.hash_algo, block_size=m.block_size)
    index = InMemoryIndex()
    subs = [
        await start_replica_subscribers(
            group=GROUP, replica=e.url, index=index, client=c,
            hasher_factory=lambda bs, h=hasher: h if bs == h.block_size else None,
            sample_every=sample_every,
        )
        for e, c in zip(engines, clients, strict=True)
    ]
    return Fleet(engines, clients, httpx.AsyncClient(timeout=60), index, subs, hasher)


async def close_fleet(f: Fleet) -> None:
    for rs in f.subs:
        await rs.stop()
    for c in f.clients:
        await c.aclose()
    await f.http.aclose()


@pytest.fixture
async def fleet(engines: list[EngineReplica]) -> AsyncIterator[Fleet]:
    f = await make_fleet(engines)
    await asyncio.sleep(0.5)  # connect + catch up through replay
    await f.settle()
    try:
        yield f
    finally:
        await close_fleet(f)


def workload(rng: random.Random) -> tuple[list[list[dict[str, Any]]], list[str], list[list[dict[str, Any]]]]:
    """Shared system prompts, conversations (grown turn by turn later) and unique prompts."""
    systems = [text(rng, rng.randint(150, 300)) for _ in range(4)]
    convs = [[{"role": "system", "content": rng.choice(systems)}] for _ in range(8)]
    uniques = [[{"role": "user", "content": text(rng, rng.randint(200, 500))}] for _ in range(16)]
    return convs, systems, uniques


async def test_index_predicts_cached_tokens_exactly(fleet: Fleet) -> None:
    rng = random.Random(20261129)
    # The engines are shared by the session: catching up through their replay rings re-applies the
    # AllBlocksCleared of earlier tests' cache resets (each a purge). What this test forbids is a purge
    # or a malformed frame during its own workload.
    purged_at_start = [s.stats.purges for rs in fleet.subs for s in rs.subscribers]
    convs, systems, uniques = workload(rng)

    # -- mixed workload, alternating replicas; enough to overflow both 256-block caches ------
    sent: list[list[dict[str, Any]]] = []
    for turn in range(3):
        for c, conv in enumerate(convs):
            conv.append({"role": "user", "content": text(rng, rng.randint(30, 90))})
            out = await fleet.chat((c + turn) % 2, conv)
            sent.append(list(conv))
            conv.append({"role": "assistant", "content": out["choices"][0]["message"]["content"] or "ok"})
        for u in uniques[turn * 5 : turn * 5 + 5]:
            await fleet.chat(rng.randrange(2), u)
            sent.append(u)
    await fleet.settle()
    removed = [s.stats.blocks_removed for rs in fleet.subs for s in rs.subscribers]
    assert all(r > 0 for r in removed), f"workload did not force eviction on both replicas: {removed}"

    # -- probes: repeats, grown conversations, shared system prompts, fresh prompts ----------
    probes: list[list[dict[str, Any]]] = []
    for _ in range(50):
        kind = rng.random()
        if kind < 0.3:
            probes.append(rng.choice(sent))
        elif kind < 0.6:
            conv = rng.choice(convs)
            probes.append([*conv, {"role": "user", "content": text(rng, rng.randint(5, 60))}])
        elif kind < 0.85:
            probes.append([{"role": "system", "content": rng.choice(systems)},
                           {"role": "user", "content": text(rng, rng.randint(5, 80))}])
        else:
            probes.append([{"role": "user", "content": text(rng, rng.randint(20, 300))}])

    exact = total = nonzero = 0
    misses: list[str] = []
    for p, messages in enumerate(probes):
        for i in (p % 2, 1 - p % 2):  # both replicas, alternating which goes first
            await fleet.settle()
            predicted, n_tokens = await fleet.predict(i, messages)
            out = await fleet.chat(i, messages, max_tokens=4)
            actual = out["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert out["usage"]["prompt_tokens"] == n_tokens
            total += 1
            nonzero += actual > 0
            if predicted == actual:
                exact += 1
            else:
                misses.append(f"probe {p} replica {i}: predicted {predicted}, engine {actual} ({n_tokens} tokens)")
    stats = [s.stats for rs in fleet.subs for s in rs.subscribers]
    checks = [rs.checker.stats for rs in fleet.subs if rs.checker is not None]
    print(f"\nexact {exact}/{total} (engine reported a hit for {nonzero}); subscribers: {stats}; "
          f"exactness checks: {checks}")
    assert not misses, "\n".join(misses)
    assert total >= 100 and nonzero >= 30
    # The exactness checker recomputed the engines' hashes from token ids and found them equal.
    assert all(c.checked_blocks > 100 and c.exact for c in checks), checks
    assert all(s.malformed == 0 for s in stats), stats
    assert [s.purges for s in stats] == purged_at_start, (purged_at_start, stats)


async def test_late_subscriber_catches_up_through_replay(fleet: Fleet, engines: list[EngineReplica]) -> None:
    rng = random.Random(5)
    for i in range(4):
        await fleet.chat(i % 2, [{"role": "user", "content": text(rng, 200)}])
    await fleet.settle()
    late = await make_fleet(engines, sample_every=0)
    try:
        await asyncio.sleep(0.5)
        await late.settle()
        for i in range(2):
            rid = fleet.rid(i)
            sub = late.subs[i].subscribers[0]
            assert sub.stats.replays >= 1 and sub.stats.batches > 0, sub.stats
            live = fleet.index.snapshot(GROUP, rid)
            assert live and late.index.snapshot(GROUP, rid) == live
    finally:
        await close_fleet(late)


async def test_a_subscriber_that_missed_the_start_learns_held_blocks_only_from_reannounced_hits(
    fleet: Fleet, engines: list[EngineReplica]
) -> None:
    """What ``report_mode_full: "auto"`` rests on, on a real engine. A subscriber that joined after the engine
    stored a prompt's blocks (no replay socket here, so nothing brings them back) is not complete and does not
    predict them. A hit in vLLM's default incremental mode teaches it nothing of the prompt; a hit in full mode
    re-announces the chain, and the subscriber then predicts exactly what the engine hit."""
    rng = random.Random(13)
    messages = [{"role": "user", "content": text(rng, 300)}]
    await fleet.chat(0, messages, report_mode="incremental")
    await fleet.settle()
    src = (await fleet.clients[0].kv_event_sources())[0]
    index = InMemoryIndex()
    late = KVEventSubscriber(group=GROUP, replica=fleet.rid(0), index=index,
                             endpoint=connectable(src.endpoint, engines[0].url), replay_endpoint=None, topic=src.topic)
    late.start()
    try:
        for _ in range(100):
            if late.stats.connected:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the subscription reaches the engine's PUB (slow joiner)
        tokens = await fleet.clients[0].tokenize_chat(messages)
        hashes = fleet.hasher.wire_hashes(tokens)

        async def known_blocks() -> int:
            m = (await index.lookup(GROUP, hashes, [fleet.rid(0)])).get(fleet.rid(0))
            return m.blocks if m else 0

        quiet = await fleet.chat(0, messages, report_mode="incremental")
        assert quiet["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        await late.wait_settled(quiet_s=0.3, timeout_s=10)
        assert await known_blocks() == 0
        assert not late.stats.complete, late.stats

        loud = await fleet.chat(0, messages, report_mode="full")
        hit = int(loud["usage"]["prompt_tokens_details"]["cached_tokens"])
        for _ in range(100):
            if await known_blocks():
                break
            await asyncio.sleep(0.05)
        assert hit > 0 and await known_blocks() * fleet.hasher.block_size == hit, (hit, late.stats)
        assert not late.stats.complete  # other blocks from before it joined may still be missing
    finally:
        await late.stop()


async def test_restarted_replica_is_purged(fleet: Fleet, engines: list[EngineReplica]) -> None:
    rng = random.Random(9)
    messages = [{"role": "user", "content": text(rng, 300)}]
    await fleet.chat(0, messages)
    await fleet.chat(1, messages)
    await fleet.settle()
    assert (await fleet.predict(0, messages))[0] > 0
    other_before = fleet.index.snapshot(GROUP, fleet.rid(1))
    sub0 = fleet.subs[0].subscribers[0]
    purges_before = sub0.stats.purges

    engines[0].restart()  # SIGKILL, then a new process on the same ports: seq starts at 0 again
    await fleet.settle()
    for _ in range(100):  # the subscriber reconnects and checks the replay ring
        if sub0.stats.purges > purges_before:
            break
        await asyncio.sleep(0.1)
    assert sub0.stats.purges > purges_before, sub0.stats
    assert fleet.index.snapshot(GROUP, fleet.rid(0)) == {}
    assert fleet.index.snapshot(GROUP, fleet.rid(1)) == other_before

    # And the index follows the new engine lifetime exactly.
    for _ in range(2):
        predicted, _n = await fleet.predict(0, messages)
        out = await fleet.chat(0, messages)
        assert predicted == out["usage"]["prompt_tokens_details"]["cached_tokens"]
        await fleet.settle()
    assert (await fleet.predict(0, messages))[0] > 0
