"""The one place litellm-kv builds a Redis client: every store that keeps state in Redis (the KV index,
router load, period budgets, affinity pins) asks :func:`connect` for its client.

Each use has its own timeout because each fails differently: the index and load sit on the routing path
but fall back to load-only routing on error, budgets decide whether a request may run, and pins only
steer a provider's prompt cache. Keeping the table here means a change of timeout or retry policy is one
edit, and a reader sees every client litellm-kv opens.

The Redis may be one server (a URL), a Redis Cluster (redis-py's ``RedisCluster``: it learns the slot map,
follows MOVED/ASK and a replica's promotion) or a master found through Sentinel (redis-py's ``Sentinel``:
it asks the sentinels for the master again when a connection fails). Every script litellm-kv runs touches
the keys of one hash tag, so each is served by one cluster node.

Calls on the routing request path also go through a :class:`RedisGuard`: a per-call deadline and a
circuit breaker. A socket timeout alone lets a paused Redis (the server accepts connections but never
answers) hold every routed request for the whole timeout; the deadline bounds that wait, and after
``breaker_failures`` consecutive failures the breaker answers at once (:class:`RedisSkipped`) for
``breaker_cooldown_s`` so a sick Redis costs nothing at all, then lets one probe through.

A deadline measured on the proxy's own event loop also counts the time that loop spends on other
requests: a burst that keeps it busy makes calls to a healthy Redis "late". Period budgets must tell a
sick Redis from a busy proxy (a call that fails open lets a request run without its hold), so their
calls run on a :class:`RedisLoop`, an event loop of their own in a thread, where the deadline measures
Redis and the network only; their guard also leaves out of the deadline the time that thread was not
scheduled at all (:class:`StallClock`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal, Protocol, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from litellm_kv.observability import counter, gauge

T = TypeVar("T")


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


RedisClient = aioredis.Redis | RedisCluster
"""What :func:`connect` returns: a client of one server (or of a Sentinel-managed master), or of a cluster."""


class SentinelTarget(Protocol):
    """The sentinels of a master (:class:`litellm_kv.config.RedisSentinelSettings` has this shape)."""

    @property
    def master(self) -> str: ...
    @property
    def nodes(self) -> list[str]: ...
    @property
    def username(self) -> str | None: ...
    @property
    def password(self) -> str | None: ...


class RedisTarget(Protocol):
    """Where a Redis is and how to log in (:class:`litellm_kv.config.RedisSettings` has this shape)."""

    @property
    def url(self) -> str | None: ...
    @property
    def cluster_nodes(self) -> list[str] | None: ...
    @property
    def sentinel(self) -> SentinelTarget | None: ...
    @property
    def username(self) -> str | None: ...
    @property
    def password(self) -> str | None: ...
    @property
    def db(self) -> int: ...
    @property
    def ssl(self) -> bool: ...
    @property
    def ssl_ca_certs(self) -> str | None: ...
    @property
    def ssl_certfile(self) -> str | None: ...
    @property
    def ssl_keyfile(self) -> str | None: ...
    @property
    def ssl_cert_reqs(self) -> str: ...
    @property
    def ssl_check_hostname(self) -> bool: ...


class _ClusterClient(RedisCluster):
    """redis-py's async ``RedisCluster`` whose first command sets the client up alone: in redis-py 8.1 commands
    sent concurrently to a client that has not yet learnt the cluster (a proxy's first routed requests)
    race in that set-up and fail ('NoneType' object has no attribute 'writelines'); once set up, they do
    not (tests/index/test_index_contract.py[cluster], tests/routing/test_affinity.py[cluster])."""

    _first: asyncio.Lock | None = None

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            if self._first is None:
                self._first = asyncio.Lock()
            async with self._first:
                if self._initialize:
                    await self.initialize()
        return await super().execute_command(*args, **kwargs)


def _host_port(node: str) -> tuple[str, int]:
    text = node.split("://", 1)[-1].rstrip("/")
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def _tls(target: RedisTarget) -> dict[str, Any]:
    if not target.ssl:
        return {}
    return {"ssl": True, "ssl_ca_certs": target.ssl_ca_certs, "ssl_certfile": target.ssl_certfile,
            "ssl_keyfile": target.ssl_keyfile, "ssl_cert_reqs": target.ssl_cert_reqs,
            "ssl_check_hostname": target.ssl_check_hostname}


def connect(target: str | RedisTarget, use: RedisUse, *, timeout_s: float | None = None) -> RedisClient:
    """A client for ``target``: a URL (``redis://`` or ``rediss://`` for TLS; password and database from the
    URL) or :class:`RedisTarget` settings (one server, a cluster, or a master through Sentinel).

    ``timeout_s`` overrides the use's default socket and connect timeout (a store's own setting).
    No connection is opened until the first command. A command that meets a broken connection is retried
    twice after a short back-off (a failover moves the master; the retry reaches the new one once the cluster
    or the sentinels have promoted it); routing-path callers bound the whole wait with a :class:`RedisGuard`.
    """
    t = TIMEOUTS_S[use] if timeout_s is None else timeout_s
    timeouts: dict[str, Any] = {"socket_timeout": t, "socket_connect_timeout": t}
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 2)
    if isinstance(target, str):
        return aioredis.Redis.from_url(target, retry=retry, **timeouts)
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.cluster_nodes:
        nodes = [ClusterNode(*_host_port(n)) for n in target.cluster_nodes]
        return _ClusterClient(startup_nodes=nodes, retry=retry, **auth, **timeouts, **_tls(target))
    if target.sentinel is not None:
        s = target.sentinel
        sentinel = Sentinel([_host_port(n) for n in s.nodes],
                            sentinel_kwargs={"username": s.username, "password": s.password, **timeouts},
                            retry=retry, **timeouts)
        return sentinel.master_for(s.master, db=target.db, **auth, **_tls(target))
    url = str(target.url)
    extra = {k: v for k, v in auth.items() if v is not None}
    if target.db:
        extra["db"] = target.db
    return aioredis.Redis.from_url(url, retry=retry, **timeouts, **extra, **_tls(target))


def describe(target: str | RedisTarget) -> str:
    """Where ``target`` points, without credentials (for logs)."""
    if isinstance(target, str):
        scheme, sep, rest = target.partition("://")
        return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else target
    if target.cluster_nodes:
        return "cluster " + ",".join(target.cluster_nodes)
    if target.sentinel is not None:
        return f"sentinel {target.sentinel.master}@" + ",".join(target.sentinel.nodes)
    return describe(str(target.url))


async def used_memory(client: RedisClient) -> int:
    """``used_memory`` in bytes, summed over a cluster's masters."""
    if isinstance(client, RedisCluster):
        info = await client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        # One node answers its own dict; several answer {node name: dict}.
        if "used_memory" in info:
            return int(info["used_memory"])
        return sum(int(v["used_memory"]) for v in info.values())
    return int((await client.info("memory"))["used_memory"])


