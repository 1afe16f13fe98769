"""Pin stores: prefix keys pinned to deployments, resolved and claimed in one atomic step."""

from __future__ import annotations

import functools
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Literal, Protocol

from litellm_kv.redis_client import RedisGuard, RedisTarget, RedisUse, connect, guarded


@dataclass(frozen=True, slots=True)
class Candidates:
    """What the store may choose from for one request.

    ``ttl_ms``: every deployment that may serve the request, with the pin TTL it would get.
    ``busy``: deployments over their load cap (a pin to them is bypassed, not moved).
    ``failed``: deployments that failed this request or recently (a pin to them is moved).
    ``proposal``: the deployment to claim when no live pin exists.
    """

    ttl_ms: Mapping[str, int]
    proposal: str
    busy: frozenset[str] = frozenset()
    failed: frozenset[str] = frozenset()


Outcome = Literal["hit", "new", "repin", "overloaded"]
_OUTCOMES: dict[str, Outcome] = {"hit": "hit", "new": "new", "repin": "repin", "overloaded": "overloaded"}


@dataclass(frozen=True, slots=True)
class Resolution:
    """The store's answer: the deployment to use and why.

    ``stale``: for a re-pin, why the old pin was moved ('failed' or 'unhealthy'). ``hit_index``: the
    position (0 = longest) of the key that was followed, -1 when none.
    """

    deployment: str
    outcome: Outcome
    hit_index: int = -1
    stale: str = ""


class PinStore(Protocol):
    """Pins of prefix keys to deployments, resolved and claimed in one atomic step."""

    async def resolve(self, keys: Sequence[str], candidates: Candidates) -> Resolution: ...

    async def get(self, key: str) -> str | None: ...

    async def close(self) -> None: ...


def _plan(values: Sequence[str | None], c: Candidates) -> tuple[Resolution, list[tuple[int, str]]]:
    """The resolve algorithm shared by both stores: the answer and the writes (index, 'set'|'touch')."""
    stale = ""
    hit = -1
    for i, v in enumerate(values):
        if v is None:
            continue
        if v in c.ttl_ms and v not in c.failed:
            if v in c.busy:
                return Resolution(c.proposal, "overloaded", i), []
            hit = i
            break
        if not stale:
            stale = "failed" if v in c.failed else "unhealthy"
    if hit >= 0:
        winner = values[hit]
        assert winner is not None
        res = Resolution(winner, "hit", hit, "")
    else:
        winner = c.proposal
        res = Resolution(winner, "repin" if stale else "new", -1, stale)
    writes: list[tuple[int, str]] = []
    for i, v in enumerate(values):
        if hit < 0 or i < hit:
            writes.append((i, "set"))  # missing or stale: claim for the winner
        elif i == hit or v == winner:
            writes.append((i, "touch"))  # inactivity TTL: every hit refreshes
        elif v is None or v not in c.ttl_ms or v in c.failed:
            writes.append((i, "set"))
        # a shorter prefix pinned to another live deployment keeps its pin
    return res, writes


class MemoryPinStore:
    """Pins in this process. ``resolve`` has no await inside, so it is atomic under asyncio."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, capacity: int = 200_000) -> None:
        self.clock = clock
        self.capacity = capacity
        self._pins: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def _live(self, key: str, now: float) -> str | None:
        entry = self._pins.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._pins[key]
            return None
        return entry[0]

    async def resolve(self, keys: Sequence[str], candidates: Candidates) -> Resolution:
        now = self.clock()
        values = [self._live(k, now) for k in keys]
        res, writes = _plan(values, candidates)
        ttl = candidates.ttl_ms[res.deployment] / 1000.0 if res.outcome != "overloaded" else 0.0
        for i, _op in writes:
            self._pins[keys[i]] = (res.deployment, now + ttl)
            self._pins.move_to_end(keys[i])
        while len(self._pins) > self.capacity:
            self._pins.popitem(last=False)
        return res

    async def get(self, key: str) -> str | None:
        return self._live(key, self.clock())

    async def close(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._pins)


# The same algorithm as _plan, in Lua, so lookup and claim are one atomic step on the server.
_RESOLVE_LUA = resources.files("litellm_kv.routing.affinity").joinpath("lua/resolve.lua").read_text(encoding="utf-8")


class RedisPinStore:
    """Pins in Redis, shared by every proxy; one Lua script per request (lookup, claim, refresh).

    ``guard``: deadline and circuit breaker of each call (a resolve sits on the request path; when it fails
    or is skipped, LiteLLM routes alone).
    """

    def __init__(self, target: str | RedisTarget, timeout: float | None = None, *,
                 guard: RedisGuard | None = None) -> None:
        """``target``: a Redis URL or settings (one server, a cluster, Sentinel). Every key of one request
        carries the group's hash tag, so the script runs on one cluster node."""
        self._redis = connect(target, RedisUse.PINS, timeout_s=timeout)
        self._script = self._redis.register_script(_RESOLVE_LUA)
        self.guard = guard

    async def resolve(self, keys: Sequence[str], candidates: Candidates) -> Resolution:
        arg = json.dumps(
            {
                "ttl": dict(candidates.ttl_ms),
                "busy": {d: True for d in candidates.busy} or {"": False},
                "failed": {d: True for d in candidates.failed} or {"": False},
                "proposal": candidates.proposal,
            }
        )
        raw = await guarded(self.guard, functools.partial(self._script, keys=list(keys), args=[arg]))
        winner, outcome, hit, stale = (v.decode() if isinstance(v, bytes) else v for v in raw)
        known = _OUTCOMES.get(str(outcome))
        if known is None:
            raise RuntimeError(f"affinity script answered {raw!r}")
        return Resolution(str(winner), known, int(hit) - 1, str(stale or ""))

    async def get(self, key: str) -> str | None:
        v = await guarded(self.guard, functools.partial(self._redis.get, key))
        return v.decode() if isinstance(v, bytes) else v

    async def close(self) -> None:
        await self._redis.aclose()
