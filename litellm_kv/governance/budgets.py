"""Token budgets per period (day, week, month) per key and per team, in memory or in Redis.

A budget is identified by a *scope* (``"key:<hash>"``, ``"team:<id>"``), a *meter*
(``"reasoning_tokens"``, ``"visual_tokens"``) and a :class:`Period`. Periods are calendar windows
in UTC: a day starts at 00:00 UTC, a week on Monday 00:00 UTC, a month on the 1st at 00:00 UTC.
Usage resets when the window ends (``reset_at``); each window is a separate counter, so there
is no reset job.

A request's maximum is **reserved** before the call (:meth:`PeriodBudgets.reserve`: a *hold*,
granted only out of what neither usage nor other holds take) and **settled** after it
(:meth:`PeriodBudgets.settle`: the hold is replaced by the amount really used) or **released** on
failure (:meth:`PeriodBudgets.release`). Holds expire ``hold_ttl_s`` after they were taken, so a
proxy that dies mid-call gives its holds back. Concurrent requests therefore cannot all be granted
the same remainder: a window is overspent only by what requests use beyond what they held.

Two backends share the :class:`PeriodBudgets` protocol (one contract suite runs on both:
``tests/governance/test_budgets.py``), and a third refuses every call:

* :class:`MemoryPeriodBudgets`: per process (``mode: embedded`` with one proxy worker). Each
  operation runs without an ``await`` inside, so it is atomic on the event loop without a lock.
* :class:`RedisPeriodBudgets`: shared by every proxy and worker. Keys look like
  ``litellm_kv:budget:{key:ab12}:reasoning_tokens:day:20250101`` (usage), with ``…:holds`` (hold id
  → amount) and ``…:hold_until`` (hold id → expiry) beside it: the ``{...}`` hash tag keeps all
  keys of one scope in one Redis Cluster slot. Every operation is one Lua script (:data:`_SCRIPT`),
  so concurrent proxies never lose an update nor grant the same tokens twice; keys expire a day
  after their window ends. The scope's epoch (``litellm_kv:budget:{key:ab12}:epoch``) tells a counter the
  Redis lost (a restart without persistence, an eviction) from one lowered by hand: a lost one is raised
  back to the usage this proxy last saw before anything is granted from it.
* :class:`UnsharedPeriodBudgets`: a proxy served by several worker processes without a Redis, where each
  worker's memory would grant the whole budget. Every call raises :class:`BudgetStoreUnfit`, so requests
  that need a period budget are refused (fail closed, whatever ``on_store_error`` says).

The Redis store refuses the same way (checks and reservations; settling goes on) once its Redis may delete
budget counters when full and has deleted keys (``unfit``, :mod:`litellm_kv.redis_eviction`).

Every Redis call has a deadline (``BudgetSettings.deadline_ms``) and goes through a circuit breaker
(the :class:`~litellm_kv.redis_client.RedisGuard` every request-path store uses): after
``breaker_failures`` consecutive failures calls fail at once, without waiting on Redis, for
``breaker_open_s``; then one call probes it. When Redis fails, misses the
deadline or the breaker is open, ``fail_open=True`` (the default, ``on_store_error: fail_open``) lets
the request through without the store (the result says ``metered=False``), logs a warning and counts
``litellm_kv_budget_store_errors_total``. It is still granted only what this process knows to be left
(:class:`LocalView`): the usage the store last reported for that budget, less the holds this
process's own requests have in flight (those it took before Redis failed, and those it granted while
failing open), so a budget it saw spent is not handed out again because Redis stopped answering;
``fail_open=False`` raises
:class:`BudgetStoreError` so the caller can reject (the reasoning and vision handlers turn that into
HTTP 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any, Protocol

from litellm_kv.config import BudgetSettings
from litellm_kv.errors import LiteLLMKVError
from litellm_kv.observability import counter
from litellm_kv.redis_client import (
    GuardSettings,
    RedisDeadlineExceeded,
    RedisGuard,
    RedisLoop,
    RedisSkipped,
    RedisTarget,
    RedisUse,
    guarded,
)
from litellm_kv.tasks import spawn_held

log = logging.getLogger("litellm_kv.governance.budgets")

STORE_ERRORS = counter(
    "budget_store_errors",
    "Period-budget store (Redis) failures, by operation and outcome.",
    ["op", "outcome"],
)

#: Counters outlive their window by this much (late charges of long streams still land).
EXPIRY_GRACE = timedelta(days=1)
#: A scope's epoch key lives this long after its last use: longer than any counter of the scope (a month and
#: the grace), so it is there for as long as a counter it vouches for.
EPOCH_TTL_S = 40 * 86400
#: At most one warning per this many seconds about counters raised back after the Redis lost them.
RESTORE_LOG_EVERY_S = 60.0

RESTORED = counter(
    "budget_usage_restored",
    "Tokens of period-budget usage raised back into counters the Redis had lost (a restart without persistence, "
    "keys deleted when full), from the usage this proxy last saw.",
)


def _epoch_key(counter_key: str) -> str:
    """The epoch key of a counter's scope: the counter key up to its hash tag (same Redis Cluster slot), then
    ``:epoch``."""
    return counter_key[: counter_key.index("}", counter_key.index("{")) + 1] + ":epoch"

#: How much longer than the deadline the proxy waits for the budget thread before giving a call up (only
#: a thread that is stuck, not a slow Redis, takes that long: the deadline ends every call in the thread).
LOOP_BACKSTOP_S = 2.0

#: Connections the Redis store opens at start-up (:meth:`RedisPeriodBudgets.warm`): a burst of up to this
#: many concurrent budget calls finds them open.
WARM_CONNECTIONS = 32

#: How long a hold lives when the store is not told otherwise (``BudgetSettings.hold_ttl_s``).
DEFAULT_HOLD_TTL_S = BudgetSettings().hold_ttl_s


class BudgetStoreError(LiteLLMKVError):
    """The budget store could not be read or written and the store is configured to fail closed."""


class BudgetStoreUnfit(BudgetStoreError):
    """Period budgets cannot be enforced by this configuration (not an outage: asking again will not help):
    several workers with nothing to share them through, or a Redis that deletes them when full."""


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
    """Usage of one budget in the current window: ``used`` (settled) and ``held`` (reserved by calls
    in flight). ``metered`` is False when the store could not be asked and failed open."""

    used: int
    limit: int
    reset_at: datetime
    held: int = 0
    metered: bool = True

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used - self.held)

    @property
    def exhausted(self) -> bool:
        return self.used + self.held >= self.limit

    def retry_after_seconds(self, now: datetime) -> int:
        """Whole seconds until the window resets (at least 1): the ``Retry-After`` value."""
        return max(1, int((self.reset_at - now.astimezone(timezone.utc)).total_seconds() + 0.999))


@dataclass(frozen=True, slots=True)
class Hold:
    """The answer to a reservation: ``granted`` tokens are held (0: none could be), and the budget's
    state as the reservation found it (before this hold)."""

    granted: int
    state: BudgetState

    @property
    def metered(self) -> bool:
        return self.state.metered


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class PeriodBudgets(Protocol):
    """Where period usage and holds are kept. All methods are coroutines; ``now`` defaults to the clock.

    ``hold`` is the caller's id of one reservation (unique per request and budget); settling or
    releasing must pass the ``now`` of the reservation, so it lands in the window it was taken from.
    """

    async def check(
        self, scope: str, meter: str, period: Period, limit: int, now: datetime | None = None
    ) -> BudgetState:
        """Usage and live holds of ``scope``/``meter`` in the current ``period`` window, against ``limit``."""
        ...

    async def charge(
        self, scope: str, meter: str, period: Period, amount: int, now: datetime | None = None
    ) -> int:
        """Add ``amount`` (may be negative: a refund) to the current window; returns the new total."""
        ...

    async def reserve(
        self, scope: str, meter: str, period: Period, limit: int, amount: int | None, hold: str,
        now: datetime | None = None,
    ) -> Hold:
        """Hold ``min(amount, what is left)`` (``amount=None``: all that is left) atomically.

        What is left is ``limit - used - live holds``; a hold of the same id is replaced, not added to
        (so reserving again with a smaller amount shrinks it). Nothing is held when nothing is left.
        """
        ...

    async def settle(
        self, scope: str, meter: str, period: Period, hold: str, amount: int, now: datetime | None = None
    ) -> int:
        """Drop ``hold`` and add ``amount`` to usage, atomically; returns the new usage (an expired or
        unknown hold still charges ``amount``)."""
        ...

    async def release(self, scope: str, meter: str, period: Period, hold: str, now: datetime | None = None) -> None:
        """Drop ``hold`` without charging anything (the call failed or never ran)."""
        ...

    def fail_open_hold(
        self, scope: str, meter: str, period: Period, limit: int, amount: int | None, hold: str, now: datetime
    ) -> Hold:
        """What a reservation gets without asking the store (``metered=False``), after the store failed
        open for an earlier budget of the same request: what this process knows to be left, held
        locally until settled or released. ``amount=0`` holds nothing: the answer's state alone."""
        ...

    async def close(self) -> None: ...


