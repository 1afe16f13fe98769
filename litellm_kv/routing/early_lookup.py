"""A prompt's index round trip started before LiteLLM's authentication and hooks (shared mode).

In shared mode a decision waits mostly on one round trip to Redis: the index lookup, with the other proxies' load
riding along. On a busy machine that round trip's tail is the decision's p99 (docs/performance.md). It needs
nothing but the prompt's block hashes, and those are known as soon as the prompt's tokens are. So when a chat
body arrives (:mod:`litellm_kv.integration.early_tokenize`), the group starts one task that takes the prompt's
tokens as the decision would (its early-encoded segments included), hashes them and makes the round trip, while
LiteLLM authenticates the request and runs its hooks (:meth:`litellm_kv.routing.group.KVGroup.tokenize_early`).

The decision takes from that task:

* the token ids, when it renders the very same text (encoding a text gives the same ids wherever it runs);
* the index's matches and the raw load reply, when its own hashing inputs are the same (the same ids, adapter,
  cache salt and hasher, no media) and the answer is at most ``kv.early_lookup_max_age_ms`` old. The load reply
  is merged with this proxy's own counts at the decision, and the sibling predictions are read there too, so
  what this proxy itself sent meanwhile is counted as always. What can be older is what other processes wrote:
  engines' KV events applied by the indexer, and other proxies' published load, by at most that age.

Anything else (another text, other inputs, an answer too old, a failed round trip) and the decision does its own
lookup, as without this. A request that never reaches the decision leaves an entry that newer ones push out.

Bounds: per group at most :data:`MAX_RUNNING` tasks at once (past that, none is started), and :data:`MAX_ENTRIES`
answers of :data:`MAX_TOTAL_CHARS` characters of text in all held. The task runs before authentication, so any
caller that sends a key header can start one: what it costs is the encode the early tokenizer would do anyway, a
hash of the prompt and one read-only script on Redis, through the same guard (deadline, circuit breaker) as the
decision's own.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from litellm_kv.index.base import ReplicaMatch
from litellm_kv.observability import counter
from litellm_kv.vllm.hashing import BlockHasher

#: Early lookups running at once in one group, past which no more is started.
MAX_RUNNING = 4
#: Answers held per group, the oldest dropped first.
MAX_ENTRIES = 16
#: Characters of rendered prompt text held per group (each answer holds its text and its ids), the oldest dropped
#: first; a longer text is not looked up early.
MAX_TOTAL_CHARS = 1 << 21

EARLY_LOOKUPS = counter(
    "early_lookups",
    "Index round trips started before the routing hook (shared mode, kv.early_lookup_max_age_ms), by model group "
    "and what became of them: 'used' (the decision took the answer), 'tokens_only' (the decision took the tokens "
    "and looked up itself: other hashing inputs, or no round trip was made), 'stale' (older than the max age: "
    "looked up again), 'failed' (the round trip failed: looked up again), 'unused' (dropped before any decision "
    "rendered its text), 'skipped' (not started: too many running, or a text longer than the table holds).",
    ["model_group", "outcome"],
)


@dataclass(slots=True)
class EarlyAnswer:
    """What an early task found: the ids of its text, and, when it could hash them, its round trip's answer."""

    ids: list[int]
    hasher: BlockHasher | None = None
    lora: tuple[str, str] | None = None
    cache_salt: str | None = None
    hashes: list[int] | None = None
    matches: Mapping[str, ReplicaMatch] | None = None
    load_reply: Any = None  # the load rider's raw reply, merged with this proxy's own counts at the decision
    at: float = 0.0  # time.monotonic() when the round trip returned
    failed: bool = False  # the round trip was tried and failed

    def answers(self, ids: Sequence[int], hasher: BlockHasher, lora: tuple[str, str] | None, cache_salt: str | None,
                has_media: bool, max_age_s: float, group: str) -> bool:
        """Whether the decision for these hashing inputs may take :attr:`matches` and :attr:`hashes`; counts the
        outcome."""
        if self.failed:
            outcome = "failed"
        elif (self.hashes is None or self.matches is None or has_media or hasher is not self.hasher or lora != self.lora
              or cache_salt != self.cache_salt or (ids is not self.ids and list(ids) != self.ids)):
            outcome = "tokens_only"
        elif time.monotonic() - self.at > max_age_s:
            outcome = "stale"
        else:
            outcome = "used"
        EARLY_LOOKUPS.labels(group, outcome).inc()
        return outcome == "used"


class EarlyLookups:
    """One group's early tasks, by the rendered text they work on (see the module's docstring). Every method runs
    on the event loop's thread."""

    def __init__(self, group: str, max_age_s: float) -> None:
        self.group = group
        self.max_age_s = max_age_s
        self._entries: OrderedDict[str, asyncio.Task[EarlyAnswer | None]] = OrderedDict()
        self._chars = 0  # characters of the texts held
        # Every task not done yet, held or dropped: a dropped one is left to finish (its round trip is bounded by
        # the Redis guard; cancelling it mid-command would cost the connection), and counts against MAX_RUNNING.
        self._running: set[asyncio.Task[EarlyAnswer | None]] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def start(self, text: str, work: Callable[[], Coroutine[Any, Any, EarlyAnswer | None]]) -> bool:
        """Start ``work`` for ``text`` unless one is held for it or too many run; whether one was started."""
        if text in self._entries:
            return False
        if len(self._running) >= MAX_RUNNING or len(text) > MAX_TOTAL_CHARS:
            EARLY_LOOKUPS.labels(self.group, "skipped").inc()
            return False
        task = asyncio.get_running_loop().create_task(work())
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        self._entries[text] = task
        self._chars += len(text)
        while len(self._entries) > MAX_ENTRIES or self._chars > MAX_TOTAL_CHARS:
            self._drop()
        return True

    def take(self, text: str) -> asyncio.Task[EarlyAnswer | None] | None:
        """The task started for ``text``, removed from the table; None when there is none."""
        task = self._entries.pop(text, None)
        if task is not None:
            self._chars -= len(text)
        return task

    def _drop(self) -> None:
        text, _ = self._entries.popitem(last=False)
        self._chars -= len(text)
        EARLY_LOOKUPS.labels(self.group, "unused").inc()

    def clear(self) -> None:
        while self._entries:
            self._drop()
