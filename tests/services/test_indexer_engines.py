"""``litellm-kv indexer`` against real vLLM CPU replicas and a real redis-server.

The indexer runs as its own process (so it can be SIGKILLed). After each fault — indexer killed
mid-stream, engine restarted, Redis restarted, a replica removed from the config — the shared
index must again predict exactly what the engines report: for probe prompts, the predicted hit
tokens per replica (``POST /lookup``, and two independent Redis readers) equal the
``usage.prompt_tokens_details.cached_tokens`` each engine then returns. Time to recover is
printed (run with ``-s`` to see it).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest
import yaml

from litellm_kv.index.redis import RedisIndex
from litellm_kv.routing.fleet import replica_id
from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.hashing import BlockHasher, predicted_hit_tokens
from tools.harness.engines import SERVED_NAME, EngineReplica
from tools.harness.procs import ARTIFACTS, PYTHON, ROOT, ManagedProcess, free_port
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.engine, pytest.mark.redis]

GROUP = "tiny"
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Indexer:
    """One ``litellm-kv indexer`` process with its own config file."""

    def __init__(self, redis_url: str, engines: list[EngineReplica], name: str,
                 replica_extra: dict[str, dict[str, Any]] | None = None, **extra: Any) -> None:
        self.port = free_port()
        self.name = name
        self.path = ARTIFACTS / f"{name}-{self.port}.yaml"
        self.proc: ManagedProcess | None = None
        self.extra = extra
        self.replica_extra = replica_extra or {}  # api_base -> more settings of that replica in this config
        self.write_config(redis_url, engines)

    def write_config(self, redis_url: str, engines: list[EngineReplica]) -> None:
        cfg = {
            **self.extra,
            "redis_url": redis_url,
            "port": self.port,
            "heartbeat_interval_s": 1.0,
            "heartbeat_ttl_s": 10.0,
            "discovery_interval_s": 1.0,
            "replay_timeout_s": 3.0,
            "redis_backoff_max_s": 1.0,
            "exactness_sample_rate": 1.0,
            # Endpoints are discovered from GET /kv_event_sources, block size from /metrics.
            "model_groups": {GROUP: {"replicas": [{"api_base": e.api_base, **self.replica_extra.get(e.api_base, {})}
                                                 for e in engines]}},
        }
        self.path.write_text(yaml.safe_dump(cfg))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        t0 = time.monotonic()
        self.proc = ManagedProcess(
            self.name, [PYTHON, "-m", "litellm_kv.cli", "indexer", "--config", str(self.path)], cwd=str(ROOT)
        )
        self.proc.wait_until(lambda: httpx.get(self.url + "/health", timeout=2).status_code in (200, 503),
                             60, "indexer /health")
        return t0

    def health(self) -> dict[str, Any]:
        r = httpx.get(self.url + "/health", timeout=5)
        return dict(r.json())

    def wait_healthy(self, timeout: float = 60) -> None:
        assert self.proc is not None
        self.proc.wait_until(lambda: self.health()["status"] == "ok", timeout, "indexer healthy")

    def lookup(self, token_ids: list[int]) -> dict[str, int]:
        r = httpx.post(self.url + "/lookup", json={"model_group": GROUP, "token_ids": token_ids}, timeout=10)
        r.raise_for_status()
        return {rid: int(v["hit_tokens"]) for rid, v in r.json()["replicas"].items()}

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # SIGKILL to the process group
            self.proc.stop()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


# -- engine traffic --------------------------------------------------------------------------------


def chat(engine: EngineReplica, messages: list[dict[str, str]]) -> int:
    """Send one request; return the engine's cached_tokens for it."""
    r = httpx.post(engine.url + "/v1/chat/completions", timeout=60, json={
        "model": SERVED_NAME, "messages": messages, "max_tokens": 2,
        "vllm_xargs": {"kv_cache_report_mode": "full"},
    })
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def tokenize(engine: EngineReplica, messages: list[dict[str, str]]) -> list[int]:
    async def go() -> list[int]:
        async with EngineClient(engine.url) as c:
            return await c.tokenize_chat(messages)
    return asyncio.run(go())