def unmetered(period: Period, limit: int, amount: int | None, now: datetime) -> Hold:
    """What failing open answers: a hold of the ask (at most the whole limit) as if nothing were used,
    marked ``metered=False`` (nothing is held anywhere)."""
    return Hold(_grant(limit, 0, 0, amount), BudgetState(0, limit, period.window(now)[1], metered=False))


def _drop_expired(holds: dict[str, Any], ts: float) -> None:
    """Remove the holds whose expiry (the second item of each value, a UNIX time) is before ``ts``."""
    for hid in [h for h, v in holds.items() if v[1] < ts]:
        del holds[hid]


def _grant(limit: int, used: int, held: int, amount: int | None) -> int:
    """What a reservation gets: the ask, at most what neither usage nor other holds take (the same
    rule as the reserve branch of :data:`_SCRIPT`)."""
    left = max(0, limit - used - held)
    return left if amount is None else max(0, min(amount, left))


#: What a refusal adds when the state it gives came from a :class:`LocalView` (the store failed open).
FAIL_OPEN_NOTE = ("as this proxy last saw it: the budget store is not answering, and on_store_error: fail_open "
                  "serves only what is known to be left")

#: Budgets (scope, meter, window) a :class:`LocalView` remembers; the oldest are forgotten beyond it.
LOCAL_VIEW_BUDGETS = 16384
#: Holds of one budget beyond which a :class:`LocalView` drops the expired ones before taking another.
LOCAL_VIEW_HOLDS = 1024


