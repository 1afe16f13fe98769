"""Token budgets per period (day, week, month) per key and per team, in memory or in Redis.

A budget is identified by a *scope* (``"key:<hash>"``, ``"team:<id>"``), a *meter*
(``"reasoning_tokens"``, ``"visual_tokens"``) and a :class:`Period`. Periods are calendar windows
in UTC: a day starts at 00:00 UTC, a week on Monday 00:00 UTC, a month on the 1st at 00:00 UTC.
Usage resets when the window ends (``reset_at``); each window is a separate counter, so there
is no reset job.

Two backends share the :class:`PeriodBudgets` protocol:

* :class:`MemoryPeriodBudgets`: per process (``mode: embedded`` with one proxy worker).
* :class:`RedisPeriodBudgets`: shared by every proxy and worker. Keys look like
  ``litellm_kv:budget:{key:ab12}:reasoning_tokens:day:20250101``: the ``{...}`` hash tag keeps all
  counters of one scope in one Redis Cluster slot. Charges are ``INCRBY`` + ``EXPIREAT`` in one
  ``MULTI`` transaction, so concurrent proxies never lose an update; counters expire a day after
  their window ends.

When Redis cannot be reached, ``fail_open=True`` (the default) lets the request through as if
nothing had been used, logs a warning and counts ``litellm_kv_budget_store_errors_total``;
``fail_open=False`` raises :class:`BudgetStoreError` so the caller can reject (the reasoning
handler turns that into HTTP 503).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any, Protocol

from litellm_kv.errors import LiteLLMKVError
from litellm_kv.observability import counter

log = logging.getLogger("litellm_kv.governance.budgets")

STORE_ERRORS = counter(
    "budget_store_errors",
    "Period-budget store (Redis) failures, by operation and outcome.",
    ["op", "outcome"],
)

#: Counters outlive their window by this much (late charges of long streams still land).
EXPIRY_GRACE = timedelta(days=1)


class BudgetStoreError(LiteLLMKVError):
    """The budget store could not be read or written and the store is configured to fail closed."""


class Period(str, Enum):
    """A calendar window in UTC."""

    DAY = "day"
    WEEK = "week"
    MONTH = "month"

    def window(self, now: datetime) -> tuple[datetime, datetime]:
        """``(start, reset_at)`` of the window holding ``now`` (any timezone; computed in UTC)."""
        now = now.astimezone(timezone.utc)
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        if self is Period.DAY:
            return day, day + timedelta(days=1)
        if self is Period.WEEK:
            start = day - timedelta(days=day.weekday())
            return start, start + timedelta(days=7)
        start = day.replace(day=1)
        nxt = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(
            month=start.month + 1
        )
        return start, nxt

    def window_id(self, now: datetime) -> str:
        """A stable name of the window holding ``now`` (its UTC start date, ``YYYYMMDD``)."""
        return self.window(now)[0].strftime("%Y%m%d")


@dataclass(frozen=True, slots=True)
class BudgetState:
    """Usage of one budget in the current window."""

    used: int
    limit: int
    reset_at: datetime

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def retry_after_seconds(self, now: datetime) -> int:
        """Whole seconds until the window resets (at least 1): the ``Retry-After`` value."""
        return max(1, int((self.reset_at - now.astimezone(timezone.utc)).total_seconds() + 0.999))


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class PeriodBudgets(Protocol):
    """Where period usage is kept. All methods are coroutines; ``now`` defaults to the clock."""

    async def check(
        self, scope: str, meter: str, period: Period, limit: int, now: datetime | None = None
    ) -> BudgetState:
        """Usage of ``scope``/``meter`` in the current ``period`` window, against ``limit``."""
        ...

    async def charge(
        self, scope: str, meter: str, period: Period, amount: int, now: datetime | None = None
    ) -> int:
        """Add ``amount`` (may be negative: a refund) to the current window; returns the new total."""
        ...

    async def close(self) -> None: ...


class MemoryPeriodBudgets:
    """Budgets in this process's memory (lost at restart; not shared between workers)."""

    def __init__(self, clock: Callable[[], datetime] = utc_now) -> None:
        self._clock = clock
        self._used: dict[tuple[str, str, str, str], int] = {}
        self._ends: dict[tuple[str, str, str, str], datetime] = {}

    def _key(self, scope: str, meter: str, period: Period, now: datetime) -> tuple[str, str, str, str]:
        return (scope, meter, period.value, period.window_id(now))

    async def check(
        self, scope: str, meter: str, period: Period, limit: int, now: datetime | None = None
    ) -> BudgetState:
        now = now or self._clock()
        used = self._used.get(self._key(scope, meter, period, now), 0)
        return BudgetState(used, limit, period.window(now)[1])

    async def charge(
        self, scope: str, meter: str, period: Period, amount: int, now: datetime | None = None
    ) -> int:
        now = now or self._clock()
        key = self._key(scope, meter, period, now)
        self._used[key] = self._used.get(key, 0) + amount
        self._ends[key] = period.window(now)[1]
        self._forget_old(now)
        return self._used[key]

    def _forget_old(self, now: datetime) -> None:
        # Bounded memory: drop windows that ended more than the grace period ago.
        if len(self._ends) < 4096:
            return
        for key, end in list(self._ends.items()):
            if end + EXPIRY_GRACE < now:
                self._ends.pop(key, None)
                self._used.pop(key, None)

    async def close(self) -> None:
        return None