def conversation(seed: int, system_words: int = 120, turns: int = 2) -> list[list[dict[str, str]]]:
    """Growing message lists of one conversation sharing a system prompt per seed // 3."""
    rng = random.Random(seed // 3)
    system = _text(rng, system_words)
    rng = random.Random(seed)
    msgs = [{"role": "system", "content": system}]
    out = []
    for _ in range(turns):
        msgs = [*msgs, {"role": "user", "content": _text(rng, 30)}]
        out.append(msgs)
        msgs = [*msgs, {"role": "assistant", "content": _text(rng, 12)}]
    return out


def traffic(engines: list[EngineReplica], seeds: range) -> None:
    for seed in seeds:
        for i, msgs in enumerate(conversation(seed)):
            chat(engines[(seed + i) % len(engines)], msgs)


class BackgroundTraffic:
    """Conversations from ``first`` on (up to ``last``, exclusive, if given), one after another on a daemon
    thread from ``start()`` until ``stop()``; ``sent`` holds the seeds sent in full."""

    def __init__(self, engines: list[EngineReplica], first: int, last: int | None = None) -> None:
        self.engines, self.first, self.last = engines, first, last
        self.sent: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seed = self.first
        while not self._stop.is_set() and (self.last is None or seed < self.last):
            traffic(self.engines, range(seed, seed + 1))
            self.sent.append(seed)
            seed += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)


def settle(ix: Indexer, timeout: float = 10.0) -> None:
    """Wait until the indexer has applied everything the engines published (no change for 0.4 s)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        h = ix.health()
        now = [(r["last_seq"], r["connected"]) for r in h["replicas"]]
        if now == last and all(c for _, c in now):
            return
        last = now
        time.sleep(0.4)


def wait_relearned(ix: Indexer, engines: list[EngineReplica], timeout: float = 60) -> None:
    """Wait until the indexer is healthy and Redis holds entries for every replica again."""
    assert ix.proc is not None
    want = {replica_id(e.api_base) for e in engines}

    def ok() -> bool:
        if ix.health()["status"] != "ok":
            return False
        rows = httpx.get(ix.url + "/replicas", timeout=5).json()[GROUP]
        return {r["replica"] for r in rows if r["entries"] > 0} >= want

    ix.proc.wait_until(ok, timeout, "index re-learned")


def check_exact(ix: Indexer, engines: list[EngineReplica], seeds: Sequence[int],
                readers: list[RedisIndex] | None = None, hasher: BlockHasher | None = None) -> int:
    """Predicted hits (indexer and Redis readers) == each engine's cached_tokens, for probes
    that reuse earlier prefixes. Returns the number of (probe, replica) comparisons. At least one probe must hit
    an engine's cache, or equal predictions would show nothing."""
    settle(ix)
    compared = hits = 0
    for seed in seeds:
        msgs = conversation(seed)[-1]
        tokens = tokenize(engines[0], msgs)
        predicted = ix.lookup(tokens)
        if readers and hasher is not None:
            views = [asyncio.run(_reader_view(r.url, hasher, tokens)) for r in readers]
            assert all(v == views[0] for v in views), views
            for rid, hit in predicted.items():
                assert views[0].get(rid, 0) == hit, (rid, views[0], predicted)
        for e in engines:
            actual = chat(e, msgs)
            assert predicted[replica_id(e.api_base)] == actual, (
                f"seed {seed} on {e.name}: predicted {predicted}, engine cached {actual}")
            compared += 1
            hits += actual > 0
        settle(ix)
    assert hits > 0, f"no probe of seeds {seeds} hit any engine's cache"
    return compared


