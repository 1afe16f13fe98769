"""KV-event subscriber: one ZMQ SUB per replica and data-parallel rank, feeding a KVIndex.

The frames (live batches, replay request and replies) are described and parsed in
:mod:`litellm_kv.vllm.wire`.

What the subscriber guarantees:
* **Gaps** (a seq skipped, the slow-joiner loss after connecting) are filled from the replay
  socket; if the batches are gone from the engine's ring the replica is purged, since a missed
  ``BlockRemoved`` would otherwise over-predict forever.
* **Late start**: on connect it replays from seq 0, so a subscriber started after the engine
  learns everything still in the replay buffer.
* **Engine restarts** purge the replica. A restarted engine sends no ``AllBlocksCleared``
  (contract §9); it is recognised by ``seq`` going back, or on reconnect by the replay socket no
  longer holding our last batch with the same timestamp.
* **Duplicates** (batches seen live and in a replay) are dropped by ``(seq, ts)``.
* **Whole streams** (:attr:`SubscriberStats.complete`): followed from the engine's first batch or its
  last ``AllBlocksCleared``, with nothing lost or skipped; the router then stops asking for re-announcements.
* **Re-announcements**: with ``kv_cache_report_mode: "full"`` the engine re-emits
  ``BlockStored`` (parent None, from block 0) for prefix-cache hits. Those are not new copies;
  counting them would inflate reference counts and over-predict after eviction. A parent-None
  ``BlockStored`` whose whole chain the replica already holds is therefore not counted.
  (Blind spot: a request of <= one block that recomputes a cached first block really makes a
  second copy; it is then under-counted by one until it is stored again.)
* **Malformed frames** are counted and skipped; the loop never dies (errors reconnect with
  backoff). Events are decoded one by one: a malformed ``BlockStored`` is skipped (the index then
  only under-predicts), a malformed event of any other kind may have removed blocks and purges the
  replica at its place in the batch, and a batch that cannot be decoded at all purges the replica
  (its seq is consumed, so no replay loop).

The socket connects by default; ``bind=True`` binds instead, for engines whose endpoint is a
concrete ``tcp://host:port`` (vLLM's PUB then connects).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from litellm_kv.index.base import BlockOp, KVIndex
from litellm_kv.observability import counter, gauge
from litellm_kv.tasks import cancel_and_wait
from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.events import (
    AllBlocksCleared,
    BlockStored,
    EventBatch,
    EventDecodeError,
    MalformedEvent,
    decode_event_batch,
    to_block_ops,
)
from litellm_kv.vllm.exactness import ExactnessChecker, HasherFactory
from litellm_kv.vllm.wire import WireError, connectable, parse_event_message, request_replay

log = logging.getLogger("litellm_kv")

_LABELS = ("model_group", "replica")
BATCHES = counter("kv_event_batches", "KV-event batches applied to the index.", _LABELS)
EVENTS = counter("kv_events", "KV events applied to the index (BlockStored, BlockRemoved, AllBlocksCleared).",
                 _LABELS)
GAPS = counter("kv_event_gaps", "Sequence gaps detected in a replica's KV-event stream.", _LABELS)
REPLAYS = counter("kv_event_replays", "Replay requests sent to a replica's replay socket.", _LABELS)
REPLAY_FAILURES = counter(
    "kv_event_replay_failures", "Replays that timed out or could not return every missed batch.", _LABELS
)
PURGES = counter(
    "kv_replica_purges",
    "Replica purges: engine restart, AllBlocksCleared, an unrecoverable gap, an undecodable batch or a malformed "
    "event that may have removed blocks.",
    _LABELS,
)
MALFORMED = counter(
    "kv_event_malformed",
    "KV-event frames, payloads or single events that could not be decoded (skipped; an undecodable payload or "
    "a malformed event that may have removed blocks also purges the replica).",
    _LABELS,
)
REANNOUNCED = counter(
    "kv_event_reannounced",
    "BlockStored re-announcements of already held prefixes (kv_cache_report_mode=full) not counted again.",
    _LABELS,
)
CONNECTED = gauge("kv_subscriber_connected", "1 while the subscriber's socket is connected.", _LABELS)
LAST_SEQ = gauge("kv_subscriber_last_seq", "Last KV-event batch sequence number applied.", _LABELS)


@dataclass(slots=True)
class SubscriberStats:
    connected: bool = False
    last_seq: int = -1
    batches: int = 0
    events: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    purges: int = 0
    malformed: int = 0
    duplicates: int = 0
    reannounced: int = 0
    errors: int = 0
    last_applied_monotonic: float = 0.0
    #: The index holds every block this engine reported since it started or last cleared its cache: the stream
    #: was followed from its first batch (seq 0) or an AllBlocksCleared, with no batch lost and no store skipped.
    #: False, blocks the engine holds may be missing, and only its re-announcements of hits
    #: (``kv_cache_report_mode: "full"``) bring them back.
    complete: bool = False


class KVEventSubscriber:
    """Subscribes to one engine's (one DP rank's) KV events and applies them to ``index``.

    Args:
        group, replica: where the events go in the index (``replica`` is the index's id).
        endpoint: the ZMQ endpoint of the engine's PUB (``ipc://..``, ``tcp://host:port``).
        replay_endpoint: the engine's ROUTER; None disables gap filling (gaps then purge).
        topic: the engine's topic ('' = everything).
        bind: bind ``endpoint`` instead of connecting.
        on_block_stored: sampling hook (e.g. :class:`ExactnessChecker.observe`).
        on_purge: called after each purge of the replica (its cache is gone: sibling predictions there are void).
        group_idx: apply only this KV-cache group's events (hybrid models); None = all.
        detect_reannounce: see the module docstring.
        replay_timeout_s: how long to wait for each replay frame.
    """

    def __init__(
        self,
        *,
        group: str,
        replica: str,
        index: KVIndex,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        bind: bool = False,
        on_block_stored: Callable[[BlockStored], None] | None = None,
        on_purge: Callable[[], None] | None = None,
        group_idx: int | None = None,
        detect_reannounce: bool = True,
        replay_timeout_s: float = 5.0,
        context: zmq.asyncio.Context | None = None,
        recent_batches: int = 20_000,
    ) -> None:
        self.group = group
        self.replica = replica
        self.index = index
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.bind = bind
        self.on_block_stored = on_block_stored
        self.on_purge = on_purge
        self.group_idx = group_idx
        self.detect_reannounce = detect_reannounce
        self.replay_timeout_s = replay_timeout_s
        self._ctx = context or zmq.asyncio.Context.instance()
        self._next = 0  # seq of the next batch we expect from the current engine lifetime
        self._recent: OrderedDict[int, float] = OrderedDict()  # seq -> ts of applied batches
        self._recent_limit = recent_batches
        self._task: asyncio.Task[None] | None = None
        self._stats = SubscriberStats()
        labels = (group, replica)
        self._m = {
            name: metric.labels(*labels)
            for name, metric in (
                ("batches", BATCHES), ("events", EVENTS), ("gaps", GAPS), ("replays", REPLAYS),
                ("replay_failures", REPLAY_FAILURES), ("purges", PURGES), ("malformed", MALFORMED),
                ("reannounced", REANNOUNCED),
            )
        }
        self._connected = CONNECTED.labels(*labels)
        self._last_seq = LAST_SEQ.labels(*labels)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"litellm-kv-sub-{self.group}-{self.replica}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self._set_connected(False)

    @property
    def stats(self) -> SubscriberStats:
        return self._stats

    async def wait_settled(self, quiet_s: float = 0.2, timeout_s: float = 10.0) -> bool:
        """Wait until no batch has been applied for ``quiet_s`` (tests, demos). False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            last = self._stats.last_applied_monotonic
            if time.monotonic() - last >= quiet_s:
                return True
            await asyncio.sleep(min(quiet_s, 0.05))
        return False

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self._session()
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception:
                self._stats.errors += 1
                log.exception("litellm-kv: subscriber %s/%s failed; reconnecting", self.group, self.replica)
                self._set_connected(False)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _session(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)  # never drop on our side; the engine's HWM bounds memory
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        mon = sub.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
        )
        try:
            if self.bind:
                sub.bind(self.endpoint)
            else:
                sub.connect(self.endpoint)
            poller = zmq.asyncio.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(mon, zmq.POLLIN)
            while True:
                ready = dict(await poller.poll(1000))
                if mon in ready:
                    event = parse_monitor_message(await mon.recv_multipart())
                    if event["event"] in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
                        self._set_connected(True)
                        await self._resync()
                    elif event["event"] == zmq.EVENT_DISCONNECTED:
                        self._set_connected(False)
                if sub in ready:
                    while int(sub.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                        frames = await sub.recv_multipart()
                        await self._on_frames(frames)
        finally:
            with contextlib.suppress(Exception):
                sub.disable_monitor()
            mon.close(0)
            sub.close(0)

    def _set_connected(self, up: bool) -> None:
        self._stats.connected = up
        self._connected.set(1 if up else 0)

    # -- live stream ---------------------------------------------------------------------------

    async def _on_frames(self, frames: list[bytes]) -> None:
        try:
            msg = parse_event_message(frames)
        except WireError as exc:
            self._malformed(str(exc))
            return
        if self.topic and msg.topic != self.topic.encode():
            return  # another topic sharing our prefix
        await self._on_batch(msg.seq, msg.payload, live=True)

    async def _on_batch(self, seq: int, payload: bytes, *, live: bool) -> None:
        batch = self._decode(payload)
        if seq < self._next:
            seen = self._recent.get(seq)
            if batch is None or (seen is not None and seen == batch.ts):
                self._stats.duplicates += 1
                return
            await self._purge(f"engine restarted (seq went back from {self._next - 1} to {seq})")
        if seq > self._next:
            if live and self.replay_endpoint:
                self._stats.gaps += 1
                self._m["gaps"].inc()
                await self._catch_up(self._next)
                if seq < self._next:
                    return  # the replay delivered it
            if seq > self._next:
                # Batches lost for good: a missed removal would over-predict, so start afresh.
                if self._next > 0 or await self.index.size(self.group):
                    await self._purge(f"batches {self._next}..{seq - 1} lost")
                self._next = seq
                self._stats.complete = False  # the engine may hold blocks stored before this batch
        await self._apply(seq, batch)

    def _decode(self, payload: bytes) -> EventBatch | None:
        try:
            return decode_event_batch(payload, keep_valid=True)
        except EventDecodeError as exc:
            self._malformed(str(exc))
            return None

    def _malformed(self, why: str) -> None:
        self._stats.malformed += 1
        self._m["malformed"].inc()
        log.warning("litellm-kv: %s/%s: malformed KV-event frame skipped: %s", self.group, self.replica, why)

    # -- replay --------------------------------------------------------------------------------

    async def _resync(self) -> None:
        """After (re)connecting: catch up from 0 the first time; later verify that the engine is
        the one we followed (its ring still holds our last batch with the same ts)."""
        if not self.replay_endpoint:
            return
        if self._next == 0:
            await self._catch_up(0)
            return
        frames = await self._replay(self._next - 1)
        if frames is None:
            return
        last_ts = self._recent.get(self._next - 1)
        if frames and frames[0][0] == self._next - 1:
            first = self._decode(frames[0][1])
            if first is not None and last_ts is not None and first.ts == last_ts:
                for seq, payload in frames[1:]:
                    await self._on_batch(seq, payload, live=False)
                return
        await self._purge("engine restarted while disconnected")
        await self._catch_up(0)

    async def _catch_up(self, start: int) -> None:
        frames = await self._replay(start)
        if frames is None:
            return
        if frames and frames[0][0] > start:
            self._stats.replay_failures += 1
            self._m["replay_failures"].inc()
            log.warning("litellm-kv: %s/%s: replay starts at %d, wanted %d (ring overflowed)",
                        self.group, self.replica, frames[0][0], start)
        for seq, payload in frames:
            if seq >= self._next:
                await self._on_batch(seq, payload, live=False)

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """Buffered batches from ``start`` on, or None when the replay socket did not answer."""
        assert self.replay_endpoint
        self._stats.replays += 1
        self._m["replays"].inc()
        try:
            replay = await request_replay(
                self._ctx, self.replay_endpoint, start, timeout_s=self.replay_timeout_s, on_malformed=self._malformed
            )
            if replay.complete:
                return replay.batches
            why = f"no replay answer from {self.replay_endpoint} in {self.replay_timeout_s}s"
        except zmq.ZMQError as exc:
            why = str(exc)
        self._stats.replay_failures += 1
        self._m["replay_failures"].inc()
        log.warning("litellm-kv: %s/%s: replay from %d failed: %s", self.group, self.replica, start, why)
        return None

    # -- applying ------------------------------------------------------------------------------

    async def _purge(self, why: str) -> None:
        dropped = await self.index.purge_replica(self.group, self.replica)
        self._next = 0
        self._recent.clear()
        self._stats.complete = False
        self._stats.purges += 1
        self._m["purges"].inc()
        log.info("litellm-kv: %s/%s purged (%d entries): %s", self.group, self.replica, dropped, why)
        if self.on_purge is not None:
            self.on_purge()

    async def _apply(self, seq: int, batch: EventBatch | None) -> None:
        if seq == 0 and self._next == 0:
            self._stats.complete = True  # the engine's first batch, onto an index that holds nothing of it
        self._next = seq + 1
        if batch is None:
            # Undecodable payload (counted): a removal may be among its events, so what the index holds for
            # the replica can no longer be trusted. Its seq is consumed, so there is no replay loop.
            await self._purge(f"batch {seq} could not be decoded")
            self._next = seq + 1
            return
        self._recent[seq] = batch.ts
        if len(self._recent) > self._recent_limit:
            self._recent.popitem(last=False)
        pending: list[BlockOp] = []
        for ev in batch.events:
            if isinstance(ev, MalformedEvent):
                self._malformed(f"event in batch {seq}: {ev.error}")
                if not ev.may_remove:
                    self._stats.complete = False  # a lost store only under-predicts, until re-announced
                    continue
                await self._flush(pending)
                await self._purge(f"a malformed event in batch {seq} may have removed blocks")
                self._next = seq + 1
                continue
            if isinstance(ev, AllBlocksCleared):
                await self._flush(pending)
                await self._purge("AllBlocksCleared")
                self._next = seq + 1
                self._stats.complete = True  # the engine holds nothing from before this event either
                continue
            if isinstance(ev, BlockStored):
                if self.on_block_stored is not None:
                    self.on_block_stored(ev)
                if self.detect_reannounce and ev.parent_block_hash is None and ev.wire_block_hashes:
                    await self._flush(pending)
                    if await self._holds_chain(ev):
                        self._stats.reannounced += 1
                        self._m["reannounced"].inc()
                        continue
                self._stats.blocks_stored += len(ev.wire_block_hashes)
            else:
                self._stats.blocks_removed += len(getattr(ev, "wire_block_hashes", ()))
            pending.extend(to_block_ops(ev, self.group_idx))
        await self._flush(pending)
        self._stats.batches += 1
        self._stats.events += len(batch.events)
        self._stats.last_seq = seq
        self._stats.last_applied_monotonic = time.monotonic()
        self._m["batches"].inc()
        self._m["events"].inc(len(batch.events))
        self._last_seq.set(seq)

    async def _holds_chain(self, ev: BlockStored) -> bool:
        match = await self.index.lookup(self.group, ev.wire_block_hashes, [self.replica])
        m = match.get(self.replica)
        return m is not None and m.blocks == len(ev.wire_block_hashes)

    async def _flush(self, pending: list[BlockOp]) -> None:
        if pending:
            await self.index.apply(self.group, self.replica, list(pending))
            pending.clear()


# -- one replica: discovery and DP ranks ---------------------------------------------------------


class ReplicaSubscribers:
    """The subscribers of one replica (one per DP rank) and their exactness checker."""

    def __init__(self, subscribers: Iterable[KVEventSubscriber], checker: ExactnessChecker | None) -> None:
        self.subscribers = list(subscribers)
        self.checker = checker

    @property
    def complete(self) -> bool:
        """Every rank's stream followed whole (:attr:`SubscriberStats.complete`)."""
        return all(s.stats.complete for s in self.subscribers)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "complete": self.complete,
            "ranks": [
                {"replica": s.replica, "endpoint": s.endpoint, **asdict(s.stats)} for s in self.subscribers
            ]
        }
        if self.checker is not None:
            out["exactness"] = asdict(self.checker.stats)
        return out

    async def stop(self) -> None:
        for s in self.subscribers:
            await s.stop()


