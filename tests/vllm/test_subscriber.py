"""Subscriber edge cases: gaps, replay, lost batches, malformed frames, restarts, bind mode.

A real vLLM engine cannot be made to skip a sequence number, send garbage frames or lose
its replay ring on demand, so these tests drive the subscriber with a local ZMQ PUB + ROUTER
written here that speaks vLLM's wire protocol (vllm-contract.md §5.3: 3-frame batches, replay
replies ``["", topic, seq, payload]`` ending with seq ``ff..ff``). The same behaviour against
real engines (late start caught up through replay, a killed and restarted engine purged) is
tested in tests/vllm/test_engine_exactness.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from litellm_kv.index.base import ReplicaMatch
from litellm_kv.index.memory import InMemoryIndex
from litellm_kv.vllm.subscriber import KVEventSubscriber
from tools.harness.procs import free_port

G, R, TOPIC = "g", "r", "kv-events"


def stored(hashes: list[int], parent: int | None = None) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": list(range(32 * len(hashes))), "block_size": 32, "lora_id": None,
            "medium": "GPU", "lora_name": None}


def removed(hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def batch(*events: dict[str, Any], ts: float | None = None) -> bytes:
    return bytes(msgpack.packb([time.time() if ts is None else ts, list(events), 0]))


class FakePublisher:
    """vLLM's ZmqEventPublisher protocol: PUB + a replay ROUTER over a ring of batches."""

    def __init__(self, ctx: zmq.asyncio.Context, pub_endpoint: str, connect: bool = False) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if connect:
            self.pub.connect(pub_endpoint)
        else:
            self.pub.bind(pub_endpoint)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.router.bind(self.replay_endpoint)
        self.ring: dict[int, bytes] = {}
        self.seq = 0
        self.replay_requests: list[int] = []
        self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def publish(self, payload: bytes, *, live: bool = True) -> int:
        """Buffer the batch under the next seq; ``live=False`` keeps it off the PUB (a loss)."""
        seq = self.seq
        self.seq += 1
        self.ring[seq] = payload
        if live:
            await self.pub.send_multipart([TOPIC.encode(), seq.to_bytes(8, "big"), payload])
        return seq

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.pub.send_multipart(frames)

    def restart(self) -> None:
        """A new engine lifetime: seq from 0, empty ring."""
        self.seq = 0
        self.ring.clear()

    async def replay_down(self) -> None:
        """The replay socket stops answering (its port closed: nothing listens there)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.router.close(0)

    def replay_up(self, ctx: zmq.asyncio.Context) -> None:
        """The replay socket answers again, on the same endpoint."""
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(self.replay_endpoint)
        self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def _serve_replay(self) -> None:
        while True:
            ident, _empty, start_b = await self.router.recv_multipart()
            start = int.from_bytes(start_b, "big")
            self.replay_requests.append(start)
            for seq in sorted(s for s in self.ring if s >= start):
                await self.router.send_multipart([ident, b"", TOPIC.encode(), seq.to_bytes(8, "big"),
                                                  self.ring[seq]])
            await self.router.send_multipart([ident, b"", b"", b"\xff" * 8, b""])

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.pub.close(0)
        self.router.close(0)


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[FakePublisher, KVEventSubscriber, InMemoryIndex]]:
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tempfile.gettempdir()}/litellm-kv-subtest-{os.getpid()}-{time.monotonic_ns()}.sock"
    pub = FakePublisher(ctx, endpoint)
    index = InMemoryIndex()
    sub = KVEventSubscriber(group=G, replica=R, index=index, endpoint=endpoint,
                            replay_endpoint=pub.replay_endpoint, topic=TOPIC, context=ctx, replay_timeout_s=2)
    sub.start()
    await until(lambda: sub.stats.connected)
    await until(lambda: len(pub.replay_requests) >= 1)  # the catch-up replay on connect
    await asyncio.sleep(0.2)  # let the subscription reach the PUB (slow joiner)
    yield pub, sub, index
    await sub.stop()
    await pub.close()
    ctx.term()


async def test_gap_is_filled_from_replay(setup: tuple[FakePublisher, KVEventSubscriber, InMemoryIndex]) -> None:
    pub, sub, index = setup
    await pub.publish(batch(stored([1, 2])))
    await pub.publish(batch(stored([3], parent=2)), live=False)  # lost on the wire
    await pub.publish(batch(stored([4], parent=3)))
    await until(lambda: sub.stats.last_seq == 2)
    assert sub.stats.gaps == 1 and 1 in pub.replay_requests
    assert await index.lookup(G, [1, 2, 3, 4]) == {R: ReplicaMatch(gpu=4)}
    assert sub.stats.duplicates == 0 and sub.stats.purges == 0
    assert sub.stats.complete  # followed from seq 0, the gap filled: nothing missed


async def test_lost_batches_purge_the_replica(setup: tuple[FakePublisher, KVEventSubscriber, InMemoryIndex]) -> None:
    pub, sub, index = setup
    await pub.publish(batch(stored([1, 2, 3])))
    await until(lambda: sub.stats.last_seq == 0)
    await pub.publish(batch(removed([3])), live=False)
    del pub.ring[1]  # gone from the engine's ring too: the removal can never be learnt
    await pub.publish(batch(stored([9])))
    await until(lambda: sub.stats.last_seq == 2)
    # Keeping blocks 1-3 could over-predict forever; the replica restarts from what it sends.
    assert sub.stats.purges == 1
    assert await index.lookup(G, [1, 2, 3]) == {}
    assert await index.lookup(G, [9]) == {R: ReplicaMatch(gpu=1)}
    assert not sub.stats.complete  # blocks 1-2 may still be held: only re-announcements bring them back


async def test_malformed_frames_are_counted_and_skipped(
    setup: tuple[FakePublisher, KVEventSubscriber, InMemoryIndex],
) -> None:
    pub, sub, index = setup
    await pub.send_raw([TOPIC.encode(), b"\x00" * 8])  # 2 frames
    await pub.send_raw([TOPIC.encode(), b"\x00", b"x"])  # short seq
    await pub.publish(b"\xc1 not msgpack")  # seq 0: undecodable payload
    await pub.publish(batch({"type": "BlockStored", "block_hashes": "nope"}))  # seq 1: bad fields
    await pub.publish(batch(stored([5, 6])))  # seq 2: fine
    await until(lambda: sub.stats.last_seq == 2)
    assert sub.stats.malformed == 4
    assert sub.stats.gaps == 0  # a bad payload still consumes its seq: no replay loop
    assert await index.lookup(G, [5, 6]) == {R: ReplicaMatch(gpu=2)}


async def test_index_exactness_keeps_the_valid_events_of_a_batch_with_a_malformed_store(
    setup: tuple[FakePublisher, KVEventSubscriber, InMemoryIndex],
) -> None:
    pub, sub, index = setup
    bad_store = {"type": "BlockStored", "block_hashes": "nope", "block_size": 32}
    await pub.publish(batch(stored([1, 2]), bad_store, stored([3], parent=2)))
    await until(lambda: sub.stats.last_seq == 0)
    assert sub.stats.malformed == 1 and sub.stats.purges == 0
    assert await index.lookup(G, [1, 2, 3]) == {R: ReplicaMatch(gpu=3)}
    assert not sub.stats.complete  # the skipped store's blocks are held and not indexed


async def test_index_exactness_purges_at_a_malformed_removal_and_keeps_what_follows(
    setup: tuple[FakePublisher, KVEventSubscriber, InMemoryIndex],
) -> None:
    pub, sub, index = setup
    await pub.publish(batch(stored([1, 2, 3])))
    await until(lambda: sub.stats.last_seq == 0)
    # A removal that cannot be read: keeping 1-3 could over-predict forever.
    await pub.publish(batch(stored([4], parent=3), {"type": "BlockRemoved", "block_hashes": [-1]}, stored([9])))
    await until(lambda: sub.stats.last_seq == 1)
    assert sub.stats.malformed == 1 and sub.stats.purges == 1
    assert await index.lookup(G, [1, 2, 3, 4]) == {}
    assert await index.lookup(G, [9]) == {R: ReplicaMatch(gpu=1)}
    assert not sub.stats.complete


async def test_index_exactness_purges_on_a_batch_that_cannot_be_decoded(
    setup: tuple[FakePublisher, KVEventSubscriber, InMemoryIndex],
) -> None:
    pub, sub, index = setup
    await pub.publish(batch(stored([1, 2])))
    await pub.publish(b"\xc1 not msgpack")  # seq 1: its events (removals, perhaps) are unknown
    await pub.publish(batch(stored([5])))
    await until(lambda: sub.stats.last_seq == 2)
    assert sub.stats.purges == 1 and sub.stats.gaps == 0
    assert await index.lookup(G, [1, 2]) == {}
    assert await index.lookup(G, [5]) == {R: ReplicaMatch(gpu=1)}
    assert not sub.stats.complete


async def test_seq_going_back_is_a_restart(setup: tuple[FakePublisher, KVEventSubscriber, InMemoryIndex]) -> None:
    pub, sub, index = setup
    for h in (1, 2, 3):
        await pub.publish(batch(stored([h * 10])))
    await until(lambda: sub.stats.last_seq == 2)
    pub.restart()
    await pub.publish(batch(stored([77])))
    await until(lambda: sub.stats.purges == 1 and sub.stats.last_seq == 0)
    assert await index.size(G) == 1
    assert await index.lookup(G, [77]) == {R: ReplicaMatch(gpu=1)}
    assert sub.stats.complete  # the new engine's stream from its first batch


async def test_all_blocks_cleared_purges(setup: tuple[FakePublisher, KVEventSubscriber, InMemoryIndex]) -> None:
    pub, sub, index = setup
    told: list[int] = []
    sub.on_purge = lambda: told.append(sub.stats.purges)  # called after the purge is counted
    await pub.publish(batch(stored([1, 2])))
    await pub.publish(batch({"type": "AllBlocksCleared"}, stored([8])))
    await until(lambda: sub.stats.last_seq == 1)
    assert sub.stats.purges == 1 and told == [1]
    assert await index.lookup(G, [1]) == {} and await index.lookup(G, [8]) == {R: ReplicaMatch(gpu=1)}
    assert sub.stats.complete  # the engine holds nothing from before the clear either


async def test_reannouncement_not_counted_twice(
    setup: tuple[FakePublisher, KVEventSubscriber, InMemoryIndex],
) -> None:
    """kv_cache_report_mode=full re-emits hit prefixes as parent-None BlockStored events."""
    pub, sub, index = setup
    await pub.publish(batch(stored([1, 2, 3])))
    await pub.publish(batch(stored([1, 2])))  # a hit on blocks 1-2, re-announced
    await pub.publish(batch(stored([3], parent=2)))  # a real second copy of block 3
    await pub.publish(batch(removed([1]), removed([3])))
    await until(lambda: sub.stats.last_seq == 3)
    assert sub.stats.reannounced == 1
    assert index.count(G, R, 1) == 0 and index.count(G, R, 2) == 1 and index.count(G, R, 3) == 1
    assert sub.stats.complete


async def test_stream_is_complete_only_from_the_engines_first_batch(
    setup: tuple[FakePublisher, KVEventSubscriber, InMemoryIndex],
) -> None:
    pub, sub, _ = setup
    assert not sub.stats.complete  # nothing heard yet: the engine may hold blocks from before we connected
    await pub.publish(batch(stored([1, 2])))
    await until(lambda: sub.stats.last_seq == 0)
    assert sub.stats.complete


async def test_a_late_subscriber_whose_replay_no_longer_reaches_back_is_not_complete() -> None:
    """The engine's ring moved on before the subscriber started: blocks 1-2 are held and never announced to it, and
    only a re-announced hit (kv_cache_report_mode=full) can teach them."""
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tempfile.gettempdir()}/litellm-kv-subtest-{os.getpid()}-{time.monotonic_ns()}.sock"
    pub = FakePublisher(ctx, endpoint)
    index = InMemoryIndex()
    await pub.publish(batch(stored([1, 2])))
    await pub.publish(batch(stored([3])))
    del pub.ring[0]  # the ring no longer holds the first batch
    sub = KVEventSubscriber(group=G, replica=R, index=index, endpoint=endpoint,
                            replay_endpoint=pub.replay_endpoint, topic=TOPIC, context=ctx, replay_timeout_s=2)
    sub.start()
    try:
        await until(lambda: sub.stats.last_seq == 1)
        assert not sub.stats.complete
        assert await index.lookup(G, [1, 2]) == {}
        await asyncio.sleep(0.2)  # let the subscription reach the PUB (slow joiner)
        await pub.publish(batch(stored([1, 2])))  # a hit on 1-2, re-announced
        await until(lambda: sub.stats.last_seq == 2)
        assert await index.lookup(G, [1, 2]) == {R: ReplicaMatch(gpu=2)}
        assert sub.stats.reannounced == 0  # not held before: learnt, not skipped
        assert not sub.stats.complete  # other blocks from before may still be missing
    finally:
        await sub.stop()
        await pub.close()
        ctx.term()


async def test_bind_mode_engine_connects() -> None:
    """vLLM's PUB connects for a concrete tcp://host:port; the subscriber then binds."""
    ctx = zmq.asyncio.Context()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    index = InMemoryIndex()
    sub = KVEventSubscriber(group=G, replica=R, index=index, endpoint=endpoint, topic=TOPIC, bind=True,
                            context=ctx)
    sub.start()
    await asyncio.sleep(0.1)
    pub = FakePublisher(ctx, endpoint, connect=True)
    try:
        await until(lambda: sub.stats.connected)
        await asyncio.sleep(0.3)
        await pub.publish(batch(stored([4, 5])))
        await until(lambda: sub.stats.last_seq == 0)
        assert await index.lookup(G, [4, 5]) == {R: ReplicaMatch(gpu=2)}
    finally:
        await sub.stop()
        await pub.close()
        ctx.term()