# -- bounded waits ----------------------------------------------------------------------------------------

BREAKER_OPEN = gauge(
    "redis_breaker_open",
    "Circuit breakers of Redis stores on the request path that are open or probing (skipping Redis), by use "
    "(index, load, pins, budgets); 0 when every store talks to Redis.",
    ["use"],
)
BREAKER_OPENS = counter(
    "redis_breaker_opens", "Times a Redis store's circuit breaker opened (consecutive failures or a failed probe).",
    ["use"],
)
CALL_FAILURES = counter(
    "redis_call_failures",
    "Redis calls on the request path that failed, by use and kind: deadline (no answer within "
    "redis_routing.deadline_ms, or litellm_kv.budgets.deadline_ms for budgets) or error (connection "
    "refused, reset, script error).",
    ["use", "kind"],
)
CALLS_SKIPPED = counter(
    "redis_calls_skipped", "Redis calls not sent because the store's circuit breaker was open (fell back at once).",
    ["use"],
)


#: Passes of the loop a guard with ``second_look`` gives an answer that may already have arrived.
SECOND_LOOK_PASSES = 4

#: How often a guard with ``second_look`` checks, while its calls are in flight, that its loop is running.
STALL_TICK_S = 0.005
#: The longest a guard with ``second_look`` waits for one call, in deadlines, however long its loop stalled.
STALL_STRETCH = 4