def rank_replica_id(replica: str, dp_rank: int) -> str:
    """Index id of a DP rank: rank 0 is the replica itself; other ranks hold their own caches
    behind the same API server, so they get their own ids (a router cannot pick a rank)."""
    return replica if dp_rank == 0 else f"{replica}#dp{dp_rank}"


async def start_replica_subscribers(
    *,
    group: str,
    replica: str,
    index: KVIndex,
    client: EngineClient | None = None,
    endpoint: str | None = None,
    replay_endpoint: str | None = None,
    topic: str | None = None,
    bind: bool = False,
    hasher_factory: HasherFactory | None = None,
    sample_every: int = 10,
    on_not_exact: Callable[[str], None] | None = None,
    replay_timeout_s: float = 5.0,
    on_purge: Callable[[], None] | None = None,
) -> ReplicaSubscribers:
    """Start the subscribers of one replica. With ``endpoint`` None the publishers are
    discovered from the engine's ``GET /kv_event_sources`` (one per DP rank).

    Raises :class:`LookupError` when the engine publishes no KV events.
    """
    checker = None
    if hasher_factory is not None and sample_every > 0:
        checker = ExactnessChecker(
            hasher_factory, sample_every=sample_every, group=group, replica=replica, on_mismatch=on_not_exact
        )
    sources: list[tuple[int, str, str | None, str]] = []
    if endpoint:
        sources.append((0, endpoint, replay_endpoint, topic or ""))
    else:
        if client is None:
            raise ValueError("either endpoint or client is needed")
        found = await client.kv_event_sources()
        if not found:
            raise LookupError(f"{client.base_url} publishes no KV events (start it with --kv-events-config)")
        for src in found:
            sources.append((
                src.dp_rank,
                connectable(src.endpoint, client.base_url),
                connectable(src.replay_endpoint, client.base_url) if src.replay_endpoint else None,
                src.topic if topic is None else topic,
            ))
    subs = []
    for rank, ep, rep, tp in sources:
        sub = KVEventSubscriber(
            group=group, replica=rank_replica_id(replica, rank), index=index, endpoint=ep,
            replay_endpoint=rep, topic=tp, bind=bind,
            on_block_stored=checker.observe if checker is not None else None, on_purge=on_purge,
            replay_timeout_s=replay_timeout_s,
        )
        sub.start()
        subs.append(sub)
    return ReplicaSubscribers(subs, checker)