async def _reader_view(url: str, hasher: BlockHasher, tokens: list[int]) -> dict[str, int]:
    fresh = RedisIndex(url)  # a reader with its own connection, like another proxy process
    try:
        m = await fresh.lookup(GROUP, hasher.wire_hashes(tokens))
    finally:
        await fresh.close()
    return {rid: predicted_hit_tokens(x.blocks, len(tokens), hasher.block_size) for rid, x in m.items()}


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_srv() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-indexer-test")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def indexer(redis_srv: RedisServer, engines: list[EngineReplica]) -> Iterator[Indexer]:
    ix = Indexer(redis_srv.url, engines, "indexer-a")
    ix.start()
    ix.wait_healthy()
    yield ix
    ix.stop()


# -- tests -----------------------------------------------------------------------------------------


def test_index_matches_engines_and_readers_agree(
    indexer: Indexer, engines: list[EngineReplica], redis_srv: RedisServer
) -> None:
    health = indexer.health()
    assert {r["replica"] for r in health["replicas"]} == {replica_id(e.api_base) for e in engines}
    assert all(r["block_size"] == 32 and r["hash_algo"] == "sha256" for r in health["replicas"])
    traffic(engines, range(0, 6))
    hasher = BlockHasher("sha256", 32)
    readers = [RedisIndex(redis_srv.url), RedisIndex(redis_srv.url)]
    n = check_exact(indexer, engines, range(0, 6, 2), readers, hasher)
    assert n == 6
    h = indexer.health()
    assert all(r["exactness"]["mismatched_blocks"] == 0 and r["exact"] for r in h["replicas"]), h
    assert sum(r["exactness"]["checked_blocks"] for r in h["replicas"]) > 0, h
    metrics = httpx.get(indexer.url + "/metrics").text
    assert "litellm_kv_indexer_batches_total" in metrics


