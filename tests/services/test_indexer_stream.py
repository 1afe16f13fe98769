"""The indexer's event stream against a real ``redis-server``: malformed events, undecodable batches, and
bursts of batches sent to Redis together.

A real vLLM engine cannot be made to publish a malformed event, so the publisher is the test's own ZMQ
PUB + replay ROUTER speaking vLLM's wire protocol (``tests.vllm.test_subscriber.FakePublisher``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import zmq.asyncio

from litellm_kv.index.base import ReplicaMatch
from litellm_kv.index.redis import RedisIndex
from litellm_kv.services.indexer.stream import EventStream
from tests.vllm.test_subscriber import TOPIC, FakePublisher, batch, removed, stored, until
from tools.harness.redis_server import RedisServer

pytestmark = pytest.mark.redis

G, R = "g", "r"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-indexer-stream")
    yield srv
    srv.stop()


@pytest.fixture
async def setup(server: RedisServer) -> AsyncIterator[tuple[FakePublisher, EventStream, RedisIndex]]:
    server.client().flushall()
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tempfile.gettempdir()}/litellm-kv-streamtest-{os.getpid()}-{time.monotonic_ns()}.sock"
    pub = FakePublisher(ctx, endpoint)
    index = RedisIndex(server.url)
    stream = EventStream(index, ctx, group=G, replica=R, stream=R, endpoint=endpoint,
                         replay_endpoint=pub.replay_endpoint, topic=TOPIC, replay_timeout_s=2)
    stream.start()
    await until(lambda: stream.stats.connected and len(pub.replay_requests) >= 1)
    await asyncio.sleep(0.3)  # let the subscription reach the PUB (slow joiner)
    yield pub, stream, index
    await stream.stop()
    await index.close()
    await pub.close()
    ctx.term()


async def test_index_exactness_keeps_the_valid_events_of_a_batch_with_a_malformed_store(
    setup: tuple[FakePublisher, EventStream, RedisIndex],
) -> None:
    pub, stream, index = setup
    bad_store = {"type": "BlockStored", "block_hashes": "nope", "block_size": 32}
    await pub.publish(batch(stored([1, 2]), bad_store, stored([3], parent=2)))
    await until(lambda: stream.stats.last_seq == 0)
    assert stream.stats.bad_events == 1 and stream.stats.resyncs == 0
    assert await index.lookup(G, [1, 2, 3]) == {R: ReplicaMatch(gpu=3)}


async def test_index_exactness_purges_at_a_malformed_removal_and_keeps_what_follows(
    setup: tuple[FakePublisher, EventStream, RedisIndex],
) -> None:
    pub, stream, index = setup
    await pub.publish(batch(stored([1, 2, 3])))
    await until(lambda: stream.stats.last_seq == 0)
    await pub.publish(batch(stored([4], parent=3), {"type": "BlockRemoved", "block_hashes": [-1]}, stored([9])))
    await until(lambda: stream.stats.last_seq == 1)
    assert stream.stats.bad_events == 1
    assert await index.lookup(G, [1, 2, 3, 4]) == {}
    assert await index.lookup(G, [9]) == {R: ReplicaMatch(gpu=1)}


async def test_index_exactness_purges_on_a_batch_that_cannot_be_decoded(
    setup: tuple[FakePublisher, EventStream, RedisIndex],
) -> None:
    pub, stream, index = setup
    await pub.publish(batch(stored([1, 2])))
    await until(lambda: stream.stats.last_seq == 0)
    await pub.publish(b"\xc1 not msgpack")  # seq 1: its events (removals, perhaps) are unknown
    await until(lambda: stream.stats.last_seq == 1)
    assert await index.lookup(G, [1, 2]) == {}  # purged at once, not only when a later gap is found
    await pub.publish(batch(stored([5])))
    await until(lambda: stream.stats.last_seq == 2)
    assert stream.stats.bad_payloads == 1 and stream.stats.gaps == 0
    assert await index.lookup(G, [5]) == {R: ReplicaMatch(gpu=1)}


async def test_queued_batches_go_to_redis_together_and_in_order(
    setup: tuple[FakePublisher, EventStream, RedisIndex],
) -> None:
    """A burst queued on the socket is applied in a few round trips, each batch judged in order: a block
    stored in one batch and evicted in a later one of the same call is gone, its successor held."""
    pub, stream, index = setup
    before = index.round_trips
    n = 120
    for i in range(n):  # the stream task cannot run in between: every batch is queued before it reads
        await pub.publish(batch(stored([1000 + i], parent=999 + i if i else None), removed([999 + i])))
    time.sleep(0.3)  # (blocking on purpose) let ZMQ's I/O thread move the burst into the SUB queue
    await until(lambda: stream.stats.last_seq == n - 1)
    assert index.round_trips - before <= 6
    assert stream.stats.gaps == 0 and stream.stats.resyncs == 0
    assert await index.lookup(G, [1000 + n - 1]) == {R: ReplicaMatch(gpu=1)}
    assert await index.lookup(G, [1000 + n - 2]) == {}
    assert await index.size(G) == 1


async def test_a_lost_batch_inside_a_burst_is_replayed(
    setup: tuple[FakePublisher, EventStream, RedisIndex],
) -> None:
    """Batches after a hole in one call are gaps: the stream replays from the hole and ends exact."""
    pub, stream, index = setup
    for i in range(30):  # batch 12 never reaches the SUB socket
        await pub.publish(batch(stored([2000 + i], parent=1999 + i if i else None)), live=i != 12)
    time.sleep(0.3)  # (blocking on purpose) the whole burst is queued before the stream reads it
    await until(lambda: stream.stats.last_seq == 29)
    assert stream.stats.gaps >= 1 and stream.stats.resyncs == 0
    assert await index.lookup(G, [2000 + i for i in range(30)]) == {R: ReplicaMatch(gpu=30)}


# -- Redis loses the index: every path that finds the loss counts one resync ----------------------------------


async def test_redis_losing_its_data_is_found_by_the_next_batch_and_counted_once(
    setup: tuple[FakePublisher, EventStream, RedisIndex], server: RedisServer,
) -> None:
    """Redis forgets the stream (flushed, as a restart without persistence does) while the engine is idle; the
    next live batch is a gap behind what the stream applied: one resync, a replay from 0, exact again."""
    pub, stream, index = setup
    for i in range(3):
        await pub.publish(batch(stored([3000 + i], parent=2999 + i if i else None)))
    await until(lambda: stream.stats.last_seq == 2)
    server.client().flushall()
    await pub.publish(batch(stored([3003], parent=3002)))
    await until(lambda: stream.stats.last_seq == 3)
    assert stream.stats.resyncs == 1
    assert await index.lookup(G, [3000, 3001, 3002, 3003]) == {R: ReplicaMatch(gpu=4)}


async def test_redis_restarting_under_the_stream_is_counted_once(
    setup: tuple[FakePublisher, EventStream, RedisIndex], server: RedisServer,
) -> None:
    """A batch arrives while Redis is down: the stream backs off, resumes from Redis's lost position (none),
    counts one resync and replays the engine's buffer from 0."""
    pub, stream, index = setup
    for i in range(3):
        await pub.publish(batch(stored([4000 + i], parent=3999 + i if i else None)))
    await until(lambda: stream.stats.last_seq == 2)
    server.stop()
    try:
        await pub.publish(batch(stored([4003], parent=4002)))
        await until(lambda: stream.stats.redis_errors >= 1)
    finally:
        server.start()
    await until(lambda: stream.stats.last_seq == 3, timeout=15)
    assert stream.stats.resyncs == 1
    assert await index.lookup(G, [4000, 4001, 4002, 4003]) == {R: ReplicaMatch(gpu=4)}


