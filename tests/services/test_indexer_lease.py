"""Lease rounds (``assignment: lease``) on a real redis-server and a real Redis Cluster (3 masters + 3 replicas).

What the indexers rely on: every replica has an owner after any indexer's round, a new indexer takes its share
through hand-overs (the old owner keeps its lease until then), a dead indexer's leases are taken over once they
expire, a clean stop frees them at once, a replica its holder cannot follow goes to another live indexer that has
not given it up (and changes hands only as cooldowns run out when none can follow it), and the keys of a group live
in one cluster slot. Expiry is real (short TTLs and sleeps on Redis's clock), no clock is faked.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
from prometheus_client import generate_latest
from redis.crc import key_slot

from litellm_kv.config import parse_section
from litellm_kv.index.redis import group_key_prefix
from litellm_kv.redis_client import RedisClient, RedisUse, connect
from litellm_kv.services.indexer.config import IndexerSettings
from litellm_kv.services.indexer.lease import LeaseRound, Leases
from litellm_kv.services.indexer.service import Indexer
from tools.harness.procs import free_port
from tools.harness.redis_cluster import RedisClusterServers
from tools.harness.redis_server import RedisServer

pytestmark = pytest.mark.redis

GROUP = "g{x}"  # braces in the name: the hash tag must still be the whole group
REPLICAS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
TTL_S = 0.6
_servers: list[RedisServer] = []


@pytest.fixture(scope="module", autouse=True)
def _stop_redis() -> Iterator[None]:
    yield
    while _servers:
        _servers.pop().stop()


@asynccontextmanager
async def single(request: pytest.FixtureRequest) -> AsyncIterator[RedisClient]:
    if not _servers:
        _servers.append(RedisServer(name="redis-lease"))
    _servers[0].client().flushall()
    client = connect(_servers[0].url, RedisUse.INDEX)
    try:
        yield client
    finally:
        await client.aclose()


@asynccontextmanager
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[RedisClient]:
    servers: RedisClusterServers = request.getfixturevalue("redis_cluster")
    servers.flushall()
    client = connect(servers.settings(), RedisUse.INDEX)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(params=[pytest.param(single, id="redis"), pytest.param(cluster, id="cluster")])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[RedisClient]:
    factory: Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[RedisClient]] = request.param
    async with factory(request) as c:
        yield c


COOLDOWN_S = 1.0


def leases(client: RedisClient, name: str) -> Leases:
    return Leases(client, name, ttl_s=TTL_S, grace_s=0.2, cooldown_s=COOLDOWN_S)


def owned(rnd: LeaseRound, name: str) -> list[str]:
    return sorted(rnd.owned_by(name))


async def test_lease_a_second_indexer_takes_its_share_by_hand_over(client: RedisClient) -> None:
    a, b = leases(client, "a"), leases(client, "b")
    first = await a.renew(GROUP, REPLICAS)
    assert first.live == 1 and owned(first, "a") == REPLICAS
    assert first.claimed == dict.fromkeys(REPLICAS, "new")
    joined = await b.renew(GROUP, REPLICAS)
    assert joined.live == 2 and owned(joined, "b") == [] and joined.uncovered == []  # all still a's
    offered = await a.renew(GROUP, REPLICAS)  # a holds 3 > ceil(3 / 2): offers one, still follows it
    assert owned(offered, "a") == REPLICAS
    took = await b.renew(GROUP, REPLICAS)
    assert took.claimed == {REPLICAS[2]: "handoff"} and owned(took, "b") == [REPLICAS[2]]
    after = await a.renew(GROUP, REPLICAS)
    assert owned(after, "a") == REPLICAS[:2] and after.uncovered == []


async def test_lease_a_dead_indexers_replicas_are_taken_over_after_the_ttl(client: RedisClient) -> None:
    a, b = leases(client, "a"), leases(client, "b")
    for _ in range(2):
        await a.renew(GROUP, REPLICAS)
        await b.renew(GROUP, REPLICAS)
    held_by_a = owned(await a.renew(GROUP, REPLICAS), "a")
    assert held_by_a and len(held_by_a) < len(REPLICAS)
    early = await b.renew(GROUP, REPLICAS)  # a stops renewing: within the TTL its leases stand
    assert owned(early, "a") == held_by_a and early.claimed == {}
    await asyncio.sleep(TTL_S + 0.1)
    late = await b.renew(GROUP, REPLICAS)
    assert late.live == 1 and owned(late, "b") == REPLICAS
    assert late.claimed == dict.fromkeys(held_by_a, "takeover")


async def test_lease_a_clean_stop_frees_the_leases_at_once(client: RedisClient) -> None:
    a, b = leases(client, "a"), leases(client, "b")
    await a.renew(GROUP, REPLICAS)
    await b.renew(GROUP, REPLICAS)
    assert await a.release(GROUP, REPLICAS) == len(REPLICAS)
    rnd = await b.renew(GROUP, REPLICAS)  # no wait for the TTL
    assert rnd.live == 1 and owned(rnd, "b") == REPLICAS and rnd.claimed == dict.fromkeys(REPLICAS, "new")
    assert await a.release(GROUP, REPLICAS) == 0  # only the releasing indexer's own leases


@pytest.mark.parametrize("n_indexers,n_replicas", [(3, 4), (4, 7), (2, 1)])
async def test_lease_rounds_keep_every_replica_covered_and_settle_to_the_share(
    client: RedisClient, n_indexers: int, n_replicas: int
) -> None:
    reps = [f"http://10.0.1.{i}:8000" for i in range(n_replicas)]
    table = [leases(client, f"ix{i}") for i in range(n_indexers)]
    last: LeaseRound | None = None
    for _ in range(6):  # rounds in turn, as the indexers' loops would interleave
        for ix in table:
            last = await ix.renew(GROUP, reps)
            assert last.uncovered == [] and all(last.owners[r] for r in reps)
    assert last is not None and last.live == n_indexers
    share = math.ceil(n_replicas / n_indexers)
    counts = [len(last.owned_by(ix.indexer)) for ix in table]
    assert sum(counts) == n_replicas and max(counts) <= share, counts


# -- replicas an indexer cannot follow (it names them; the service decides when, see the in-process test below) --


async def settled(table: list[Leases], reps: list[str], rounds: int = 4) -> LeaseRound:
    last: LeaseRound | None = None
    for _ in range(rounds):
        for ix in table:
            last = await ix.renew(GROUP, reps)
    assert last is not None
    return last


async def test_lease_a_replica_given_up_goes_to_another_live_indexer_whatever_its_share(client: RedisClient) -> None:
    a, b = leases(client, "a"), leases(client, "b")
    start = await settled([a, b], REPLICAS)
    x = sorted(start.owned_by("a"))[0]
    gave = await a.renew(GROUP, REPLICAS, give_up=[x])
    assert gave.gave_up == {x: "offered"} and gave.owners[x] == "a"  # a keeps following it until it is taken
    took = await b.renew(GROUP, REPLICAS)
    assert took.claimed == {x: "unreachable"} and took.owners[x] == "b"
    # From now on a cannot follow x and says so every round: x stays b's, even though b holds more than its share
    # and a is below it (b offers its other replicas instead, which a takes).
    for _ in range(5):
        rnd = await a.renew(GROUP, REPLICAS, give_up=[x])
        assert rnd.owners[x] == "b" and rnd.gave_up == {} and x not in rnd.claimed
        rnd = await b.renew(GROUP, REPLICAS)
        assert rnd.owners[x] == "b" and rnd.uncovered == []
    assert x not in rnd.owned_by("a") and len(rnd.owned_by("b")) <= math.ceil(len(REPLICAS) / 2)


async def test_lease_a_lone_indexer_keeps_what_it_gives_up_until_another_one_is_live(client: RedisClient) -> None:
    a = leases(client, "a")
    x = REPLICAS[0]
    for _ in range(3):  # nobody else to take it: nothing changes, a keeps following (trying) it
        rnd = await a.renew(GROUP, REPLICAS, give_up=[x])
        assert rnd.gave_up == {x: "kept"} and rnd.owned_by("a") == set(REPLICAS)
    b = leases(client, "b")
    assert (await b.renew(GROUP, REPLICAS)).claimed.get(x) == "unreachable"  # its first round takes it
    rnd = await a.renew(GROUP, REPLICAS, give_up=[x])
    assert rnd.owners[x] == "b" and rnd.gave_up == {}


async def test_lease_a_withdrawn_give_up_is_not_taken(client: RedisClient) -> None:
    """The owner reaches the engine again before anyone took the lease: it stops giving it up, and keeps it."""
    a, b = leases(client, "a"), leases(client, "b")
    start = await settled([a, b], REPLICAS)
    x = sorted(start.owned_by("a"))[0]
    await a.renew(GROUP, REPLICAS, give_up=[x])
    assert (await a.renew(GROUP, REPLICAS)).gave_up == {}
    rnd = await b.renew(GROUP, REPLICAS)
    assert rnd.owners[x] == "a" and x not in rnd.claimed


async def test_lease_an_indexer_takes_back_a_replica_it_gave_up_when_no_other_is_live(client: RedisClient) -> None:
    a, b = leases(client, "a"), leases(client, "b")
    start = await settled([a, b], REPLICAS)
    x = sorted(start.owned_by("a"))[0]
    await a.renew(GROUP, REPLICAS, give_up=[x])
    assert (await b.renew(GROUP, REPLICAS)).owners[x] == "b"
    await asyncio.sleep(TTL_S + 0.1)  # b dies (stops renewing); a's cooldown on x still runs
    rnd = await a.renew(GROUP, REPLICAS, give_up=[x])
    assert rnd.live == 1 and rnd.claimed.get(x) == "takeover" and rnd.owned_by("a") == set(REPLICAS)
    assert rnd.gave_up == {x: "kept"}  # followed by somebody: the one indexer left keeps trying


async def test_lease_a_replica_nobody_can_follow_moves_once_per_cooldown_at_most(client: RedisClient) -> None:
    """Both indexers fail to follow x all the time: without the cooldown the lease would change hands every
    round; with it, it moves when a cooldown runs out (and is tried again then), and is never left uncovered."""
    a, b = leases(client, "a"), leases(client, "b")
    await settled([a, b], REPLICAS)
    x = REPLICAS[0]
    moves, rounds, owner = 0, 0, None
    t_end = asyncio.get_running_loop().time() + 3 * COOLDOWN_S
    while asyncio.get_running_loop().time() < t_end:
        for ix in (a, b):
            rnd = await ix.renew(GROUP, REPLICAS, give_up=[x])
            rounds += 1
            assert rnd.owners[x] and rnd.uncovered == []
            moves += owner is not None and rnd.owners[x] != owner
            owner = rnd.owners[x]
        await asyncio.sleep(0.02)
    assert 2 <= moves <= 3 + 1, (moves, rounds)  # about one move per cooldown over three cooldowns


def test_lease_keys_of_a_group_share_the_index_keys_cluster_slot() -> None:
    slots = {key_slot(k.encode()) for k in [*Leases.keys(GROUP), group_key_prefix(GROUP) + "blocks"]}
    assert len(slots) == 1


# -- the indexer over its leases (in process; its replicas are addresses nothing listens on, so no streams
# start: what is checked is which replicas each indexer holds and follows, as /health shows it) ------------


def lease_settings(redis_url: str, name: str, replicas: list[str], **extra: float) -> IndexerSettings:
    return parse_section(IndexerSettings, {
        "redis_url": redis_url, "assignment": "lease", "indexer_id": name, "lease_ttl_s": 1.0,
        "lease_renew_interval_s": 0.2, "engine_timeout_s": 0.5, "discovery_interval_s": 60.0,
        # Nothing listens at these replicas: no indexer can follow them. Only the test below gives them up.
        "lease_unreachable_handoff_s": 20.0,
        "model_groups": {"g": {"replicas": [{"api_base": r} for r in replicas]}},
        **extra,
    }, "indexer")


def held(ix: Indexer) -> set[str]:
    return {r["replica"] for r in ix.health()["replicas"] if r["owned"]}


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.05)


async def test_lease_indexers_keep_their_replicas_while_redis_is_down_and_settle_again_after() -> None:
    server = RedisServer(name="redis-lease-outage")
    replicas = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    a = Indexer(lease_settings(server.url, "a", replicas))
    b = Indexer(lease_settings(server.url, "b", replicas))
    try:
        await a.start()
        assert held(a) == set(replicas) and a.health()["assignment"]["owned"] == {"g": sorted(replicas)}
        await b.start()
        await until(lambda: len(held(a)) == 1 and held(a) | held(b) == set(replicas))
        before = (held(a), held(b))
        server.stop()
        await asyncio.sleep(1.5)  # past the lease TTL: nobody can renew, and nobody stops following
        assert (held(a), held(b)) == before
        h = a.health()
        assert h["status"] == "degraded" and h["assignment"]["lease_ok"] is False
        server.start()  # without persistence: the lease table is gone
        await until(lambda: a.lease_ok and b.lease_ok and len(held(a)) == 1 and held(a) | held(b) == set(replicas))
    finally:
        await a.stop()
        await b.stop()
        server.stop()


async def test_lease_a_hand_over_leaves_no_gap_whatever_order_the_rounds_answer_in() -> None:
    """Two indexers' rounds can answer in either order: the giver may hear that the taker holds the lease before the
    taker does. The giver keeps following the replica until a second round agrees, so it is never left unfollowed.
    The rounds are run by hand, one at a time, so the bad order happens every time."""
    server = RedisServer(name="redis-lease-order")
    replicas = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    a = Indexer(lease_settings(server.url, "a", replicas))
    b = Indexer(lease_settings(server.url, "b", replicas))
    assert a.leases is not None and b.leases is not None

    async def round_of(ix: Indexer) -> LeaseRound:
        assert ix.leases is not None
        return await ix.leases.renew("g", replicas, ())

    try:
        a._apply_round("g", await round_of(a))
        assert held(a) == set(replicas)
        await round_of(b)  # b is live: a's next round offers the lease past its share
        a._apply_round("g", await round_of(a))
        taken = await round_of(b)  # b takes the offered lease ...
        moved = sorted(taken.owned_by("b"))
        assert len(moved) == 1
        a._apply_round("g", await round_of(a))  # ... and a hears of it first
        assert held(a) == set(replicas) and held(b) == set()  # a still follows it
        b._apply_round("g", taken)
        assert held(b) == set(moved)
        a._apply_round("g", await round_of(a))  # a second round agrees: a stops following it
        assert held(a) == set(replicas) - set(moved) and held(b) == set(moved)
        assert a.health()["replicas"][replicas.index(moved[0])]["owner"] == "b"
    finally:
        await a.stop()
        await b.stop()
        server.stop()


async def test_lease_indexers_that_cannot_reach_the_engines_give_them_up_a_bounded_number_of_times() -> None:
    """No indexer reaches the replicas (their engine HTTP API refuses connections): each holder gives its replicas
    up after the hand-off time, says so on /health and in its metrics, and the leases then move only as cooldowns
    run out, never leaving a replica without a holder."""
    server = RedisServer(name="redis-lease-unreachable")
    replicas = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    handoff, cooldown = 0.3, 2.0
    extra = {"lease_unreachable_handoff_s": handoff, "lease_unreachable_cooldown_s": cooldown}
    a = Indexer(lease_settings(server.url, "a", replicas, **extra))
    b = Indexer(lease_settings(server.url, "b", replicas, **extra))
    try:
        await a.start()
        await until(lambda: bool(a.health()["assignment"]["given_up"]))
        h = a.health()  # alone: it keeps them and keeps trying
        assert h["assignment"]["given_up"] == {"g": dict.fromkeys(replicas, "kept")} and held(a) == set(replicas)
        assert h["status"] == "degraded"
        assert all(r["unreachable_s"] >= handoff and r["unreachable_error"] for r in h["replicas"]), h
        await b.start()
        holders: dict[str, list[str]] = {r: [] for r in replicas}
        t0 = asyncio.get_running_loop().time()
        t_end = t0 + 3 * cooldown
        while asyncio.get_running_loop().time() < t_end:
            ha, hb = held(a), held(b)
            assert ha | hb == set(replicas)  # every replica held throughout
            for r in replicas:
                who = "a" if r in ha and r not in hb else "b" if r in hb and r not in ha else ""
                if who and (not holders[r] or holders[r][-1][0] != who):
                    holders[r].append(f"{who}@{asyncio.get_running_loop().time() - t0:.2f}")
            await asyncio.sleep(0.02)
        moves = {r: len(h) - 1 for r, h in holders.items()}
        print(f"\n[unreachable] holders over {3 * cooldown:.1f}s (cooldown {cooldown}s): {holders}")
        # Every replica was tried by both. A move goes to an indexer whose cooldown ran out (up to a round early: the
        # giver's record is refreshed at its rounds), so at most 1 + 6 / 1.8 moves here; without cooldowns a lease
        # would move every hand-off time + round, about 12 times.
        assert all(1 <= m <= 4 for m in moves.values()), holders
        metrics = generate_latest().decode()
        assert 'litellm_kv_indexer_lease_claims_total{kind="unreachable",model_group="g"}' in metrics
        # The lone phase's give-ups are counted as kept. Whether a later give-up counts as offered depends on whether
        # the other indexer had given the replica up too at that round, which the timing decides; the moves and
        # the unreachable claims above are the hand-off's evidence.
        assert 'litellm_kv_indexer_lease_unreachable_total{model_group="g",outcome="kept"}' in metrics
    finally:
        await a.stop()
        await b.stop()
        server.stop()
