"""Prompt segments encoded early, in a worker thread, while LiteLLM authenticates and prepares the request.

A never-seen long prompt's routing decision spends most of its time encoding (docs/performance.md), and that
work needs nothing but the prompt's text. LiteLLM takes milliseconds between a request's arrival and the
routing hook (authentication, its own hooks, building the call). So as soon as a chat body arrives
(:mod:`litellm_kv.integration.early_tokenize`), the group renders its prompt and hands each long segment the
tokenizer's memo lacks to one worker thread; tiktoken's core lets the event loop run meanwhile. When the
decision comes, each segment's ids are taken from there, waited for if the thread is still at them, or encoded
as before if it has not started on them (it then never will).

Nothing from the early pass is trusted beyond its text: ids are looked up by the exact segment text the
decision itself rendered, and encoding a text gives the same ids in any thread. A request whose prompt the
hooks change, or which never reaches the decision, only leaves an entry that ages out.

Bounds: one worker thread for the whole process; at most :data:`MAX_QUEUED` segments waiting for it (past
that nothing more is queued); per group, at most ``max_entries`` segments of ``max_total_chars`` characters in
all held between their encode and their decision (the oldest dropped first), none longer than ``max_chars``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import OrderedDict
from typing import Protocol

from litellm_kv.observability import counter

#: Segments waiting for the worker thread, all groups together, beyond which no more are queued.
MAX_QUEUED = 4

EARLY_SEGMENTS = counter(
    "early_tokenize_segments",
    "Prompt segments encoded early (before the routing hook), by model group and what the decision found: "
    "'ready' (encoded in time), 'waited' (the decision waited for the worker), 'unstarted' (encoded by the "
    "decision itself: the worker had not started it), 'failed' (the worker raised; encoded again by the "
    "decision), 'unused' (dropped before any decision asked for it).",
    ["model_group", "outcome"],
)
EARLY_SKIPPED = counter(
    "early_tokenize_skipped",
    "Prompt segments not encoded early because the worker's queue was full, by model group.",
    ["model_group"],
)


class SegmentTokenizer(Protocol):
    def pieces(self, text: str) -> list[str | int]: ...

    def encode_segment(self, text: str) -> tuple[int, ...]: ...

    def memo_get(self, text: str) -> tuple[int, ...] | None: ...

    def memo_has(self, text: str) -> bool: ...

    def remember(self, text: str, ids: tuple[int, ...]) -> None: ...

    def encode(self, text: str, memo: bool = True) -> list[int]: ...


_worker: concurrent.futures.ThreadPoolExecutor | None = None
_worker_lock = threading.Lock()
_queued = 0  # submitted and not yet started, all groups (under _worker_lock)


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="litellm-kv-tokenize")
        return _worker


class EarlyTokens:
    """One group's segments encoded ahead of their routing decision (see the module's docstring). Every method
    runs on the event loop's thread; only ``_run`` (:meth:`SegmentTokenizer.encode_segment`) in the worker."""

    def __init__(self, group: str, tokenizer: SegmentTokenizer, min_chars: int, max_entries: int = 16,
                 max_chars: int = 1 << 18, max_total_chars: int = 1 << 20) -> None:
        self.group = group
        self.tokenizer = tokenizer
        self.min_chars = min_chars
        self.max_entries = max_entries
        self.max_chars = max_chars
        self.max_total_chars = max_total_chars
        self._entries: OrderedDict[str, concurrent.futures.Future[tuple[int, ...]]] = OrderedDict()
        self._chars = 0  # characters of the segments held

    def __len__(self) -> int:
        return len(self._entries)

    def start(self, text: str) -> int:
        """Queue the long segments of a rendered prompt that neither the memo nor this table holds; the number
        queued."""
        started = 0
        for piece in self.tokenizer.pieces(text):
            if (isinstance(piece, int) or not self.min_chars <= len(piece) <= self.max_chars
                    or piece in self._entries or self.tokenizer.memo_has(piece)):
                continue
            if not _queue_one():
                EARLY_SKIPPED.labels(self.group).inc()
                continue
            fut = _executor().submit(self._run, piece)
            self._entries[piece] = fut
            self._chars += len(piece)
            started += 1
            while len(self._entries) > self.max_entries or self._chars > self.max_total_chars:
                self._drop(*self._entries.popitem(last=False))
        return started

    def _run(self, piece: str) -> tuple[int, ...]:
        _started()  # the worker thread has it: no longer queued
        return self.tokenizer.encode_segment(piece)

    def _drop(self, piece: str, fut: concurrent.futures.Future[tuple[int, ...]]) -> None:
        self._chars -= len(piece)
        if fut.cancel():
            _started()
        EARLY_SEGMENTS.labels(self.group, "unused").inc()

    async def encode(self, text: str, off_loop: bool = False) -> list[int]:
        """Token ids of a rendered prompt, as ``tokenizer.encode(text)`` gives them, taking each segment
        encoded early from this table (and putting it in the memo). ``off_loop``: a prompt long enough to hold
        the event loop, whose other long segments are encoded in a worker thread too."""
        if not self._entries and not off_loop:
            return self.tokenizer.encode(text)
        out: list[int] = []
        for piece in self.tokenizer.pieces(text):
            if isinstance(piece, int):
                out.append(piece)
                continue
            fut = self._entries.pop(piece, None)
            if fut is not None:
                self._chars -= len(piece)
            ids = await self._take(fut) if fut is not None else None
            if ids is None:
                ids = self.tokenizer.memo_get(piece)
            if ids is None:
                ids = (await asyncio.to_thread(self.tokenizer.encode_segment, piece)
                       if off_loop and len(piece) >= self.min_chars else self.tokenizer.encode_segment(piece))
            self.tokenizer.remember(piece, ids)
            out.extend(ids)
        return out

    async def _take(self, fut: concurrent.futures.Future[tuple[int, ...]]) -> tuple[int, ...] | None:
        if fut.cancel():  # the worker never started it: encoding it here costs no more than waiting for it
            _started()
            EARLY_SEGMENTS.labels(self.group, "unstarted").inc()
            return None
        outcome = "ready" if fut.done() else "waited"
        try:
            ids = fut.result() if fut.done() else await asyncio.wrap_future(fut)
        except Exception:
            EARLY_SEGMENTS.labels(self.group, "failed").inc()
            return None
        EARLY_SEGMENTS.labels(self.group, outcome).inc()
        return ids

    def clear(self) -> None:
        while self._entries:
            self._drop(*self._entries.popitem(last=False))


def _queue_one() -> bool:
    global _queued
    with _worker_lock:
        if _queued >= MAX_QUEUED:
            return False
        _queued += 1
        return True


def _started() -> None:
    """One queued segment left the queue: the worker started it, or it was cancelled before it could."""
    global _queued
    with _worker_lock:
        _queued -= 1