# -- an engine out of reach: the replay socket does not answer (its port is closed) -------------------------


@pytest.fixture
async def unanswered(server: RedisServer) -> AsyncIterator[tuple[FakePublisher, EventStream, RedisIndex]]:
    """A stream whose publisher's replay socket is closed from the start; retries every 0.3 s."""
    server.client().flushall()
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tempfile.gettempdir()}/litellm-kv-streamtest-{os.getpid()}-{time.monotonic_ns()}.sock"
    pub = FakePublisher(ctx, endpoint)
    await pub.replay_down()
    index = RedisIndex(server.url)
    stream = EventStream(index, ctx, group=G, replica=R, stream=R, endpoint=endpoint,
                         replay_endpoint=pub.replay_endpoint, topic=TOPIC, replay_timeout_s=0.3, retry_s=0.3)
    stream.start()
    yield pub, stream, index
    await stream.stop()
    await index.close()
    await pub.close()
    ctx.term()


async def test_an_unanswered_replay_marks_the_stream_unreached_and_is_asked_again(
    unanswered: tuple[FakePublisher, EventStream, RedisIndex],
) -> None:
    """Batches the stream missed sit in the engine's buffer; while its replay socket is closed the stream says
    it cannot follow (not connected, ``unreached_s``) and keeps asking; once the socket answers, the replay
    brings the batches in (no purge: the replay reached back to Redis's position)."""
    pub, stream, index = unanswered
    await pub.publish(batch(stored([1, 2])), live=False)  # buffered, never seen live
    await until(lambda: stream.unreached_since is not None)
    await asyncio.sleep(1.0)
    h = stream.health()
    assert h["connected"] is False and h["unreached_s"] is not None and float(h["unreached_s"]) >= 0.9  # type: ignore[arg-type]
    assert stream.stats.replays >= 2
    assert await index.lookup(G, [1, 2]) == {}
    pub.replay_up(stream.ctx)
    await until(lambda: stream.stats.connected and stream.stats.last_seq == 0, timeout=5)
    assert stream.unreached_since is None and stream.health()["unreached_s"] is None
    assert stream.stats.resyncs == 0
    assert await index.lookup(G, [1, 2]) == {R: ReplicaMatch(gpu=2)}


async def test_a_live_batch_after_an_unanswered_replay_reaches_the_stream_again(
    unanswered: tuple[FakePublisher, EventStream, RedisIndex],
) -> None:
    """The replay socket stays closed but the publisher's batches arrive: the engine is within reach."""
    pub, stream, index = unanswered
    await until(lambda: stream.unreached_since is not None)
    await asyncio.sleep(0.3)  # the subscription reaches the PUB (slow joiner)
    await pub.publish(batch(stored([7])))
    await until(lambda: stream.stats.last_seq == 0)
    assert stream.unreached_since is None and stream.stats.connected
    assert await index.lookup(G, [7]) == {R: ReplicaMatch(gpu=1)}
