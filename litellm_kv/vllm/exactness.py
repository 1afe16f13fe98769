"""Continuous proof that our hashes are the engine's: recompute sampled ``BlockStored`` chains.

A ``BlockStored`` event carries the token ids of the blocks it announces and their hashes.
Recomputing those hashes with the :class:`~litellm_kv.vllm.hashing.BlockHasher` the router uses
(same algorithm, block size and seed) and comparing them is a direct test of every
assumption routing depends on. A mismatch means every prediction for this replica may be
wrong, so it flips the checker to "not exact", counts a metric and logs an error; it is
never silent.

Only events whose chain can be rebuilt are checked: the parent is None (a chain from the
root) or a hash this checker computed before; no LoRA (events omit the adapter path vLLM
hashes) and no multimodal/salt extra keys.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from litellm_kv.observability import counter, gauge
from litellm_kv.vllm.events import BlockStored
from litellm_kv.vllm.hashing import BlockHasher, hash_object

log = logging.getLogger("litellm_kv")

CHECKED = counter(
    "exactness_checked_blocks", "Blocks whose engine hash was recomputed from token ids and compared.",
    ["model_group", "replica"],
)
MISMATCHES = counter(
    "exactness_mismatches",
    "Blocks whose recomputed hash differed from the engine's: predictions for the replica are not exact.",
    ["model_group", "replica"],
)
EXACT = gauge(
    "replica_exact", "0 once an exactness check of the replica failed, else 1.", ["model_group", "replica"]
)

HasherFactory = Callable[[int], "BlockHasher | None"]


@dataclass(slots=True)
class ExactnessStats:
    exact: bool = True
    sampled_events: int = 0
    checked_blocks: int = 0
    mismatched_blocks: int = 0
    skipped_events: int = 0  # sampled but not rebuildable (unknown parent, LoRA, extra keys)
    last_mismatch: str = ""


class ExactnessChecker:
    """Checks 1 in ``sample_every`` ``BlockStored`` events of one replica (0 disables).

    ``hasher_factory(block_size)`` returns the hasher routing uses for that block size, or
    None when routing cannot be exact anyway (then nothing is checked).
    """

    def __init__(
        self,
        hasher_factory: HasherFactory,
        *,
        sample_every: int = 10,
        group: str = "",
        replica: str = "",
        on_mismatch: Callable[[str], None] | None = None,
        known_limit: int = 65536,
    ) -> None:
        if sample_every < 0:
            raise ValueError("sample_every must be >= 0")
        self.hasher_factory = hasher_factory
        self.sample_every = sample_every
        self.group = group
        self.replica = replica
        self.on_mismatch = on_mismatch
        self.stats = ExactnessStats()
        self._seen = 0
        # wire hash -> full digest of blocks this checker verified: lets a later event whose
        # parent is one of them be rebuilt too.
        self._known: OrderedDict[int, bytes] = OrderedDict()
        self._known_limit = known_limit
        EXACT.labels(group, replica).set(1)

    def observe(self, event: BlockStored) -> None:
        """Called for every BlockStored of the replica; checks the sampled ones."""
        if not self.sample_every:
            return
        self._seen += 1
        if self._seen % self.sample_every:
            return
        self.stats.sampled_events += 1
        try:
            self._check(event)
        except Exception as exc:  # a checker bug must not stop event ingestion
            self.stats.skipped_events += 1
            log.warning("litellm-kv: exactness check of %s skipped: %r", self.replica, exc)

    def _check(self, ev: BlockStored) -> None:
        n = len(ev.block_hashes)
        hasher = self.hasher_factory(ev.block_size) if n else None
        if (
            hasher is None
            or hasher.hash_block_size != ev.block_size
            or ev.lora_name is not None
            or (ev.extra_keys is not None and any(k is not None for k in ev.extra_keys))
            or len(ev.token_ids) != n * ev.block_size
        ):
            self.stats.skipped_events += 1
            return
        if ev.parent_block_hash is None:
            parent = hasher.none_hash
        else:
            known = self._known.get(ev.wire_parent_block_hash) if ev.wire_parent_block_hash is not None else None
            if known is None:
                self.stats.skipped_events += 1
                return
            parent = known
        bs = ev.block_size
        tokens = ev.token_ids
        for i in range(n):
            digest = hash_object(hasher.algo, (parent, tuple(tokens[i * bs : (i + 1) * bs]), None))
            sent = ev.block_hashes[i]
            ok = digest == sent if isinstance(sent, bytes) else BlockHasher.to_wire(digest) == ev.wire_block_hashes[i]
            self.stats.checked_blocks += 1
            CHECKED.labels(self.group, self.replica).inc()
            if not ok:
                self._mismatch(i, ev, digest)
                return
            self._remember(BlockHasher.to_wire(digest), digest)
            parent = digest

    def _remember(self, wire: int, digest: bytes) -> None:
        self._known[wire] = digest
        if len(self._known) > self._known_limit:
            self._known.popitem(last=False)

    def _mismatch(self, i: int, ev: BlockStored, digest: bytes) -> None:
        why = (
            f"block {i} of a BlockStored ({ev.block_size}-token blocks): engine hash "
            f"{ev.wire_block_hashes[i]:#018x}, recomputed {BlockHasher.to_wire(digest):#018x} "
            "(check hash algorithm, PYTHONHASHSEED/hash_seed and block size)"
        )
        self.stats.exact = False
        self.stats.mismatched_blocks += 1
        self.stats.last_mismatch = why
        MISMATCHES.labels(self.group, self.replica).inc()
        EXACT.labels(self.group, self.replica).set(0)
        log.error("litellm-kv: replica %s of %s is not exact: %s", self.replica, self.group, why)
        if self.on_mismatch is not None:
            self.on_mismatch(why)