@dataclass(slots=True)
class _Known:
    """One budget as a :class:`LocalView` knows it."""

    used: int = 0
    # hold id -> (amount, expiry as a UNIX time, granted here while the store failed open: unknown to it)
    holds: dict[str, tuple[int, float, bool]] | None = None
    epoch: str = ""  # the scope's epoch the store last reported with this counter (RedisPeriodBudgets)


class LocalView:
    """What one process knows of its budgets without asking the store, for failing open within it.

    Per budget (one counter key: scope, meter, window): the usage the store last reported (requests only
    add to it, so it is a floor of the truth however old, unless an operator lowered the counter by
    hand: that is believed once the store reports it), and the holds this process's
    requests took and have not given back: granted by the store, or granted here while it failed open.
    A hold whose settling failed stays, at the tokens its call used, until it would have expired. Holds
    of other proxies are not known: failing open lets those through, as it always did. At most
    ``capacity`` budgets are remembered; the one learnt of longest ago is forgotten first.
    """

    def __init__(self, hold_ttl_s: float, *, clock: Callable[[], float] = time.time,
                 capacity: int = LOCAL_VIEW_BUDGETS) -> None:
        self.hold_ttl_s = hold_ttl_s
        self._clock = clock
        self.capacity = capacity
        self.budgets: dict[str, _Known] = {}

    def _known(self, key: str) -> _Known:
        known = self.budgets.get(key)
        if known is None:
            while len(self.budgets) >= self.capacity:
                del self.budgets[next(iter(self.budgets))]
            known = self.budgets[key] = _Known()
        return known

    def saw_usage(self, key: str, used: int) -> None:
        self._known(key).used = used

    def saw_epoch(self, key: str, epoch: str) -> None:
        self._known(key).epoch = epoch

    def epoch(self, key: str) -> str:
        known = self.budgets.get(key)
        return known.epoch if known is not None else ""

    def took(self, key: str, hold: str, amount: int, *, here: bool = False) -> None:
        """``hold`` of ``amount`` tokens, granted by the store or (``here``) while it failed open."""
        if amount <= 0:
            self.gave_back(key, hold)
            return
        known = self._known(key)
        if known.holds is None:
            known.holds = {}
        elif len(known.holds) >= LOCAL_VIEW_HOLDS:
            _drop_expired(known.holds, self._clock())  # holds of calls that were never settled
        known.holds[hold] = (amount, self._clock() + self.hold_ttl_s, here)

    def gave_back(self, key: str, hold: str) -> bool:
        """Forget ``hold``; True when it was granted here while the store failed open (the store never
        held it, so there is nothing to release there)."""
        known = self.budgets.get(key)
        gone = known.holds.pop(hold, None) if known is not None and known.holds else None
        return gone is not None and gone[2]

    def unsettled(self, key: str, hold: str, amount: int) -> None:
        """Settling ``hold`` failed: the ``amount`` of tokens the call used is missing from the store's
        usage, so it stays here, as that hold's amount, until the hold would have expired."""
        known = self.budgets.get(key)
        if known is None or not known.holds or hold not in known.holds:
            return
        if amount > 0:
            known.holds[hold] = (amount, *known.holds[hold][1:])
        else:
            del known.holds[hold]

    def used(self, key: str) -> int:
        known = self.budgets.get(key)
        return known.used if known is not None else 0

    def held(self, key: str, but: str = "") -> int:
        known = self.budgets.get(key)
        if known is None or not known.holds:
            return 0
        _drop_expired(known.holds, self._clock())
        return sum(a for h, (a, _, _) in known.holds.items() if h != but)

    def grant(self, key: str, period: Period, limit: int, amount: int | None, hold: str, now: datetime) -> Hold:
        """A reservation without the store: at most what is known to be left; held here if granted."""
        used, held = self.used(key), self.held(key, but=hold)
        granted = _grant(limit, used, held, amount)
        self.took(key, hold, granted, here=True)
        return Hold(granted, BudgetState(used, limit, period.window(now)[1], held, metered=False))

    def state(self, key: str, period: Period, limit: int, now: datetime) -> BudgetState:
        return BudgetState(self.used(key), limit, period.window(now)[1], self.held(key), metered=False)


