"""The early encoder (``routing.early_tokens``) with the tiny model's real tokenizer: the ids a decision takes
from it are those the tokenizer gives inline, in every case (ready, waited for, never started, failed), and
its queue and table stay bounded."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from litellm_kv.routing import early_tokens
from litellm_kv.routing.early_tokens import MAX_QUEUED, EarlyTokens
from litellm_kv.vllm.tokenization import LocalChatTokenizer

WORDS = ("alpha", "beta", "gamma", "delta", "route", "cache", "token", "engine", "proxy", "block", "ünï", "中文")


def prompt(tok: LocalChatTokenizer, seed: int, words: int = 1500) -> str:
    rng = random.Random(seed)
    system = " ".join(rng.choice(WORDS) + str(rng.randint(0, 999)) for _ in range(words))
    return tok.render_chat([{"role": "system", "content": system}, {"role": "user", "content": f"question {seed}"}])


def longest(tok: LocalChatTokenizer, text: str) -> str:
    return max((p for p in tok.pieces(text) if isinstance(p, str)), key=len)


def segments(group: str, outcome: str) -> float:
    return early_tokens.EARLY_SEGMENTS.labels(group, outcome)._value.get()


class Gate:
    """Holds the worker thread inside each encode until released (so a test can see a segment queued or running)."""

    def __init__(self, tok: LocalChatTokenizer) -> None:
        self.tok = tok
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)

    def encode_segment(self, text: str) -> tuple[int, ...]:
        if not threading.current_thread().name.startswith("litellm-kv-tokenize"):
            return self.tok.encode_segment(text)  # the decision's own encode
        self.entered.set()
        assert self.release.wait(30)
        if self.fail:
            raise RuntimeError("worker failure")
        return self.tok.encode_segment(text)


@pytest.fixture
def tok(engine_model: Path) -> LocalChatTokenizer:
    return LocalChatTokenizer(engine_model)


@pytest.fixture
def reference(engine_model: Path) -> LocalChatTokenizer:
    return LocalChatTokenizer(engine_model)


def test_pieces_cut_at_added_tokens_and_encode_the_same(tok: LocalChatTokenizer) -> None:
    text = prompt(tok, 0, words=50)
    pieces = tok.pieces(text)
    assert any(isinstance(p, int) for p in pieces) and any(isinstance(p, str) for p in pieces)
    ids: list[int] = []
    for p in pieces:
        ids.extend([p] if isinstance(p, int) else tok.encode_segment(p))
    assert ids == tok.encode(text, memo=False)


def test_a_segment_encoded_early_gives_the_inline_ids_and_joins_the_memo(tok: LocalChatTokenizer,
                                                                         reference: LocalChatTokenizer) -> None:
    text = prompt(tok, 1)
    early = EarlyTokens("g-ready", tok, 4096)

    async def run() -> list[int]:
        assert early.start(text) == 1
        assert early.start(text) == 0  # already queued
        for _ in range(500):
            if all(f.done() for f in early._entries.values()):
                break
            await asyncio.sleep(0.01)
        return await early.encode(text)

    before = segments("g-ready", "ready")
    assert asyncio.run(run()) == reference.encode(text)
    assert segments("g-ready", "ready") == before + 1
    assert len(early) == 0 and tok.memo_has(longest(tok, text))
    assert early.start(text) == 0  # the memo has it now: nothing to encode early


def test_a_decision_waits_for_a_segment_the_worker_is_encoding(tok: LocalChatTokenizer,
                                                               reference: LocalChatTokenizer) -> None:
    gate = Gate(tok)
    text = prompt(tok, 2)
    early = EarlyTokens("g-wait", gate, 4096)  # type: ignore[arg-type]

    async def run() -> list[int]:
        early.start(text)
        assert await asyncio.to_thread(gate.entered.wait, 30)
        decision = asyncio.ensure_future(early.encode(text))
        await asyncio.sleep(0.05)
        assert not decision.done()  # waiting on the worker, the loop free
        gate.release.set()
        return await asyncio.wait_for(decision, 30)

    before = segments("g-wait", "waited")
    assert asyncio.run(run()) == reference.encode(text)
    assert segments("g-wait", "waited") == before + 1


def test_a_segment_the_worker_has_not_started_is_encoded_by_the_decision(tok: LocalChatTokenizer,
                                                                         reference: LocalChatTokenizer) -> None:
    gate = Gate(tok)
    blocker, text = prompt(tok, 3), prompt(tok, 4)
    early = EarlyTokens("g-unstarted", gate, 4096)  # type: ignore[arg-type]

    async def run() -> list[int]:
        early.start(blocker)
        assert await asyncio.to_thread(gate.entered.wait, 30)  # the worker is held inside the blocker
        early.start(text)  # queued behind it
        try:
            return await asyncio.wait_for(early.encode(text), 30)
        finally:
            gate.release.set()

    before = segments("g-unstarted", "unstarted")
    assert asyncio.run(run()) == reference.encode(text)
    assert segments("g-unstarted", "unstarted") == before + 1


def test_a_worker_failure_falls_back_to_encoding_in_the_decision(tok: LocalChatTokenizer,
                                                                 reference: LocalChatTokenizer) -> None:
    gate = Gate(tok)
    gate.fail = True
    text = prompt(tok, 5)
    early = EarlyTokens("g-failed", gate, 4096)  # type: ignore[arg-type]

    async def run() -> list[int]:
        early.start(text)
        assert await asyncio.to_thread(gate.entered.wait, 30)
        gate.release.set()
        return await early.encode(text)

    before = segments("g-failed", "failed")
    assert asyncio.run(run()) == reference.encode(text)
    assert segments("g-failed", "failed") == before + 1


def test_the_queue_and_the_table_are_bounded(tok: LocalChatTokenizer, reference: LocalChatTokenizer) -> None:
    gate = Gate(tok)
    texts = [prompt(tok, 10 + i, words=400) for i in range(MAX_QUEUED + 4)]
    early = EarlyTokens("g-bound", gate, 1024, max_entries=MAX_QUEUED + 2)  # type: ignore[arg-type]

    async def run() -> None:
        assert early.start(texts[0]) == 1
        assert await asyncio.to_thread(gate.entered.wait, 30)  # running: no longer queued
        started = [early.start(t) for t in texts[1:]]
        # MAX_QUEUED more wait for the worker; the rest are not queued at all.
        assert started == [1] * MAX_QUEUED + [0] * (len(texts) - 1 - MAX_QUEUED)
        assert early_tokens._queued == MAX_QUEUED
        gate.release.set()
        for t in texts:
            assert await early.encode(t) == reference.encode(t)
        assert len(early) == 0 and early_tokens._queued == 0

    asyncio.run(run())


def test_the_table_drops_its_oldest_entry_past_its_bound(tok: LocalChatTokenizer) -> None:
    texts = [prompt(tok, 30 + i, words=400) for i in range(3)]
    early = EarlyTokens("g-drop", tok, 1024, max_entries=2)

    async def run() -> None:
        before = segments("g-drop", "unused")
        for t in texts:
            early.start(t)
            await asyncio.sleep(0)
        assert len(early) == 2 and longest(tok, texts[0]) not in early._entries
        assert segments("g-drop", "unused") == before + 1
        early.clear()
        assert len(early) == 0

    asyncio.run(run())


def test_short_segments_are_left_to_the_decision(tok: LocalChatTokenizer) -> None:
    early = EarlyTokens("g-short", tok, 1 << 16)
    assert early.start(prompt(tok, 40)) == 0 and len(early) == 0


def test_a_prompt_long_enough_to_hold_the_loop_is_encoded_off_it_with_entries_pending(
        tok: LocalChatTokenizer, reference: LocalChatTokenizer) -> None:
    """With another request's segment in the table, a prompt past ``OFF_LOOP_CHARS`` still has its long segments
    encoded in a thread, as without the early encoder (``off_loop``); short ones stay on the loop."""
    threads: list[tuple[str, str]] = []

    class Recording(Gate):
        def encode_segment(self, text: str) -> tuple[int, ...]:
            threads.append((text, threading.current_thread().name))
            return self.tok.encode_segment(text)

    early = EarlyTokens("g-offloop", Recording(tok), 4096)  # type: ignore[arg-type]
    other, text = prompt(tok, 50), prompt(tok, 51)

    async def run() -> tuple[list[int], str]:
        early.start(other)
        threads.clear()
        return await early.encode(text, off_loop=True), threading.current_thread().name

    ids, loop_thread = asyncio.run(run())
    assert ids == reference.encode(text)
    mine = [(len(t), name) for t, name in threads if t in tok.pieces(text)]
    assert [name != loop_thread for n, name in mine if n >= 4096] == [True]
    assert all(name == loop_thread for n, name in mine if n < 4096), mine


def test_the_table_is_bounded_in_characters(tok: LocalChatTokenizer) -> None:
    texts = [prompt(tok, 60 + i, words=400) for i in range(4)]
    size = len(longest(tok, texts[0]))
    early = EarlyTokens("g-chars", tok, 1024, max_total_chars=int(2.5 * size))

    async def run() -> None:
        for t in texts:
            early.start(t)
            await asyncio.sleep(0)
        assert len(early) == 2 and early._chars == sum(len(p) for p in early._entries) <= 2.5 * size
        assert all(longest(tok, t) in early._entries for t in texts[2:])
        await early.encode(texts[3])
        assert len(early) == 1 and early._chars == len(longest(tok, texts[2]))

    asyncio.run(run())
