"""What the proxy decided for one call, kept in the proxy for the later hooks of that call.

A decision (the reasoning budget and the budgets to charge, the visual-token count, the response
headers) is taken in ``async_pre_call_hook`` and read again after the upstream call. It used to
travel in the request metadata, which the client writes too; here it stays in process memory,
keyed by LiteLLM's call id (``litellm_call_id``, the same in every hook of one call) and a token the
proxy gives the call (:func:`litellm_kv.integration.litellm_data.stamp_call`): the client may choose the
call id, so the id alone would let one call reach another's records. The table is bounded (oldest
first out) and each record expires, so a client that never finishes its calls cannot grow it. See
docs/security/failclosed.md.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Calls kept at most; past it the oldest record is dropped (its later hooks then charge nothing).
MAX_CALLS = 32768
#: A record outlives the longest call it must serve (a stream that thinks for hours).
TTL_S = 6 * 3600.0


@dataclass(slots=True)
class _Record:
    created: float
    values: dict[str, Any] = field(default_factory=dict)


class CallRecords:
    """Per-call values by name (``"reasoning"``, ``"vision"``, ``"headers"``), bounded and expiring."""

    def __init__(self, *, max_calls: int = MAX_CALLS, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_calls
        self._ttl = ttl_s
        self._clock = clock
        # Insertion order is creation order: the front is always the oldest record.
        self._calls: OrderedDict[str, _Record] = OrderedDict()

    def __len__(self) -> int:
        return len(self._calls)

    def _expire(self, now: float) -> None:
        while self._calls:
            oldest = next(iter(self._calls.values()))
            if len(self._calls) <= self._max and now - oldest.created < self._ttl:
                return
            self._calls.popitem(last=False)

    def put(self, key: str, name: str, value: Any) -> None:
        """Keep ``value`` under ``name`` for the call ``key`` (replacing an earlier value of that name)."""
        now = self._clock()
        record = self._calls.get(key)
        if record is None or now - record.created >= self._ttl:
            self._calls.pop(key, None)
            record = self._calls[key] = _Record(now)
        record.values[name] = value
        self._expire(now)

    def get(self, key: str | None, name: str) -> Any | None:
        """The value kept under ``name`` for the call ``key``; ``None`` when there is none (or it expired)."""
        if not key:
            return None
        record = self._calls.get(key)
        if record is None:
            return None
        if self._clock() - record.created >= self._ttl:
            self._calls.pop(key, None)
            return None
        return record.values.get(name)

    def forget(self, key: str | None) -> None:
        """Drop the records of a call that is over."""
        if key:
            self._calls.pop(key, None)