DEADLINES_STRETCHED = counter(
    "redis_deadlines_stretched",
    "Redis calls whose deadline was pushed back because the store's own loop did not run for part of it "
    "(the process was starved of CPU or of the interpreter lock, which is not Redis's time), by use.",
    ["use"],
)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class StallClock:
    """How long an event loop did not run while calls were in flight on it.

    While at least one call is in flight a tick runs every :data:`STALL_TICK_S`; a tick that comes more
    than another tick late means the loop's thread was not scheduled (another thread held the interpreter
    lock, or the host gave it no CPU), and the delay beyond that slack adds to :meth:`lost`. The slack
    absorbs the usual wait for the interpreter lock (its switch interval is 5 ms). Idle, it schedules
    nothing.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, tick_s: float = STALL_TICK_S) -> None:
        self.loop = loop
        self.tick_s = tick_s
        self._lost = 0.0
        self._last = 0.0
        self._active = 0
        self._handle: asyncio.TimerHandle | None = None

    def enter(self) -> float:
        """A call starts: returns the mark to measure its lost time from (:meth:`lost_since`)."""
        if self._active == 0:
            self._last = self.loop.time()
            self._handle = self.loop.call_at(self._last + self.tick_s, self._tick)
        self._active += 1
        return self.lost()

    def leave(self) -> None:
        self._active -= 1
        if self._active == 0 and self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        now = self.loop.time()
        self._lost += max(0.0, now - self._last - 2 * self.tick_s)
        self._last = now
        self._handle = self.loop.call_at(now + self.tick_s, self._tick) if self._active else None

    def lost(self) -> float:
        """Seconds the loop did not run while calls were in flight, so far (the current gap included)."""
        if self._active == 0:
            return self._lost
        return self._lost + max(0.0, self.loop.time() - self._last - 2 * self.tick_s)

    def lost_since(self, mark: float) -> float:
        return self.lost() - mark


class RedisSkipped(RedisError):
    """The store's circuit breaker is open: the call was not sent (callers fall back as on any Redis error)."""


class RedisDeadlineExceeded(RedisTimeoutError):
    """Redis did not answer within the routing path's deadline."""


class GuardLimits(Protocol):
    """The limits of a :class:`RedisGuard` (:class:`litellm_kv.config.RedisRoutingSettings` has this shape)."""

    deadline_ms: float
    breaker_failures: int
    breaker_cooldown_s: float


@dataclass(slots=True)
class GuardSettings:
    """:class:`GuardLimits` as plain values, for stores whose settings name them otherwise (budgets)."""

    deadline_ms: float
    breaker_failures: int
    breaker_cooldown_s: float


BreakerState = Literal["closed", "open", "half_open"]

_GUARDS: weakref.WeakSet[RedisGuard] = weakref.WeakSet()


