"""One KV-event stream (a replica's data-parallel rank) fed into the shared Redis index.

Unlike the embedded subscriber, the position in the stream lives in Redis, not in this process:
each batch goes through :meth:`RedisIndex.apply_batches`, which applies it only if it is the next
``seq`` of the stream. Batches already queued on the socket when one arrives (a busy engine, a replay)
go in the same call, so one round trip carries many batches; each is still judged alone, in order.
That single rule gives all the recovery paths:

* **indexer restart** (or a second indexer starting): read the last applied ``seq`` from Redis,
  ask the engine's replay socket for everything after it, then follow live batches; batches the
  other indexer already applied come back as duplicates and are skipped;
* **gap** (dropped messages): Redis answers "gap"; replay from the last applied ``seq`` + 1;
* **lost batches** (the replay buffer no longer reaches back, or there is no replay socket): the
  first batch after the hole is applied with ``force``: the replica is purged and re-learned;
* **engine restart**: a lower ``seq`` with a newer timestamp; the script purges the replica;
* **Redis outage**: the apply raises; the stream waits with exponential backoff, then resumes as
  after a restart (a Redis that lost its data has no stream state: replay from 0);
* **engine out of reach** (its replay socket does not answer at all): the stream is *unreached*
  (``unreached_since``, not connected) until it hears from the engine again, a live batch or a replay
  answer; meanwhile it asks for the replay again every ``retry_s``. Silence alone is no sign: an idle
  engine publishes nothing, so a stream without a replay socket is never unreached.

**Malformed events** are decoded one by one: a malformed ``BlockStored`` is skipped (the index
then only under-predicts), one of any other kind may have removed blocks and becomes a purge at its
place in the batch; a batch that cannot be decoded at all purges the replica and consumes its seq.

``BlockStored`` events with parent None go to Redis as :class:`RootStored` ops: with
``kv_cache_report_mode: "full"`` they may re-announce a prefix-cache hit, which the apply script
does not count again when the replica already holds the whole chain.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import zmq
import zmq.asyncio
from redis.exceptions import RedisError

from litellm_kv.index.redis import (
    CLEAR,
    LOST,
    SKIPPED,
    ApplyOp,
    ApplyResult,
    ApplyStatus,
    BatchOps,
    RedisIndex,
    RootStored,
)
from litellm_kv.observability import counter, gauge
from litellm_kv.tasks import cancel_and_wait
from litellm_kv.vllm.events import (
    AllBlocksCleared,
    BlockStored,
    EventBatch,
    EventDecodeError,
    MalformedEvent,
    decode_event_batch,
    to_block_ops,
)
from litellm_kv.vllm.wire import WireError, parse_event_message, request_replay

log = logging.getLogger("litellm_kv.services.indexer")

BATCHES = counter(
    "indexer_batches", "KV-event batches handled, by outcome (applied, duplicate, gap, restart, bad).",
    ["model_group", "replica", "outcome"],
)
BLOCKS = counter(
    "indexer_block_ops", "Block hashes whose refcount an applied batch changed.", ["model_group", "replica"]
)
GAPS = counter("indexer_gaps", "Gaps found in a replica's event sequence.", ["model_group", "replica"])
REPLAYS = counter(
    "indexer_replays", "Replay requests sent to a replica's replay socket.", ["model_group", "replica"]
)
RESYNCS = counter(
    "indexer_resyncs",
    "Times a replica was purged or lost and re-learned (engine restart, lost batches, AllBlocksCleared, an "
    "undecodable batch, Redis losing the stream's data).",
    ["model_group", "replica"],
)
REANNOUNCED = counter(
    "indexer_reannounced",
    "Root BlockStored events of chains a replica already held (kv_cache_report_mode=full re-announcing "
    "prefix-cache hits), not counted again.",
    ["model_group", "replica"],
)
LAST_SEQ = gauge("indexer_last_seq", "Last KV-event seq applied to Redis.", ["model_group", "replica", "stream"])
CONNECTED = gauge(
    "indexer_stream_connected",
    "1 while the stream follows live events into Redis; 0 while Redis is unreachable or it resumes.",
    ["model_group", "replica", "stream"],
)

EventCheck = Callable[[BlockStored], None]
MAX_BATCHES_PER_CALL = 256  # queued batches sent to Redis together at most (RedisIndex.apply_call_blocks bounds a call)


@dataclass(slots=True)
class StreamStats:
    """What ``/health`` shows per stream."""

    stream: str
    endpoint: str
    replay_endpoint: str | None
    connected: bool = False
    last_seq: int = -1
    last_batch_age_s: float | None = None
    unreached_s: float | None = None  # how long the engine has not answered (None: it does)
    batches_seen: int = 0
    events_applied: int = 0
    duplicates: int = 0
    reannounced: int = 0
    gaps: int = 0
    replays: int = 0
    resyncs: int = 0
    bad_payloads: int = 0
    bad_events: int = 0
    redis_errors: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class EventStream:
    """Follows one publisher (SUB) into Redis, replaying from its ROUTER socket when needed."""

    def __init__(
        self,
        index: RedisIndex,
        ctx: zmq.asyncio.Context,
        *,
        group: str,
        replica: str,
        stream: str,
        endpoint: str,
        replay_endpoint: str | None,
        topic: str = "",
        bind: bool = False,
        check: EventCheck | None = None,
        replay_timeout_s: float = 5.0,
        backoff_max_s: float = 5.0,
        max_batches_per_call: int = MAX_BATCHES_PER_CALL,
        retry_s: float = 5.0,
    ) -> None:
        self.index = index
        self.ctx = ctx
        self.group, self.replica = group, replica
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.topic, self.bind = topic, bind
        self.check = check  # sees every BlockStored (it samples itself)
        self.replay_timeout_s, self.backoff_max_s = replay_timeout_s, backoff_max_s
        self.max_batches_per_call = max_batches_per_call
        self.retry_s = retry_s
        # Monotonic time of the first replay that got no answer since the engine was last heard from.
        self.unreached_since: float | None = None
        self.stats = StreamStats(stream, endpoint, replay_endpoint)
        self._last_batch = 0.0
        self._rng = random.Random()
        self._task: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Task[None]] = set()  # runs replaced by a resync, until they have ended
        self._sub: zmq.asyncio.Socket | None = None
        self._labels = (group, replica)
        self._force_next = False

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        if self.bind:
            sub.bind(self.endpoint)
        else:
            sub.connect(self.endpoint)
        self._sub = sub
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kv-stream-{self.stats.stream}")

    def resync(self) -> None:
        """Restart from Redis's position (Redis lost data, or another indexer reset the stream).
        Cancelling mid-apply is safe: the position is in Redis, whatever the outcome. The new run starts once
        the old one has ended, so two never read the socket at once (a cancellation can be lost: cancel_and_wait
        sends it again)."""
        old = self._task
        if old is not None:
            self._ending.add(old)
            old.add_done_callback(self._ending.discard)
        self._task = asyncio.get_running_loop().create_task(self._run_after_ended(),
                                                            name=f"kv-stream-{self.stats.stream}")

    async def _run_after_ended(self) -> None:
        for task in list(self._ending):
            await cancel_and_wait(task, Exception)
        await self._run()

    async def verify(self) -> None:
        """Resync when Redis is behind what this stream applied (data lost: a restart without
        persistence, a failover, or a purge by another indexer). Raises RedisError if down."""
        state = await self.index.stream_state(self.group, self.stats.stream)
        if self._redis_behind(-1 if state is None else state[0]):
            self.resync()

    def _redis_behind(self, redis_seq: int) -> bool:
        """Count and log a resynchronisation when Redis's position (-1: none) is behind what this stream
        applied, and take Redis's position as the stream's; whichever path finds the loss (the heartbeat's
        check, a resume after an outage, a gap answer) counts it once."""
        if self.stats.last_seq < 0 or redis_seq >= self.stats.last_seq:
            return False
        log.warning("indexer %s: Redis has %s but this stream applied up to %d (Redis lost data, another "
                    "indexer reset the stream, or the engine restarted): resynchronising", self.stats.stream,
                    "no position" if redis_seq < 0 else f"seq {redis_seq}", self.stats.last_seq)
        self.stats.resyncs += 1
        RESYNCS.labels(*self._labels).inc()
        self.stats.last_seq = redis_seq
        return True

    async def stop(self) -> None:
        await cancel_and_wait(self._task, Exception)
        for task in list(self._ending):
            await cancel_and_wait(task, Exception)
        if self._sub is not None:
            self._sub.close(linger=0)
        self._set_connected(False)

    def health(self) -> dict[str, object]:
        if self._last_batch:
            self.stats.last_batch_age_s = round(time.monotonic() - self._last_batch, 3)
        since = self.unreached_since
        self.stats.unreached_s = None if since is None else round(time.monotonic() - since, 3)
        return self.stats.as_dict()

    # -- main loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self._resume()
                self._set_connected(self.unreached_since is None)
                backoff = 0.1
                await self._follow()  # returns to ask for the replay again while the engine is out of reach
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                self._set_connected(False)
                self.stats.redis_errors += 1
                self.stats.last_error = f"redis: {exc}"
                log.warning("indexer %s: Redis unavailable (%s); retrying in %.1fs", self.stats.stream, exc,
                            backoff)
                await asyncio.sleep(backoff * (0.5 + self._rng.random()))
                backoff = min(backoff * 2, self.backoff_max_s)
            except Exception as exc:  # never let one stream die silently
                self._set_connected(False)
                self.stats.last_error = repr(exc)
                log.exception("indexer %s: stream failed; restarting", self.stats.stream)
                await asyncio.sleep(1.0)

    async def _resume(self) -> None:
        """Catch up from Redis's position: replay everything after the last applied seq."""
        state = await self.index.stream_state(self.group, self.stats.stream)
        redis_seq = -1 if state is None else state[0]
        self._redis_behind(redis_seq)
        self.stats.last_seq = redis_seq
        await self._replay(redis_seq + 1)

    async def _follow(self) -> None:
        assert self._sub is not None
        while True:
            if self.unreached_since is not None and not await self._sub.poll(int(self.retry_s * 1000)):
                return
            frames = [await self._sub.recv_multipart()]
            self._heard()
            # What else is queued goes to Redis in the same round trip (none is waited for).
            while len(frames) < self.max_batches_per_call:
                try:
                    frames.append(await self._sub.recv_multipart(flags=zmq.NOBLOCK))
                except zmq.Again:
                    break
            items: list[tuple[int, bytes, bool]] = []
            for f in frames:
                try:
                    msg = parse_event_message(f)
                except WireError:
                    self.stats.bad_payloads += 1
                    continue
                items.append((msg.seq, msg.payload, False))
            results = await self._apply_many(items)
            if any(r.status is ApplyStatus.GAP for r in results):
                last = results[-1].last_seq  # Redis's position after the whole call
                self.stats.gaps += 1
                GAPS.labels(*self._labels).inc()
                log.info("indexer %s: gap before seq %d (Redis has %d); replaying", self.stats.stream,
                         items[-1][0], last)
                await self._replay(last + 1)

    async def _replay(self, start: int) -> None:
        """Apply the engine's buffered batches from ``start``; a hole in them is a forced resync."""
        batches = await self._request_replay(start) if self.replay_endpoint else None
        if batches is None:
            # No replay socket (or it did not answer): the next live batch re-learns the replica.
            self._force_next = True
            return
        self._force_next = False  # this replay reaches back to Redis's position: nothing is lost any more
        expected = start
        items: list[tuple[int, bytes, bool]] = []
        for seq, payload in batches:
            if seq < expected:
                continue
            items.append((seq, payload, seq != expected))
            expected = seq + 1
        for i in range(0, len(items), self.max_batches_per_call):
            await self._apply_many(items[i : i + self.max_batches_per_call])

    async def _apply_many(self, items: list[tuple[int, bytes, bool]]) -> list[ApplyResult]:
        """Decode ``(seq, payload, force)`` batches and apply them in order, in as few round trips as
        :meth:`RedisIndex.apply_batches` takes; one result per batch."""
        if not items:
            return []
        specs: list[BatchOps] = []
        decoded: list[EventBatch | None] = []
        for seq, payload, force in items:
            self.stats.batches_seen += 1
            if self._force_next:
                force, self._force_next = True, False
            try:
                batch = decode_event_batch(payload, keep_valid=True)
            except EventDecodeError as exc:
                # Its events (removals, perhaps) are unknown: the replica is purged and re-learned, and the seq
                # is consumed (a replay would bring the same bytes). ts 0: its real time is unknown, and a low
                # one errs safe (a later batch with a lower seq reads as an engine restart, which purges; a high
                # one could hide a real restart).
                self.stats.bad_payloads += 1
                self.stats.last_error = f"bad payload at seq {seq}: {exc}"
                BATCHES.labels(*self._labels, "bad").inc()
                specs.append(BatchOps([LOST], self.stats.stream, seq, 0.0, force))
                decoded.append(None)
                continue
            specs.append(BatchOps(self._ops(seq, batch), self.stats.stream, seq, batch.ts, force))
            decoded.append(batch)
        self._last_batch = time.monotonic()
        results = await self.index.apply_batches(self.group, self.replica, specs)
        for spec, known, res in zip(specs, decoded, results, strict=True):
            if known is None:
                self._record_undecodable(spec.seq, res)
            else:
                self._record(spec.seq, known, res, spec.force)
        return results

    def _ops(self, seq: int, batch: EventBatch) -> list[ApplyOp]:
        ops: list[ApplyOp] = []
        for ev in batch.events:
            if isinstance(ev, MalformedEvent):
                self.stats.bad_events += 1
                self.stats.last_error = f"bad event at seq {seq}: {ev.error}"
                # A lost removal would over-predict: re-learn the replica from here. A lost store only
                # under-predicts, until the engine re-announces it.
                ops.append(LOST if ev.may_remove else SKIPPED)
                continue
            if isinstance(ev, AllBlocksCleared):
                ops.append(CLEAR)
                continue
            if not isinstance(ev, BlockStored):
                ops.extend(to_block_ops(ev))
                continue
            # Parent None: possibly a re-announced hit; Redis decides against the replica's entries.
            root = ev.parent_block_hash is None
            ops.extend(RootStored(op) if root else op for op in to_block_ops(ev))
            if self.check is not None:
                try:
                    self.check(ev)
                except Exception as exc:  # a broken check must never stop indexing
                    self.stats.last_error = f"exactness check failed to run: {exc!r}"
        return ops

    def _record(self, seq: int, batch: EventBatch, res: ApplyResult, force: bool) -> None:
        BATCHES.labels(*self._labels, res.status.value).inc()
        if res.status in (ApplyStatus.APPLIED, ApplyStatus.RESTART):
            self.stats.events_applied += len(batch.events)
            self.stats.last_seq = res.last_seq
            LAST_SEQ.labels(*self._labels, self.stats.stream).set(res.last_seq)
            BLOCKS.labels(*self._labels).inc(res.touched)
            if res.reannounced:
                self.stats.reannounced += res.reannounced
                REANNOUNCED.labels(*self._labels).inc(res.reannounced)
        elif res.status is ApplyStatus.DUPLICATE:
            self.stats.duplicates += 1
            self.stats.last_seq = max(self.stats.last_seq, res.last_seq)
        elif res.status is ApplyStatus.GAP and not res.purged:
            self._redis_behind(res.last_seq)  # a gap behind what was applied: Redis lost the stream's data
        if res.status is ApplyStatus.RESTART or (res.status is ApplyStatus.GAP and res.purged):
            if res.status is ApplyStatus.GAP:
                self.stats.last_seq = res.last_seq
            self.stats.resyncs += 1
            RESYNCS.labels(*self._labels).inc()
            log.warning("indexer %s: replica purged and re-learning (seq %d, %d entries dropped, %s)",
                        self.stats.stream, seq, res.purged, "forced" if force else "engine restarted")

    def _record_undecodable(self, seq: int, res: ApplyResult) -> None:
        if res.status in (ApplyStatus.APPLIED, ApplyStatus.RESTART):
            self.stats.last_seq = res.last_seq
            LAST_SEQ.labels(*self._labels, self.stats.stream).set(res.last_seq)
            self.stats.resyncs += 1
            RESYNCS.labels(*self._labels).inc()
            log.warning("indexer %s: batch %d could not be decoded: replica purged and re-learning (%s)",
                        self.stats.stream, seq, self.stats.last_error)

    async def _request_replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """Ask the ROUTER for batches from ``start``; None when it does not answer in time."""
        assert self.replay_endpoint is not None
        self.stats.replays += 1
        REPLAYS.labels(*self._labels).inc()
        try:
            replay = await request_replay(self.ctx, self.replay_endpoint, start, timeout_s=self.replay_timeout_s)
        except zmq.ZMQError as exc:
            self._unreached(f"replay socket {self.replay_endpoint}: {exc}")
            raise
        if replay.complete:
            self._heard()
            return replay.batches
        if not replay.batches:
            self._unreached(f"replay from {start}: no answer from {self.replay_endpoint} in {self.replay_timeout_s:g}s")
            return None
        # Batches that arrived before the engine went quiet are still worth applying.
        self._heard()
        self.stats.last_error = f"replay from {start} timed out after {len(replay.batches)} batches"
        log.warning("indexer %s: %s", self.stats.stream, self.stats.last_error)
        return replay.batches

    def _heard(self) -> None:
        """The engine answered (a live batch, a replay): it is within reach."""
        if self.unreached_since is not None:
            log.info("indexer %s: the engine answers again after %.1fs", self.stats.stream,
                     time.monotonic() - self.unreached_since)
            self.unreached_since = None
            self._set_connected(True)

    def _unreached(self, why: str) -> None:
        self.stats.last_error = why
        self._set_connected(False)
        if self.unreached_since is None:
            self.unreached_since = time.monotonic()
            log.warning("indexer %s: engine out of reach (%s); asking again every %.1fs", self.stats.stream, why,
                        self.retry_s)

    def _set_connected(self, up: bool) -> None:
        self.stats.connected = up
        CONNECTED.labels(*self._labels, self.stats.stream).set(1 if up else 0)
