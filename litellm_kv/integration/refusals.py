"""The last requests litellm-kv refused, kept in this proxy process for the admin page.

A refusal's message names the limit, its value and where it was set (``key 'bot-a'``, ``team 'research'``,
``config model_groups.qwen``); the admin page (``/litellm-kv/ui``) lists a key's or a team's recent ones
beside its limits. The list is bounded (:data:`KEPT`, oldest dropped first) and per process: with several
workers each keeps the refusals it answered itself; ``litellm_kv_policy_rejections_total`` counts them all.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

#: Refusals kept per process (a few hundred short records: well under a megabyte).
KEPT = 500
#: Characters of a refusal's message kept (messages quote the offending value, cut to 200 characters).
MESSAGE_CHARS = 600


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refused request: when, whose key and team, which model name, which limit, the status and message."""

    at: float  # UNIX time
    key_hash: str | None
    key_label: str
    team_id: str | None
    team_label: str | None
    model: str
    limit: str
    status: int
    message: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class RecentRefusals:
    """The last :data:`KEPT` refusals, newest last; appending never blocks nor grows past the bound."""

    def __init__(self, kept: int = KEPT) -> None:
        self._items: deque[Refusal] = deque(maxlen=kept)

    def add(
        self, *, key_hash: str | None, key_label: str, team_id: str | None, team_label: str | None, model: str,
        limit: str, status: int, message: str, at: float | None = None,
    ) -> None:
        self._items.append(Refusal(
            at=time.time() if at is None else at, key_hash=key_hash, key_label=key_label, team_id=team_id,
            team_label=team_label, model=model[:200], limit=limit, status=status, message=message[:MESSAGE_CHARS],
        ))

    def __iter__(self) -> Iterator[Refusal]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def latest(self, *, key_hash: str | None = None, team_id: str | None = None, limit: int = 50) -> list[Refusal]:
        """Newest first: all, or those of one key (by its hash) or one team (any of its keys)."""
        out: list[Refusal] = []
        for r in reversed(self._items):
            if key_hash is not None and r.key_hash != key_hash:
                continue
            if team_id is not None and r.team_id != team_id:
                continue
            out.append(r)
            if len(out) >= limit:
                break
        return out