class RedisGuard:
    """A deadline on each call and a circuit breaker, for one store's Redis calls.

    closed: calls run, each bounded by ``deadline_ms``; ``breaker_failures`` failures in a row open it.
    open: calls raise :class:`RedisSkipped` without waiting, for ``breaker_cooldown_s``.
    half_open: one call (the probe) runs, the others are skipped; its success closes the breaker, its
    failure opens it for another cool-down.
    """

    def __init__(self, use: RedisUse, limits: GuardLimits, *, scope: str = "", second_look: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``scope`` names what the store serves (a model group) on ``/litellm-kv/health``.

        ``second_look``: meant for a loop of the store's own (:class:`RedisLoop`), where the deadline should
        count Redis's time only. The deadline then counts only the time that loop could run: a loop that
        stalled (its thread starved of CPU or of the interpreter lock, see :class:`StallClock`) has the
        deadline pushed back by the stall, up to :data:`STALL_STRETCH` deadlines in all, while a paused
        Redis beside a running loop is given up at the deadline as before. And when the deadline passes,
        the loop reads what has already arrived before giving the call up (a few passes, no waiting): a
        thread that was not scheduled wakes up to the deadline and the answer at once, and asyncio would
        run the deadline first."""
        self.use = use
        self.limits = limits
        self.scope = scope
        self.second_look = second_look
        self._clock = clock
        self._stalls: StallClock | None = None
        self.state: BreakerState = "closed"
        self.consecutive_failures = 0
        self._opened_at = 0.0
        self._probing = False
        self.calls = 0
        self.deadline_exceeded = 0
        self.errors = 0
        self.skipped = 0
        self.opens = 0
        self.stretched = 0
        _GUARDS.add(self)

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` within the deadline; raises :class:`RedisSkipped` while open, and
        :class:`RedisDeadlineExceeded` when Redis does not answer in time."""
        probe = self._admit()
        self.calls += 1
        if self.second_look:
            try:
                return await self._run_looking_twice(call)
            finally:
                if probe:
                    self._probing = False
        try:
            try:
                async with asyncio.timeout(self.limits.deadline_ms / 1000.0) as within:
                    result = await call()
            except TimeoutError as exc:
                if not within.expired():  # a timeout of the call's own, not the deadline
                    self._failed("error")
                    raise
                self._failed("deadline")
                raise RedisDeadlineExceeded(
                    f"Redis ({self.use.value}) did not answer within redis_routing.deadline_ms="
                    f"{self.limits.deadline_ms:g}") from exc
            except Exception:
                self._failed("error")
                raise
        finally:
            if probe:
                self._probing = False  # a cancelled probe leaves the breaker half open: the next call probes
        self._succeeded()
        return result

    def _stall_clock(self) -> StallClock:
        loop = asyncio.get_running_loop()
        if self._stalls is None or self._stalls.loop is not loop:
            self._stalls = StallClock(loop)
        return self._stalls

    async def _wait_runnable_deadline(self, task: asyncio.Future[Any]) -> None:
        """Wait for ``task`` until the loop has been able to run for the deadline (time it stalled does
        not count), at most :data:`STALL_STRETCH` deadlines of wall time."""
        stalls = self._stall_clock()
        loop = stalls.loop
        deadline = self.limits.deadline_ms / 1000.0
        start, mark = loop.time(), stalls.enter()
        give_up = start + STALL_STRETCH * deadline
        stretched = False
        try:
            while not task.done():
                now = loop.time()
                lost = stalls.lost_since(mark)
                left = min(start + deadline + lost, give_up) - now
                if left <= 0:
                    return
                if lost > 0 and now >= start + deadline and not stretched:
                    stretched = True
                    self.stretched += 1
                    DEADLINES_STRETCHED.labels(self.use.value).inc()
                await asyncio.wait({task}, timeout=left)
        finally:
            stalls.leave()

    async def _run_looking_twice(self, call: Callable[[], Awaitable[T]]) -> T:
        task = asyncio.ensure_future(call())
        try:
            await self._wait_runnable_deadline(task)
            for _ in range(SECOND_LOOK_PASSES):
                if task.done():
                    break
                await asyncio.sleep(0)  # one pass of the loop: sockets that are readable are read
        except BaseException:
            task.cancel()
            raise
        if not task.done():
            task.cancel()
            task.add_done_callback(_retrieve)  # however the abandoned call ends, nobody awaits it
            self._failed("deadline")
            raise RedisDeadlineExceeded(
                f"Redis ({self.use.value}) did not answer within the deadline of {self.limits.deadline_ms:g} ms")
        try:
            result = task.result()
        except Exception:
            self._failed("error")
            raise
        self._succeeded()
        return result

    def _admit(self) -> bool:
        """Whether this call may go to Redis (else raises :class:`RedisSkipped`); True for the probe."""
        if self.state == "open" and self._clock() - self._opened_at >= self.limits.breaker_cooldown_s:
            self.state = "half_open"
        if self.state == "closed":
            return False
        if self.state == "half_open" and not self._probing:
            self._probing = True
            return True
        self.skipped += 1
        CALLS_SKIPPED.labels(self.use.value).inc()
        raise RedisSkipped(
            f"Redis ({self.use.value}) skipped: circuit breaker open after {self.consecutive_failures} failures "
            f"in a row (redis_routing.breaker_failures={self.limits.breaker_failures}); probing again "
            f"{self.limits.breaker_cooldown_s:g}s after opening (redis_routing.breaker_cooldown_s)")

    def _failed(self, kind: Literal["deadline", "error"]) -> None:
        if kind == "deadline":
            self.deadline_exceeded += 1
        else:
            self.errors += 1
        CALL_FAILURES.labels(self.use.value, kind).inc()
        self.consecutive_failures += 1
        if self.state == "half_open" or self.consecutive_failures >= self.limits.breaker_failures:
            if self.state == "closed":
                BREAKER_OPEN.labels(self.use.value).inc()
            self.state = "open"
            self._opened_at = self._clock()
            self.opens += 1
            BREAKER_OPENS.labels(self.use.value).inc()

    def _succeeded(self) -> None:
        self.consecutive_failures = 0
        if self.state != "closed":
            BREAKER_OPEN.labels(self.use.value).dec()
            self.state = "closed"

    def status(self) -> dict[str, Any]:
        """What ``/litellm-kv/health`` shows for this store."""
        reopen = self.limits.breaker_cooldown_s - (self._clock() - self._opened_at) if self.state == "open" else 0.0
        return {
            "use": self.use.value, "scope": self.scope, "state": self.state,
            "consecutive_failures": self.consecutive_failures, "probe_in_s": round(max(0.0, reopen), 3),
            "calls": self.calls, "deadline_exceeded": self.deadline_exceeded, "errors": self.errors,
            "skipped": self.skipped, "opens": self.opens, "deadlines_stretched": self.stretched,
            "deadline_ms": self.limits.deadline_ms,
            "breaker_failures": self.limits.breaker_failures, "breaker_cooldown_s": self.limits.breaker_cooldown_s,
        }


async def guarded(guard: RedisGuard | None, call: Callable[[], Awaitable[T]]) -> T:
    """``call()`` through ``guard`` when the store has one (stores used off the routing path, like the
    indexer's writes, have none)."""
    return await (call() if guard is None else guard.run(call))


class RedisLoop:
    """An event loop of its own, in a daemon thread, that one store's Redis calls run on.

    The store's client and its connections live on this loop; the proxy's loop only hands it calls and
    awaits their results. A call's deadline (its :class:`RedisGuard` runs here too) is then measured on a
    loop that has nothing else to do: a proxy whose own loop is busy with a burst of requests no longer
    makes a healthy Redis miss it, while a paused Redis still does, after the same wait. Started on the
    first call (after any fork of the proxy's workers), restarted if its thread has died.
    """

    def __init__(self, name: str, *, backstop_s: float = 5.0) -> None:
        """``backstop_s``: the longest the proxy's loop waits for a call this loop has not finished (only
        a stuck thread can take that long: the guard's deadline ends every call here well before)."""
        self.name = name
        self.backstop_s = backstop_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop of the thread (started now when there is none)."""
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name=f"litellm-kv-{self.name}", daemon=True)
                self._thread.start()
                ready.wait(5.0)
                self._loop = loop
            return self._loop

    async def run(self, work: Callable[[], Awaitable[T]]) -> T:
        """``await work()`` on this loop, from any other loop; a call this loop has finished is never
        dropped because the caller's loop was slow to pick up its result."""
        async def on_loop() -> T:
            return await work()

        done: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(on_loop(), self.loop())
        waiter = asyncio.wrap_future(done)
        try:
            await asyncio.wait({waiter}, timeout=self.backstop_s)
        except BaseException:
            done.cancel()  # the caller was cancelled: so is the call
            raise
        if waiter.done():
            if not waiter.cancelled():
                waiter.exception()  # read here (as done's), so the wrapper's copy is not reported unread
        else:
            waiter.cancel()  # the result is taken from ``done`` below, or the call is given up
        if not done.done():
            done.cancel()
            raise RedisDeadlineExceeded(f"Redis ({self.name}) call not finished by its own loop within "
                                        f"{self.backstop_s:g} s")
        return done.result()

    def close(self) -> None:
        """Stop the thread's loop (its calls are abandoned); a later call starts a new one."""
        with self._lock:
            loop, self._loop, self._thread = self._loop, None, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


def guard_status() -> list[dict[str, Any]]:
    """The state of every live :class:`RedisGuard` of this process, by use and scope."""
    return sorted((g.status() for g in list(_GUARDS)), key=lambda s: (s["use"], s["scope"]))
