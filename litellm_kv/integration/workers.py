"""How many worker processes serve this proxy, and what litellm-kv would then keep in each of them alone.

LiteLLM's ``--num_workers N`` starts N processes (uvicorn or gunicorn workers) and each loads litellm-kv on
its own. Whatever litellm-kv keeps in memory, each worker keeps for itself:

* **period budgets** (``tokens_per_day`` / ``_week`` / ``_month``) without a Redis: each worker would grant
  the whole budget, N times the limit in all. A limit is at stake, so they are refused instead
  (:class:`~litellm_kv.governance.budgets.UnsharedPeriodBudgets`): a request that needs one gets a 503
  naming the fix;
* **the load** a KV-routed group counts in embedded mode (requests in flight, recent prefill work, the
  in-flight prefixes followers are predicted to hit): each worker sees only its own requests. The cache
  predictions stay exact (every worker subscribes to every engine's events), so routing goes on;
* **affinity pins** in memory: a conversation whose turns reach different workers gets different pins.

None of this can be seen from one worker's own state, so it is said at start-up (an error in the log), on
``GET /litellm-kv/health`` (``workers``), on the admin page and in the metrics ``litellm_kv_proxy_workers``
and ``litellm_kv_unshared_state``.

The count comes from the environment: ``NUM_WORKERS``, which LiteLLM's command line sets for every server it
starts (uvicorn, gunicorn), else ``WEB_CONCURRENCY``, the default worker count of uvicorn and gunicorn. A
server started some other way with several workers should set ``NUM_WORKERS`` itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from litellm_kv.config import Settings
from litellm_kv.observability import gauge
from litellm_kv.redis_client import RedisUse

log = logging.getLogger("litellm_kv")

#: Where the worker count is read, in order: the first that is set decides.
WORKER_VARIABLES = ("NUM_WORKERS", "WEB_CONCURRENCY")

#: What a worker may keep for itself, and what that does when several serve the proxy.
UNSHARED = {
    "period_budgets": "period budgets (tokens_per_day/week/month) have no Redis to share, so requests that need "
                      "one are refused (503): each worker would grant the whole budget. Configure "
                      "litellm_kv.redis (or redis_url, or budgets.redis), or run one worker",
    "kv_load": "the load of KV-routed groups (requests in flight, recent prefill work, in-flight prefixes) is "
               "counted per worker in embedded mode: each worker balances only its own requests. Use mode: "
               "shared (indexers and a Redis), or run one worker",
    "affinity_pins": "affinity pins are kept in each worker's memory: a conversation whose turns reach "
                     "different workers is pinned differently by each. Configure a Redis (litellm_kv.redis or "
                     "redis_url) for the pins, or run one worker",
}

WORKERS = gauge("proxy_workers", "Worker processes serving this proxy, as NUM_WORKERS (else WEB_CONCURRENCY) says.")
UNSHARED_STATE = gauge(
    "unshared_state",
    "1 for each kind of state litellm-kv keeps per worker while several workers serve the proxy "
    "(period_budgets: refused; kv_load; affinity_pins).",
    ["state"],
)


@dataclass(frozen=True, slots=True)
class Workers:
    """The proxy's worker count and the variable it was read from (``""``: none set, one worker)."""

    count: int
    source: str = ""
    raw: str = ""  # the variable's value as set

    @property
    def several(self) -> bool:
        return self.count > 1

    def describe(self) -> str:
        if not self.source:
            return "one worker process"
        raw = self.raw or str(self.count)
        count = str(self.count) if raw == str(self.count) else "several"  # an unreadable value counts as several
        return f"{count} worker processes ({self.source}={raw})"


def proxy_workers(environ: Mapping[str, str] | None = None) -> Workers:
    """The worker count from :data:`WORKER_VARIABLES`. A value that is not a positive whole number counts as
    several workers (``2``) rather than one: what depends on it is a limit that must not be multiplied."""
    env = os.environ if environ is None else environ
    for name in WORKER_VARIABLES:
        raw = env.get(name)
        if raw is None or not raw.strip():
            continue
        try:
            count = int(raw.strip())
        except ValueError:
            return Workers(2, name, raw.strip())
        return Workers(count if count >= 1 else 2, name, raw.strip())
    return Workers(1)


#: The stores whose state, kept in the process, each worker would keep for itself (the KV index is complete in
#: every worker: each subscribes to every engine's events).
_UNSHARED_USES = {RedisUse.BUDGETS.value: "period_budgets", RedisUse.LOAD.value: "kv_load",
                  RedisUse.PINS.value: "affinity_pins"}


def unshared_state(settings: Settings, workers: Workers) -> list[str]:
    """The keys of :data:`UNSHARED` this configuration keeps per worker, when several workers run (else none)."""
    if not workers.several:
        return []
    kept = {_UNSHARED_USES[p.use] for p in settings.stores() if p.redis is None and p.use in _UNSHARED_USES}
    return [s for s in UNSHARED if s in kept]


def budgets_not_shared_why(workers: Workers) -> str:
    """Why period budgets are refused (the message of every refusal), for a proxy with several workers."""
    return (f"this proxy runs {workers.describe()} and period budgets have no Redis to share: each worker would "
            "grant the whole budget by itself. Configure litellm_kv.redis (or redis_url, or budgets.redis) so "
            "that every worker uses one store, or run one worker")


def status(settings: Settings, workers: Workers | None = None) -> dict[str, object]:
    """``workers`` of ``GET /litellm-kv/health`` and of the admin page: the count, where it was read, and what
    each worker keeps for itself (with what that does)."""
    w = workers or proxy_workers()
    states = unshared_state(settings, w)
    return {"count": w.count, "from": w.source or None, "per_worker": {s: UNSHARED[s] for s in states}}


def report(settings: Settings, workers: Workers | None = None) -> list[str]:
    """Set the metrics and log, once at start-up, what each worker keeps for itself; returns those states."""
    w = workers or proxy_workers()
    states = unshared_state(settings, w)
    WORKERS.set(w.count)
    for s in UNSHARED:
        UNSHARED_STATE.labels(s).set(1 if s in states else 0)
    for s in states:
        log.error("litellm-kv: %s: %s (docs/operations.md, \"Several workers\").", w.describe(), UNSHARED[s])
    return states