def test_full_report_mode_reannouncements_stay_exact_under_eviction(
    indexer: Indexer, engines: list[EngineReplica], redis_srv: RedisServer
) -> None:
    """With ``kv_cache_report_mode: "full"`` (what the proxies ask for) every hit re-emits
    ``BlockStored`` from block 0. Counted as copies, repeated prompts would survive their eviction in
    the index; the apply script must skip them. Hot prompts are hit repeatedly on both replicas, then
    fresh prompts (~300 blocks per replica, caches hold 256) evict them; probes then compare Redis's
    prediction with ``cached_tokens`` for every probe on every replica."""
    rng = random.Random(20260501)
    hot = [[{"role": "user", "content": f"hot {i}: " + _text(rng, 200)}] for i in range(4)]
    for e in engines:
        for msgs in hot:
            chat(e, msgs)
            chat(e, msgs)  # a full hit: re-announced
            chat(e, [*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": _text(rng, 20)}])
    settle(indexer)
    reannounced = sum(s["reannounced"] for r in indexer.health()["replicas"] for s in r["streams"])
    assert reannounced >= 2 * len(hot) * 2, indexer.health()
    fresh = [[{"role": "user", "content": f"fresh {i}: " + _text(rng, 200)}] for i in range(16)]
    for i, msgs in enumerate(fresh):
        for e in engines:
            chat(e, msgs if i % 2 else [*msgs, {"role": "user", "content": _text(rng, 40)}])

    probes = [*hot, *fresh[-3:], hot[0], fresh[0]]
    settle(indexer)
    hasher = BlockHasher("sha256", 32)
    compared = evicted = 0
    for msgs in probes:
        tokens = tokenize(engines[0], msgs)
        predicted = asyncio.run(_reader_view(redis_srv.url, hasher, tokens))  # like a proxy
        assert all(predicted.get(rid, 0) == hit for rid, hit in indexer.lookup(tokens).items())
        for e in engines:
            actual = chat(e, msgs)
            rid = replica_id(e.api_base)
            assert predicted.get(rid, 0) == actual, f"{e.name}: predicted {predicted.get(rid, 0)}, cached {actual}"
            compared += 1
            evicted += msgs in hot and actual < predicted_hit_tokens(len(tokens) // 32, len(tokens), 32)
        settle(indexer)
    print(f"\n[full report mode] {compared}/{compared} probes exact after eviction "
          f"({evicted} probes of hot prompts found them evicted; {reannounced} re-announcements skipped)")
    assert evicted > 0, "the traffic did not evict the hot prompts"


def test_two_indexers_do_not_double_count(
    indexer: Indexer, engines: list[EngineReplica], redis_srv: RedisServer
) -> None:
    second = Indexer(redis_srv.url, engines, "indexer-b")
    second.start()
    try:
        second.wait_healthy()
        traffic(engines, range(10, 14))
        check_exact(indexer, engines, range(10, 14, 2))
        assert second.lookup(tokenize(engines[0], conversation(10)[-1])) == indexer.lookup(
            tokenize(engines[0], conversation(10)[-1]))
        dups = sum(s["duplicates"] for r in second.health()["replicas"] for s in r["streams"])
        dups += sum(s["duplicates"] for r in indexer.health()["replicas"] for s in r["streams"])
        assert dups > 0  # both saw the batches; Redis applied each once
    finally:
        second.stop()


def test_one_of_two_indexers_killed_the_other_keeps_the_index_exact(
    indexer: Indexer, engines: list[EngineReplica], redis_srv: RedisServer
) -> None:
    """Two indexers both follow every engine (no assignment, nothing to take over): SIGKILL one while the
    engines publish, and the survivor's applies, which were duplicates until then, carry on from the
    stream positions in Redis; the index matches the engines without restarting the dead one."""
    second = Indexer(redis_srv.url, engines, "indexer-c")
    second.start()
    t = BackgroundTraffic(engines, 400)
    try:
        second.wait_healthy()
        t.start()
        time.sleep(1.5)
        second.kill()  # SIGKILL while batches keep coming
        t_kill = time.monotonic()
        time.sleep(1.5)
    finally:
        t.stop()
        second.stop()
    # The conversations sent last: the engines' small caches may have evicted the first ones by now.
    n = check_exact(indexer, engines, t.sent[-3:])
    took = time.monotonic() - t_kill
    print(f"\n[two indexers] one SIGKILLed: index exact against the engines {took:.2f}s after the kill "
          f"({n} probe comparisons, incl. the traffic's last 1.5 s)")


def test_indexers_split_the_replicas(engines: list[EngineReplica], redis_srv: RedisServer) -> None:
    """Static assignment: two indexers, one replica each (``split_replicas``), on a Redis of their own; each
    leaves the other's replica alone at start, and the index matches both engines."""
    own = RedisServer(name="redis-indexer-split")
    a = Indexer(own.url, engines[:1], "indexer-split-a", split_replicas=True)
    b = Indexer(own.url, engines[1:], "indexer-split-b", split_replicas=True)
    try:
        a.start()
        a.wait_healthy()
        traffic(engines, range(500, 503))
        b.start()  # after a's replica has entries: a split indexer must not purge them
        b.wait_healthy()
        traffic(engines, range(503, 506))
        assert {r["replica"] for r in a.health()["replicas"]} == {replica_id(engines[0].api_base)}
        hasher = BlockHasher("sha256", 32)
        compared = 0
        for seed in range(500, 506, 2):
            settle(a)
            settle(b)
            msgs = conversation(seed)[-1]
            view = asyncio.run(_reader_view(own.url, hasher, tokenize(engines[0], msgs)))  # as a proxy reads
            for e in engines:
                actual = chat(e, msgs)
                assert view.get(replica_id(e.api_base), 0) == actual, (seed, e.name, view, actual)
                compared += 1
        assert compared == 6
    finally:
        a.stop()
        b.stop()
        own.stop()


def test_indexer_sigkill_mid_stream_recovers(indexer: Indexer, engines: list[EngineReplica]) -> None:
    t = BackgroundTraffic(engines, 100)
    t.start()
    time.sleep(1.5)
    indexer.kill()  # SIGKILL while batches keep coming
    time.sleep(1.5)
    t.stop()
    t0 = indexer.start()
    indexer.wait_healthy()
    # The conversations sent last: on a fast machine the traffic of those 3 s overflows the engines' small caches,
    # and the first conversations' blocks are evicted (the index then predicts 0, exactly, and nothing hits).
    check_exact(indexer, engines, t.sent[-3:])
    print(f"\n[recovery] indexer SIGKILL -> exact again in {time.monotonic() - t0:.2f}s (incl. process start)")


def test_redis_restart_recovers(indexer: Indexer, engines: list[EngineReplica], redis_srv: RedisServer) -> None:
    traffic(engines, range(200, 203))
    redis_srv.restart()  # no persistence: the whole index is gone
    t0 = time.monotonic()
    wait_relearned(indexer, engines)
    check_exact(indexer, engines, range(200, 203))
    print(f"\n[recovery] Redis restart (data lost) -> exact again in {time.monotonic() - t0:.2f}s")
    h = indexer.health()
    assert all(r["resyncs"] >= 1 for r in h["replicas"]), h  # each stream noticed and resynchronised


def test_engine_restart_recovers(indexer: Indexer, engines: list[EngineReplica]) -> None:
    traffic(engines, range(300, 303))
    t_restart = time.monotonic()
    engines[0].restart()
    t0 = time.monotonic()
    traffic(engines, range(303, 305))
    check_exact(indexer, engines, range(300, 305, 2))
    print(f"\n[recovery] engine restart ({t0 - t_restart:.1f}s to start) -> exact again "
          f"{time.monotonic() - t0:.2f}s after it was ready (incl. probes)")


def test_replica_removed_from_config_is_purged(
    indexer: Indexer, engines: list[EngineReplica], redis_srv: RedisServer
) -> None:
    traffic(engines, range(400, 402))
    settle(indexer)
    gone = replica_id(engines[1].api_base)
    before = httpx.get(indexer.url + "/replicas").json()[GROUP]
    assert any(r["replica"] == gone and r["entries"] > 0 for r in before)
    indexer.stop()
    indexer.write_config(redis_srv.url, engines[:1])
    indexer.start()
    indexer.wait_healthy()
    after = httpx.get(indexer.url + "/replicas").json()[GROUP]
    assert [r["replica"] for r in after] == [replica_id(engines[0].api_base)], json.dumps(after)
    # And back: the re-added replica is re-learned from its replay buffer.
    indexer.stop()
    indexer.write_config(redis_srv.url, engines)
    indexer.start()
    indexer.wait_healthy()
    check_exact(indexer, engines, range(400, 402))


# -- leases (assignment: lease) --------------------------------------------------------------------

LEASE = {"assignment": "lease", "lease_ttl_s": 3.0, "lease_renew_interval_s": 0.5}
# Past the lease's expiry and the next round: reading the engine's facts, connecting, replaying its buffer.
BRING_UP_S = 3.0


def followed(ix: Indexer) -> set[str]:
    """Replicas ``ix`` follows live: it holds their lease and every stream of theirs is connected."""
    return {r["replica"] for r in ix.health()["replicas"] if r["owned"] and r["connected"]}


def held(ix: Indexer) -> set[str]:
    """Replicas ``ix`` follows or tries to: it holds their lease, or is handing it over."""
    return {r["replica"] for r in ix.health()["replicas"] if r["owned"]}


def settle_owned(ix: Indexer, timeout: float = 10.0) -> None:
    """:func:`settle` over the replicas whose lease ``ix`` holds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        now = [(r["last_seq"], r["connected"]) for r in ix.health()["replicas"] if r["owned"]]
        if now == last and all(c for _, c in now):
            return
        last = now
        time.sleep(0.4)


def check_shared_exact(ixs: list[Indexer], engines: list[EngineReplica], seeds: range, redis_url: str) -> int:
    """As a proxy reads Redis, predicted hits == each engine's cached_tokens, with several indexers feeding it."""
    hasher = BlockHasher("sha256", 32)
    compared = 0
    for seed in seeds:
        for ix in ixs:
            settle_owned(ix)
        msgs = conversation(seed)[-1]
        view = asyncio.run(_reader_view(redis_url, hasher, tokenize(engines[0], msgs)))
        for e in engines:
            actual = chat(e, msgs)
            assert view.get(replica_id(e.api_base), 0) == actual, (seed, e.name, view, actual)
            compared += 1
    return compared


@pytest.mark.slow
def test_lease_indexers_share_the_engines_and_take_over_a_killed_ones(engines: list[EngineReplica]) -> None:
    """``assignment: lease``: a second indexer takes its share of the two engines from the first by hand-over;
    SIGKILLed while the engines publish, its engine is followed again by the survivor within the lease TTL +
    one renew interval + bring-up, and the index (replayed from the engine's buffer) matches both engines.
    A third one stopped cleanly hands its engine back faster than the TTL (it releases its leases)."""
    own = RedisServer(name="redis-indexer-lease")
    a = Indexer(own.url, engines, "indexer-lease-a", indexer_id="lease-a", **LEASE)
    b = Indexer(own.url, engines, "indexer-lease-b", indexer_id="lease-b", **LEASE)
    c = Indexer(own.url, engines, "indexer-lease-c", indexer_id="lease-c", **LEASE)
    everyone = {replica_id(e.api_base) for e in engines}
    t = BackgroundTraffic(engines, 720, 760)
    sent = t.sent
    try:
        a.start()
        a.wait_healthy()
        assert followed(a) == everyone  # alone, it follows both
        traffic(engines, range(700, 703))
        b.start()
        t_join = time.monotonic()
        assert b.proc is not None
        b.proc.wait_until(lambda: len(followed(a)) == 1 and followed(a) | followed(b) == everyone, 30, "shares")
        shared = time.monotonic() - t_join
        assert b.health()["assignment"]["owned"] == {GROUP: sorted(followed(b))}
        traffic(engines, range(703, 706))
        n_shared = check_shared_exact([a, b], engines, range(700, 706, 2), own.url)

        t.start()
        time.sleep(1.0)
        victim = followed(b)
        b.kill()  # SIGKILL (process group, by PID) while batches keep coming: no lease released
        t_kill = time.monotonic()
        deadline = t_kill + LEASE["lease_ttl_s"] + LEASE["lease_renew_interval_s"] + BRING_UP_S + 10
        while followed(a) != everyone and time.monotonic() < deadline:
            time.sleep(0.05)
        recovered = time.monotonic() - t_kill
        time.sleep(1.0)
        t.stop()
        assert followed(a) == everyone, a.health()
        bound = LEASE["lease_ttl_s"] + LEASE["lease_renew_interval_s"] + BRING_UP_S
        assert recovered <= bound, f"re-covered after {recovered:.2f}s, over {bound}s"
        takeovers = [line for line in httpx.get(a.url + "/metrics", timeout=5).text.splitlines()
                     if line.startswith("litellm_kv_indexer_lease_claims_total{") and 'kind="takeover"' in line]
        assert len(takeovers) == 1 and takeovers[0].endswith(f" {float(len(victim))}"), takeovers
        assert sent and sent[-1] > sent[0], "no traffic around the kill"
        n_after = check_shared_exact([a], engines, range(sent[0], sent[-1] + 1, max(1, len(sent) // 3)), own.url)
        h = a.health()
        assert h["status"] == "ok" and h["assignment"]["live_indexers"] == {GROUP: 1}, h
        taken = [r for r in h["replicas"] if r["replica"] in victim]
        # Caught up by replaying the engine's buffer from Redis's position, not by purging and re-learning.
        assert all(r["replays"] >= 1 and r["resyncs"] == 0 and r["events_applied"] > 0 for r in taken), taken

        # A clean stop (SIGTERM) releases the leases: taken within a round, not after the TTL.
        c.start()
        assert c.proc is not None
        c.proc.wait_until(lambda: len(followed(a)) == 1 and followed(a) | followed(c) == everyone, 30, "shares")
        t_term = time.monotonic()
        c.stop()
        while followed(a) != everyone and time.monotonic() < t_term + 30:
            time.sleep(0.05)
        handed = time.monotonic() - t_term
        assert followed(a) == everyone and handed < LEASE["lease_ttl_s"], (handed, a.health())
        traffic(engines, range(706, 708))
        n_after += check_shared_exact([a], engines, range(706, 708), own.url)
        print(f"\n[leases] second indexer took its share in {shared:.2f}s ({n_shared} probe comparisons exact); "
              f"SIGKILLed, its engine {sorted(victim)} re-covered by the survivor {recovered:.2f}s after the kill "
              f"(lease_ttl_s {LEASE['lease_ttl_s']}, lease_renew_interval_s {LEASE['lease_renew_interval_s']}); "
              f"a third stopped with SIGTERM: its engine re-covered {handed:.2f}s after the signal (incl. its "
              f"shutdown); index exact against the engines after replay ({n_after} probe comparisons, "
              f"{len(sent)} conversations sent around the kill)")
    finally:
        t.stop()
        a.stop()
        b.stop()
        c.stop()
        own.stop()


def metric(ix: Indexer, name: str, **labels: str) -> float:
    """One sample of the indexer's /metrics (0 when it has none yet)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in httpx.get(ix.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``check`` until true; the monotonic time it became true."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.05)
    return time.monotonic()


UNREACHABLE = {**LEASE, "lease_unreachable_handoff_s": 2.0}  # cooldown: 6 x that, 12 s


@pytest.mark.slow
def test_lease_an_engine_one_indexer_cannot_reach_is_followed_by_the_other(engines: list[EngineReplica]) -> None:
    """A network partition between indexer P and engine 1 only, simulated in P's config (the only way to cut one
    indexer off one engine on one machine): P's event and replay endpoints of engine 1 are ports nothing listens
    on, while its HTTP API (the replica's id) is the real one; indexer Q's config is correct.

    Q follows both engines, then P starts and takes engine 1 by the share hand-over. P's replay gets no answer,
    it gives the lease up after ``lease_unreachable_handoff_s`` and Q follows engine 1 again: the time from P's
    claim to Q following it is measured, with traffic on both engines throughout. P does not take it back within
    its cooldown (it follows engine 0 instead), the index matches both engines, and, once Q stops, P alone keeps
    the lease of the engine it cannot reach and says so."""
    own = RedisServer(name="redis-indexer-unreach")
    cut = replica_id(engines[1].api_base)  # second in every config: the replica Q offers when P joins
    dead = {"event_endpoints": [f"tcp://127.0.0.1:{free_port()}"], "replay_endpoints": [f"tcp://127.0.0.1:{free_port()}"]}
    q = Indexer(own.url, engines, "indexer-unreach-q", indexer_id="reach-q", **UNREACHABLE)
    p = Indexer(own.url, engines, "indexer-unreach-p", replica_extra={engines[1].api_base: dead},
                indexer_id="cut-p", **UNREACHABLE)
    everyone = {replica_id(e.api_base) for e in engines}
    t = BackgroundTraffic(engines, 820, 880)
    sent = t.sent
    try:
        q.start()
        q.wait_healthy()
        assert followed(q) == everyone
        traffic(engines, range(800, 803))
        t.start()
        p.start()
        assert p.proc is not None and q.proc is not None
        t_claim = wait_for(lambda: cut in held(p), 30,
                           "P takes engine 1 by hand-over")
        t_failed = wait_for(lambda: any(r["replica"] == cut and r["unreachable_s"] is not None
                                        for r in p.health()["replicas"]), 30, "P sees it cannot follow engine 1")
        h = p.health()
        assert h["status"] == "degraded" and cut not in followed(p), h
        t_back = wait_for(lambda: cut in followed(q), 30, "Q follows engine 1 again")
        recovered = t_back - t_claim
        # P's unanswered replay (replay_timeout_s 3) + the hand-off time + P's round giving it up and Q's taking it
        # + Q's bring-up.
        handoff, renew = UNREACHABLE["lease_unreachable_handoff_s"], UNREACHABLE["lease_renew_interval_s"]
        bound = 3.0 + handoff + 2 * renew + BRING_UP_S
        assert recovered <= bound, f"followed again {recovered:.2f}s after P's claim, over {bound}s"
        # The share settles around the partition: P follows engine 0, Q keeps engine 1, and P has let engine 1 go
        # (a giver keeps a replica until a second round finds it taken).
        t_settled = wait_for(lambda: followed(p) | followed(q) == everyone and len(followed(p)) == 1
                             and cut not in held(p), 30, "shares")
        assert followed(p) == everyone - {cut}
        t_watch = time.monotonic()
        while time.monotonic() < t_watch + 3.0:  # within P's cooldown: engine 1 stays Q's
            assert cut in followed(q) and cut not in held(p)
            time.sleep(0.1)
        t.stop()
        assert metric(q, "litellm_kv_indexer_lease_claims_total", kind="unreachable", model_group=GROUP) == 1
        assert metric(p, "litellm_kv_indexer_lease_unreachable_total", model_group=GROUP, outcome="offered") == 1
        assert p.health()["status"] == "ok" and q.health()["status"] == "ok"
        taken = next(r for r in q.health()["replicas"] if r["replica"] == cut)
        # Caught up by replaying engine 1's buffer from Redis's position (nothing purged and re-learned).
        assert taken["replays"] >= 1 and taken["resyncs"] == 0 and taken["events_applied"] > 0, taken
        assert sent and sent[-1] > sent[0], "no traffic around the hand-off"
        traffic(engines, range(880, 882))
        n = check_shared_exact([p, q], engines, range(sent[0], sent[-1] + 1, max(1, len(sent) // 3)), own.url)
        n += check_shared_exact([p, q], engines, range(880, 882), own.url)

        # Alone, P keeps the lease it cannot follow (nobody else could take it) and keeps trying.
        q.stop()  # SIGTERM: Q releases its leases
        t_qstop = time.monotonic()
        t_alone = wait_for(lambda: p.health()["assignment"]["given_up"] == {GROUP: {cut: "kept"}}, 30,
                           "P alone keeps engine 1")
        h = p.health()
        assert h["status"] == "degraded" and followed(p) == everyone - {cut}
        assert {r["replica"] for r in h["replicas"] if r["owned"]} == everyone, h
        assert metric(p, "litellm_kv_indexer_lease_unreachable_replicas", model_group=GROUP) == 1
        print(f"\n[leases, partition] P cut off engine 1 claimed it by hand-over; it saw the failure after "
              f"{t_failed - t_claim:.2f}s (replay_timeout_s 3), and Q followed engine 1 again {recovered:.2f}s after "
              f"P's claim (lease_unreachable_handoff_s {handoff}, lease_renew_interval_s {renew}); shares settled "
              f"{t_settled - t_back:.2f}s later; index exact against the engines ({n} probe comparisons, "
              f"{len(sent)} conversations sent around the hand-off); P alone kept the lease "
              f"{t_alone - t_qstop:.2f}s after Q stopped")
    finally:
        t.stop()
        p.stop()
        q.stop()
        own.stop()