class MemoryPeriodBudgets:
    """Budgets in this process's memory (lost at restart; not shared between workers)."""

    def __init__(
        self, clock: Callable[[], datetime] = utc_now, *, hold_ttl_s: float = DEFAULT_HOLD_TTL_S
    ) -> None:
        self._clock = clock
        self.hold_ttl_s = hold_ttl_s
        self._used: dict[tuple[str, str, str, str], int] = {}
        self._ends: dict[tuple[str, str, str, str], datetime] = {}
        # counter key -> hold id -> (amount, expiry as a UTC timestamp)
        self._holds: dict[tuple[str, str, str, str], dict[str, tuple[int, float]]] = {}

    def _key(self, scope: str, meter: str, period: Period, now: datetime) -> tuple[str, str, str, str]:
        return (scope, meter, period.value, period.window_id(now))

    def _live_holds(self, key: tuple[str, str, str, str], now: datetime) -> dict[str, tuple[int, float]]:
        holds = self._holds.get(key)
        if holds is None:
            return {}
        _drop_expired(holds, now.timestamp())
        return holds

    async def check(
        self, scope: str, meter: str, period: Period, limit: int, now: datetime | None = None
    ) -> BudgetState:
        now = now or self._clock()
        key = self._key(scope, meter, period, now)
        held = sum(a for a, _ in self._live_holds(key, now).values())
        return BudgetState(self._used.get(key, 0), limit, period.window(now)[1], held)

    async def charge(
        self, scope: str, meter: str, period: Period, amount: int, now: datetime | None = None
    ) -> int:
        now = now or self._clock()
        key = self._key(scope, meter, period, now)
        self._used[key] = self._used.get(key, 0) + amount
        self._ends[key] = period.window(now)[1]
        self._forget_old(now)
        return self._used[key]

    async def reserve(
        self, scope: str, meter: str, period: Period, limit: int, amount: int | None, hold: str,
        now: datetime | None = None,
    ) -> Hold:
        now = now or self._clock()
        key = self._key(scope, meter, period, now)
        holds = self._live_holds(key, now)
        holds.pop(hold, None)
        used = self._used.get(key, 0)
        held = sum(a for a, _ in holds.values())
        granted = _grant(limit, used, held, amount)
        if granted > 0:
            self._holds.setdefault(key, holds)[hold] = (granted, now.timestamp() + self.hold_ttl_s)
            self._ends[key] = period.window(now)[1]
            self._forget_old(now)
        return Hold(granted, BudgetState(used, limit, period.window(now)[1], held))

    async def settle(
        self, scope: str, meter: str, period: Period, hold: str, amount: int, now: datetime | None = None
    ) -> int:
        now = now or self._clock()
        self._live_holds(self._key(scope, meter, period, now), now).pop(hold, None)
        return await self.charge(scope, meter, period, amount, now=now)

    async def release(self, scope: str, meter: str, period: Period, hold: str, now: datetime | None = None) -> None:
        now = now or self._clock()
        self._live_holds(self._key(scope, meter, period, now), now).pop(hold, None)

    def fail_open_hold(
        self, scope: str, meter: str, period: Period, limit: int, amount: int | None, hold: str, now: datetime
    ) -> Hold:
        # This store never fails open; a caller that asks anyway gets the plain unmetered grant.
        return unmetered(period, limit, amount, now)

    def _forget_old(self, now: datetime) -> None:
        # Bounded memory: drop windows that ended more than the grace period ago.
        if len(self._ends) < 4096:
            return
        for key, end in list(self._ends.items()):
            if end + EXPIRY_GRACE < now:
                self._ends.pop(key, None)
                self._used.pop(key, None)
                self._holds.pop(key, None)

    async def close(self) -> None:
        return None