class RedisPeriodBudgets:
    """Budgets in Redis, shared by every proxy process (see the module docstring for key layout)."""

    def __init__(
        self,
        redis_url: str,
        *,
        prefix: str = "litellm_kv",
        fail_open: bool = True,
        timeout_s: float | None = None,
        clock: Callable[[], datetime] = utc_now,
        client: Any = None,
    ) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.fail_open = fail_open
        self._clock = clock
        if client is None:
            from litellm_kv.redis_client import RedisUse, connect

            client = connect(redis_url, RedisUse.BUDGETS, timeout_s=timeout_s)
        self._redis = client

    def key(self, scope: str, meter: str, period: Period, now: datetime) -> str:
        """The Redis key of one counter (``{scope}`` is the Redis Cluster hash tag)."""
        return f"{self.prefix}:budget:{{{scope}}}:{meter}:{period.value}:{period.window_id(now)}"

    def _failed(self, op: str, exc: Exception) -> None:
        outcome = "fail_open" if self.fail_open else "fail_closed"
        STORE_ERRORS.labels(op, outcome).inc()
        log.warning("litellm-kv: budget store %s failed (%s): %s", op, outcome, exc)
        if not self.fail_open:
            raise BudgetStoreError(f"period budget store unavailable: {exc}") from exc

    async def check(
        self, scope: str, meter: str, period: Period, limit: int, now: datetime | None = None
    ) -> BudgetState:
        now = now or self._clock()
        reset_at = period.window(now)[1]
        try:
            raw = await self._redis.get(self.key(scope, meter, period, now))
        except Exception as exc:  # connection, timeout and protocol errors alike
            self._failed("check", exc)
            return BudgetState(0, limit, reset_at)
        return BudgetState(int(raw or 0), limit, reset_at)

    async def charge(
        self, scope: str, meter: str, period: Period, amount: int, now: datetime | None = None
    ) -> int:
        now = now or self._clock()
        key = self.key(scope, meter, period, now)
        expire_at = int((period.window(now)[1] + EXPIRY_GRACE).timestamp())
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.incrby(key, amount)
                pipe.expireat(key, expire_at)
                total, _ = await pipe.execute()
        except Exception as exc:
            self._failed("charge", exc)
            return 0
        return int(total)

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken connection is best effort
            await self._redis.aclose()


def make_period_budgets(redis_url: str | None, *, fail_open: bool = True) -> PeriodBudgets:
    """Redis-backed budgets when a URL is configured (shared mode), otherwise in-process ones."""
    if redis_url:
        return RedisPeriodBudgets(redis_url, fail_open=fail_open)
    return MemoryPeriodBudgets()
