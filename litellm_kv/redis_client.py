"""The one place litellm-kv builds a Redis client: every store that keeps state in Redis (the KV index,
router load, period budgets, affinity pins) asks :func:`connect` for its client.

Each use has its own timeout because each fails differently: the index and load sit on the routing path
but fall back to load-only routing on error, budgets decide whether a request may run, and pins only
steer a provider's prompt cache. Keeping the table here means a change of timeout or retry policy is one
edit, and a reader sees every client litellm-kv opens.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

import redis.asyncio as aioredis


class RedisUse(str, Enum):
    """What a client is for; it picks the socket timeout from :data:`TIMEOUTS_S`."""

    INDEX = "index"
    LOAD = "load"
    BUDGETS = "budgets"
    PINS = "pins"


TIMEOUTS_S: Final[dict[RedisUse, float]] = {
    RedisUse.INDEX: 5.0,
    RedisUse.LOAD: 5.0,
    RedisUse.BUDGETS: 0.5,
    RedisUse.PINS: 0.25,
}


def connect(url: str, use: RedisUse, *, timeout_s: float | None = None) -> aioredis.Redis:
    """A client for ``url`` (``redis://`` or ``rediss://`` for TLS; password and database from the URL).

    ``timeout_s`` overrides the use's default socket and connect timeout (a store's own setting).
    No connection is opened until the first command.
    """
    t = TIMEOUTS_S[use] if timeout_s is None else timeout_s
    return aioredis.Redis.from_url(url, socket_timeout=t, socket_connect_timeout=t)