# One script for every operation, so each is atomic across proxies (redis-py's register_script runs
# it by SHA and reloads it after a SCRIPT FLUSH). KEYS: usage, holds (id -> amount), hold_until
# (id -> expiry), the scope's epoch. ARGV: op, hold id, amount (-1: all that is left), limit, now, hold expiry,
# key expiry, the epoch the caller last saw for this counter ('' if none), the usage it last saw (its floor),
# a fresh epoch to set if the scope has none, the epoch key's lifetime in seconds.
# Returns {granted or new usage, usage before, live holds before, the scope's epoch, usage restored}
# ('charge': new usage, 0, 0, ...). All four keys carry the scope's hash tag, so a Redis Cluster runs each call
# on one node.
#
# The epoch tells a counter lost from one lowered by hand. A scope's epoch is set once and lives as long as its
# counters may; when it is missing (the Redis restarted without persistence, or deleted keys when full) or
# differs from what the caller saw, the scope's keys were lost, and the counter is raised back to the usage the
# caller last saw (the larger of the two: several proxies restoring do not add up). An operator who lowers or
# deletes a counter leaves the epoch, and is believed.
_SCRIPT = """
local used_key, holds_key, until_key, epoch_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op, hold, amount, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local hold_until, expire_at = ARGV[6], ARGV[7]
local seen_epoch, floor = ARGV[8], tonumber(ARGV[9])
local epoch = redis.call('GET', epoch_key)
local lost = false
if not epoch then
  epoch = ARGV[10]
  lost = seen_epoch ~= ''
elseif seen_epoch ~= '' and seen_epoch ~= epoch then
  lost = true
end
redis.call('SET', epoch_key, epoch, 'EX', ARGV[11])
local restored = 0
if lost and floor > 0 then
  local now_used = tonumber(redis.call('GET', used_key) or '0')
  if now_used < floor then
    redis.call('SET', used_key, floor)
    redis.call('EXPIREAT', used_key, expire_at)
    restored = floor - now_used
  end
end
local expired = redis.call('ZRANGEBYSCORE', until_key, '-inf', '(' .. ARGV[5])
for _, id in ipairs(expired) do redis.call('HDEL', holds_key, id) end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', until_key, '-inf', '(' .. ARGV[5]) end
if op == 'charge' then
  local total = redis.call('INCRBY', used_key, amount)
  redis.call('EXPIREAT', used_key, expire_at)
  return {total, 0, 0, epoch, restored}
end
if op ~= 'check' then
  redis.call('HDEL', holds_key, hold)
  redis.call('ZREM', until_key, hold)
end
local used = tonumber(redis.call('GET', used_key) or '0')
local held = 0
for _, v in ipairs(redis.call('HVALS', holds_key)) do held = held + tonumber(v) end
if op == 'settle' then
  local total = redis.call('INCRBY', used_key, amount)
  redis.call('EXPIREAT', used_key, expire_at)
  return {total, used, held, epoch, restored}
end
if op ~= 'reserve' then return {0, used, held, epoch, restored} end
local left = math.max(0, limit - used - held)
local granted = left
if amount >= 0 then granted = math.max(0, math.min(amount, left)) end
if granted > 0 then
  redis.call('HSET', holds_key, hold, granted)
  redis.call('ZADD', until_key, hold_until, hold)
  redis.call('EXPIREAT', holds_key, expire_at)
  redis.call('EXPIREAT', until_key, expire_at)
end
return {granted, used, held, epoch, restored}
"""


class RedisPeriodBudgets:
    """Budgets in Redis, shared by every proxy process (see the module docstring for key layout)."""

    def __init__(
        self,
        target: str | RedisTarget,
        *,
        prefix: str = "litellm_kv",
        fail_open: bool = True,
        timeout_s: float | None = None,
        hold_ttl_s: float = DEFAULT_HOLD_TTL_S,
        guard: RedisGuard | None = None,
        loop: RedisLoop | None = None,
        clock: Callable[[], datetime] = utc_now,
        client: Any = None,
        unfit: Callable[[], str] | None = None,
    ) -> None:
        """``unfit``: why the Redis can no longer be trusted with budgets (``""`` while it can), asked before every
        check and reservation; settling and releasing go on, so what was used is still recorded."""
        self.prefix = prefix
        self.unfit = unfit
        self.fail_open = fail_open
        self.hold_ttl_s = hold_ttl_s
        # Without a guard every call waits for its own answer (the client's socket timeout).
        self.guard = guard
        # Where the calls (and the guard's deadline) run: a loop of their own, or the caller's.
        self.loop = loop
        self._clock = clock
        # Reservations that missed their deadline (Redis may still run them when it wakes up: the command
        # was sent) and releases that failed: released once it answers again rather than left held until
        # they expire.
        self._unsure: list[tuple[str, str, Period, str, datetime]] = []
        # Counters raised back since the last warning, and when that was (one line per RESTORE_LOG_EVERY_S).
        self._restores = 0
        self._restore_logged = -RESTORE_LOG_EVERY_S
        self._cleanup: set[asyncio.Task[None]] = set()
        # What failing open may still grant: the usage Redis last reported and this process's own holds.
        self.local = LocalView(hold_ttl_s)
        if client is None:
            from litellm_kv.redis_client import connect

            client = connect(target, RedisUse.BUDGETS, timeout_s=timeout_s)
        self._redis = client
        self._script = client.register_script(_SCRIPT)

    def _refuse_if_unfit(self) -> None:
        why = self.unfit() if self.unfit is not None else ""
        if why:
            raise BudgetStoreUnfit(why)

    def key(self, scope: str, meter: str, period: Period, now: datetime) -> str:
        """The Redis key of one counter (``{scope}`` is the Redis Cluster hash tag; its epoch: :func:`_epoch_key`)."""
        return f"{self.prefix}:budget:{{{scope}}}:{meter}:{period.value}:{period.window_id(now)}"

    def _failed(self, op: str, exc: Exception) -> None:
        outcome = "fail_open" if self.fail_open else "fail_closed"
        STORE_ERRORS.labels(op, outcome).inc()
        log.warning("litellm-kv: budget store %s failed (%s): %s", op, outcome, exc)
        if not self.fail_open:
            raise BudgetStoreError(
                f"period budget store unavailable ({exc}); litellm_kv.budgets.on_store_error is fail_closed"
            ) from exc

    async def _guarded(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """One Redis call under the deadline and the circuit breaker (a refusal or a missed deadline is a
        failure like any other, so callers handle all three alike)."""
        try:
            if self.loop is not None:
                result = await self.loop.run(lambda: guarded(self.guard, call))
            else:
                result = await guarded(self.guard, call)
        except RedisSkipped:
            assert self.guard is not None
            lim = self.guard.limits
            raise BudgetStoreError(
                f"circuit breaker open after {lim.breaker_failures} consecutive failures; Redis is not asked "
                f"for {lim.breaker_cooldown_s:g} s"
            ) from None
        except RedisDeadlineExceeded as exc:
            if self.guard is None:
                raise BudgetStoreError(str(exc)) from None
            raise BudgetStoreError(f"no answer within the deadline of {self.guard.limits.deadline_ms:g} ms") from None
        if self._unsure and not self._cleanup:
            spawn_held(self._cleanup, self._release_unsure())
        return result

    async def _release_unsure(self) -> None:
        while self._unsure:
            scope, meter, period, hold, at = self._unsure.pop()
            try:
                await self._run("release", self.key(scope, meter, period, at), period, at, hold=hold)
            except Exception:
                return  # Redis is failing again; what is left expires by itself

    async def _run(
        self, op: str, key: str, period: Period, now: datetime, *, hold: str = "", amount: int = 0, limit: int = 0,
    ) -> tuple[int, int, int]:
        """``op`` on the budget counter ``key`` (:meth:`key`) of ``period``'s window at ``now``; a counter the
        Redis lost is first raised back to the usage this process last saw (see :data:`_SCRIPT`)."""
        expire_at = int((period.window(now)[1] + EXPIRY_GRACE).timestamp())
        ts = now.timestamp()
        seen_epoch, floor = self.local.epoch(key), self.local.used(key)
        raw = await self._guarded(lambda: self._script(
            keys=[key, key + ":holds", key + ":hold_until", _epoch_key(key)],
            args=[op, hold, amount, limit, repr(ts), repr(ts + self.hold_ttl_s), expire_at,
                  seen_epoch, floor, uuid.uuid4().hex, EPOCH_TTL_S],
        ))
        first, used, held = (int(v) for v in raw[:3])
        epoch = raw[3].decode() if isinstance(raw[3], bytes) else str(raw[3])
        self.local.saw_epoch(key, epoch)
        restored = int(raw[4])
        if restored:
            self._restored(key, restored)
        return first, used, held

    def _restored(self, key: str, tokens: int) -> None:
        RESTORED.inc(tokens)
        now = time.monotonic()
        self._restores += 1
        if now - self._restore_logged >= RESTORE_LOG_EVERY_S:
            log.warning("litellm-kv: budget store: %d counter(s) the Redis had lost (a restart without persistence, "
                        "or keys deleted when full) raised back to the usage this proxy last saw, the latest %s by "
                        "%d tokens (docs/operations.md, \"A Redis that evicts keys\")", self._restores, key, tokens)
            self._restore_logged, self._restores = now, 0

    async def check(
        self, scope: str, meter: str, period: Period, limit: int, now: datetime | None = None
    ) -> BudgetState:
        self._refuse_if_unfit()
        now = now or self._clock()
        reset_at = period.window(now)[1]
        key = self.key(scope, meter, period, now)
        try:
            _, used, held = await self._run("check", key, period, now)
        except Exception as exc:  # connection, timeout and protocol errors alike
            self._failed("check", exc)
            return self.local.state(key, period, limit, now)
        self.local.saw_usage(key, used)
        return BudgetState(used, limit, reset_at, held)

    async def charge(
        self, scope: str, meter: str, period: Period, amount: int, now: datetime | None = None
    ) -> int:
        now = now or self._clock()
        key = self.key(scope, meter, period, now)
        try:
            total, _, _ = await self._run("charge", key, period, now, amount=amount)
        except Exception as exc:
            self._failed("charge", exc)
            return 0
        self.local.saw_usage(key, int(total))
        return int(total)

    async def reserve(
        self, scope: str, meter: str, period: Period, limit: int, amount: int | None, hold: str,
        now: datetime | None = None,
    ) -> Hold:
        self._refuse_if_unfit()
        now = now or self._clock()
        reset_at = period.window(now)[1]
        key = self.key(scope, meter, period, now)
        try:
            granted, used, held = await self._run(
                "reserve", key, period, now, hold=hold, amount=-1 if amount is None else amount, limit=limit
            )
        except asyncio.CancelledError:
            # The request went away mid-call: Redis may have taken the hold all the same.
            if len(self._unsure) < 1024:
                self._unsure.append((scope, meter, period, hold, now))
            raise
        except Exception as exc:
            if len(self._unsure) < 1024:
                self._unsure.append((scope, meter, period, hold, now))
            self._failed("reserve", exc)
            return self.local.grant(key, period, limit, amount, hold, now)
        self.local.saw_usage(key, used)
        self.local.took(key, hold, granted)
        return Hold(granted, BudgetState(used, limit, reset_at, held))

    def fail_open_hold(
        self, scope: str, meter: str, period: Period, limit: int, amount: int | None, hold: str, now: datetime
    ) -> Hold:
        return self.local.grant(self.key(scope, meter, period, now), period, limit, amount, hold, now)

    async def settle(
        self, scope: str, meter: str, period: Period, hold: str, amount: int, now: datetime | None = None
    ) -> int:
        now = now or self._clock()
        key = self.key(scope, meter, period, now)
        try:
            total, _, _ = await self._run("settle", key, period, now, hold=hold, amount=amount)
        except Exception as exc:
            self.local.unsettled(key, hold, amount)
            self._failed("settle", exc)
            return 0
        self.local.gave_back(key, hold)
        self.local.saw_usage(key, total)
        return total

    async def release(self, scope: str, meter: str, period: Period, hold: str, now: datetime | None = None) -> None:
        now = now or self._clock()
        key = self.key(scope, meter, period, now)
        if self.local.gave_back(key, hold):
            # Granted here while Redis failed open: Redis never held it (a reservation it may have run
            # late is released once it answers again), so there is nothing to wait on it for.
            return
        try:
            await self._run("release", key, period, now, hold=hold)
        except Exception as exc:
            if len(self._unsure) < 1024:  # released once Redis answers again, not left until it expires
                self._unsure.append((scope, meter, period, hold, now))
            self._failed("release", exc)

    async def warm(self, connections: int = WARM_CONNECTIONS, timeout_s: float = 5.0) -> None:
        """Open ``connections`` connections and load the script before the first request: a burst that
        finds the pool empty spends its first deadline on connecting (several round trips each), not on
        the budget. Best effort: a Redis that is down now is the first request's failure, as before."""
        async def ping_all() -> None:
            await self._script(keys=["warm", "warm:holds", "warm:hold_until"], args=["check", "", 0, 0, "0", "0", 0])
            await asyncio.gather(*(self._redis.ping() for _ in range(connections)))

        try:
            if self.loop is not None:
                await self.loop.run(lambda: asyncio.wait_for(ping_all(), timeout_s))
            else:
                await asyncio.wait_for(ping_all(), timeout_s)
        except Exception as exc:
            log.warning("litellm-kv: could not open the budget store's connections at start-up: %s", exc)

    async def close(self) -> None:
        for task in list(self._cleanup):
            task.cancel()
        with contextlib.suppress(Exception):  # closing a broken connection is best effort
            if self.loop is not None:
                await self.loop.run(self._redis.aclose)
            else:
                await self._redis.aclose()
        if self.loop is not None:
            self.loop.close()


class UnsharedPeriodBudgets:
    """The store of a proxy whose worker processes have nothing to share budgets through: each would keep
    its own in memory and grant the whole budget, so every call is refused with ``why``
    (:class:`BudgetStoreUnfit`), whatever ``on_store_error`` says."""

    def __init__(self, why: str) -> None:
        self.why = why

    def _refuse(self) -> BudgetStoreUnfit:
        return BudgetStoreUnfit(self.why)

    async def check(self, scope: str, meter: str, period: Period, limit: int,
                    now: datetime | None = None) -> BudgetState:
        raise self._refuse()

    async def charge(self, scope: str, meter: str, period: Period, amount: int, now: datetime | None = None) -> int:
        raise self._refuse()

    async def reserve(self, scope: str, meter: str, period: Period, limit: int, amount: int | None, hold: str,
                      now: datetime | None = None) -> Hold:
        raise self._refuse()

    async def settle(self, scope: str, meter: str, period: Period, hold: str, amount: int,
                     now: datetime | None = None) -> int:
        raise self._refuse()

    async def release(self, scope: str, meter: str, period: Period, hold: str, now: datetime | None = None) -> None:
        raise self._refuse()

    def fail_open_hold(self, scope: str, meter: str, period: Period, limit: int, amount: int | None, hold: str,
                       now: datetime) -> Hold:
        raise self._refuse()

    async def close(self) -> None:
        return None


def make_period_budgets(target: str | RedisTarget | None, options: BudgetSettings | None = None, *,
                        unshared_why: str | None = None, unfit: Callable[[], str] | None = None) -> PeriodBudgets:
    """Redis-backed budgets when a Redis is configured (a URL or settings), otherwise in-process ones, both
    as ``options`` (``litellm_kv.budgets``) say. ``unshared_why``: the process is one of several that would
    each keep their own (several proxy workers), so without a Redis every budget is refused with that reason.
    ``unfit``: why the Redis can no longer be trusted with budgets (see :class:`RedisPeriodBudgets`)."""
    o = options or BudgetSettings()
    if not target and unshared_why:
        return UnsharedPeriodBudgets(unshared_why)
    if target:
        return RedisPeriodBudgets(
            target, fail_open=o.on_store_error == "fail_open", hold_ttl_s=o.hold_ttl_s,
            guard=RedisGuard(RedisUse.BUDGETS, GuardSettings(o.deadline_ms, o.breaker_failures, o.breaker_open_s),
                             second_look=True),
            loop=RedisLoop(RedisUse.BUDGETS.value, backstop_s=o.deadline_ms / 1000.0 + LOOP_BACKSTOP_S),
            unfit=unfit,
        )
    return MemoryPeriodBudgets(hold_ttl_s=o.hold_ttl_s)
