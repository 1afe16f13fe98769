"""LiteLLM side of prompt-cache affinity (groups with ``litellm_kv.model_groups.<g>.routing: affinity``).

``filter_deployments`` asks :class:`~litellm_kv.routing.affinity.AffinityRouter` for the deployment and
returns it as a one-element list, so LiteLLM's retries, fallbacks and cooldowns keep working:
a retry calls ``filter_deployments`` again with the failed deployment listed in
``metadata.previous_models``, and the pin moves. ``pre_deployment`` and the end-of-attempt hooks
count in-flight attempts for the load cap; ``post_failure_deployment`` marks a deployment failed.

Tenants stay apart: the pins a request may follow are those of its verified caller's team (else key),
read from the ``user_api_key_*`` fields LiteLLM writes after stripping the client's own, unless the group
sets ``share_pins_across_tenants``. The ``x-litellm-kv-affinity`` header goes to admins only by default.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from litellm_kv.config import REDIS_SOURCES, ModelGroupSettings, Settings, parse_section
from litellm_kv.errors import ConfigError
from litellm_kv.integration.hooks import Handler
from litellm_kv.integration.litellm_data import (
    caller_from_request_metadata,
    caller_role,
    deployment_id,
    previous_deployment_ids,
    request_metadata,
)
from litellm_kv.observability import counter
from litellm_kv.redis_client import RedisGuard, RedisUse
from litellm_kv.routing.affinity import (
    AffinityRouter,
    AffinitySettings,
    Clock,
    DeploymentId,
    InFlightCounter,
    MemoryPinStore,
    PinDecision,
    PinStore,
    RedisPinStore,
    provider_of,
)

log = logging.getLogger("litellm_kv")

PINS_CREATED = counter(
    "affinity_pins_created", "Conversations pinned to a deployment for the first time (claimed before the call).",
    ["group"],
)
HITS = counter("affinity_hits", "Requests sent to the deployment their prefix was pinned to.", ["group"])
MISSES = counter(
    "affinity_misses",
    "Requests that did not follow a pin, by reason: no_pin (new prefix, a pin was claimed), too_short "
    "(below the provider's minimum cacheable length, no pin), overloaded (pinned deployment over its load "
    "cap, bypassed), failed / unhealthy (pinned deployment failed or is cooled down, re-pinned), "
    "store_error (pin store unreachable; LiteLLM routed alone).",
    ["group", "reason"],
)
REPINS = counter(
    "affinity_repins", "Pins moved to another deployment, by reason (failed, unhealthy).", ["group", "reason"]
)

HEADER = "x-litellm-kv-affinity"
_DECISIONS_KEPT = 10_000
# LiteLLM roles that already see every tenant's traffic (spend logs, keys), so the header tells them nothing new.
_ADMIN_ROLES = frozenset({"proxy_admin", "proxy_admin_viewer"})


def tenant_of(request_kwargs: Mapping[str, Any]) -> str:
    """The tenant whose pins a request may follow: the verified key's team, else the key.

    LiteLLM drops every ``user_api_key_*`` field a client puts in its metadata and then writes the
    authenticated caller's, so these cannot be forged. No identity at all (a proxy without auth) is one
    tenant of its own.
    """
    caller = caller_from_request_metadata(request_metadata(request_kwargs))
    if caller.team_id:
        return f"team:{caller.team_id}"
    if caller.key_hash:
        return f"key:{caller.key_hash}"
    return "anonymous"


def _deployment_failure(exc: BaseException) -> bool:
    """Whether an error says the deployment is unwell (not that the request was bad)."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    return True  # timeouts and connection errors carry no status


def _failed_ids(request_kwargs: Mapping[str, Any]) -> frozenset[str]:
    """Deployments that already failed this request (LiteLLM's retry bookkeeping)."""
    ids = previous_deployment_ids(request_kwargs)
    for name in ("_excluded_deployment_ids", "_retry_skipped_deployment_ids"):
        value = request_kwargs.get(name)
        if isinstance(value, list | tuple | set | frozenset):
            ids.update(str(v) for v in value)
    return frozenset(ids)


class AffinityHandler(Handler):
    """Pins conversations to deployments for model groups routed by ``affinity``."""

    name = "affinity"

    def __init__(self, settings: Settings, *, clock: Clock | None = None, store: PinStore | None = None) -> None:
        super().__init__(settings)
        self._clock = clock
        self._given_store = store
        self._stores: dict[str, PinStore] = {}
        self._routers: dict[str, AffinityRouter | None] = {}
        self.load = InFlightCounter(clock) if clock is not None else InFlightCounter()
        # call id -> (group, tenant, decision): kept by the proxy, never in client-writable metadata.
        self._decisions: OrderedDict[str, tuple[str, str, PinDecision]] = OrderedDict()

    def enabled_for(self, group: ModelGroupSettings | None) -> bool:
        return group is not None and group.routing == "affinity"

    # -- set-up ---------------------------------------------------------------------------------
    def options(self, group_name: str) -> AffinitySettings | None:
        group = self.settings.group(group_name)
        if not self.enabled_for(group):
            return None
        assert group is not None
        return parse_section(AffinitySettings, group.affinity, f"litellm_kv.model_groups.{group_name}.affinity")

    def _store_for(self, opts: AffinitySettings) -> PinStore:
        if self._given_store is not None:
            return self._given_store
        kind = opts.store
        redis = self.settings.redis_for("pins")
        if kind == "auto":
            kind = "redis" if self.settings.mode == "shared" or redis is not None else "memory"
        if kind == "redis" and redis is None:
            raise ConfigError(f"affinity store 'redis' needs a Redis: {REDIS_SOURCES}")
        name = f"{kind}:{opts.redis_timeout_seconds}" if kind == "redis" else "memory"
        store = self._stores.get(name)
        if store is None:
            if kind == "redis":
                assert redis is not None
                store = RedisPinStore(redis, opts.redis_timeout_seconds,
                                      guard=RedisGuard(RedisUse.PINS, self.settings.redis_routing))
            elif self._clock is not None:
                store = MemoryPinStore(self._clock, opts.memory_max_pins)
            else:
                store = MemoryPinStore(capacity=opts.memory_max_pins)
            self._stores[name] = store
        return store

    def router(self, group_name: str) -> AffinityRouter | None:
        if group_name not in self._routers:
            try:
                opts = self.options(group_name)
                self._routers[group_name] = (
                    None if opts is None else AffinityRouter(group_name, opts, self._store_for(opts), self.load)
                )
            except ConfigError:
                log.exception("litellm-kv: affinity disabled for group %s", group_name)
                self._routers[group_name] = None
        return self._routers[group_name]

    async def shutdown(self) -> None:
        for store in self._stores.values():
            await store.close()

    def _remember(self, call_id: str | None, group: str, tenant: str, decision: PinDecision) -> None:
        if not call_id:
            return
        self._decisions[call_id] = (group, tenant, decision)
        self._decisions.move_to_end(call_id)
        while len(self._decisions) > _DECISIONS_KEPT:
            self._decisions.popitem(last=False)

    # -- routing --------------------------------------------------------------------------------
    async def filter_deployments(
        self,
        model_group: str,
        deployments: list[dict[str, Any]],
        messages: list[dict[str, Any]] | None,
        request_kwargs: dict[str, Any],
    ) -> list[dict[str, Any]] | None:
        router = self.router(model_group)
        if router is None or not deployments:
            return None
        msgs = messages if messages is not None else request_kwargs.get("messages")
        if not isinstance(msgs, list):
            return None  # not a chat request (embeddings, responses with previous_response_id)
        candidates = []
        for d in deployments:
            info = d.get("model_info") or {}
            params = d.get("litellm_params") or {}
            if info.get("id") is None:
                continue
            candidates.append((str(info["id"]), provider_of(params), str(params.get("model") or ""), info))
        tenant = tenant_of(request_kwargs)
        try:
            decision = await router.choose(
                msgs,
                request_kwargs.get("tools"),
                candidates,
                failed_in_request=_failed_ids(request_kwargs),
                namespace_extra=str(request_kwargs.get("prompt_cache_key") or ""),
                retention=request_kwargs.get("prompt_cache_retention"),
                tenant=tenant,
            )
        except Exception:
            MISSES.labels(model_group, "store_error").inc()
            log.warning("litellm-kv: affinity store failed for %s; LiteLLM routes alone", model_group, exc_info=True)
            failed = PinDecision(None, "store_error")
            self._remember(request_kwargs.get("litellm_call_id"), model_group, tenant, failed)
            return None
        self._count(model_group, decision)
        self._remember(request_kwargs.get("litellm_call_id"), model_group, tenant, decision)
        if decision.deployment is None:
            return None
        chosen = [d for d in deployments if str((d.get("model_info") or {}).get("id")) == decision.deployment]
        return chosen[:1] or None

    def _count(self, group: str, decision: PinDecision) -> None:
        if decision.reason == "hit":
            HITS.labels(group).inc()
        elif decision.reason == "new":
            MISSES.labels(group, "no_pin").inc()
            PINS_CREATED.labels(group).inc()
        elif decision.reason == "repin":
            MISSES.labels(group, decision.stale or "unhealthy").inc()
            REPINS.labels(group, decision.stale or "unhealthy").inc()
        else:
            MISSES.labels(group, decision.reason).inc()

    # -- load -----------------------------------------------------------------------------------
    async def pre_deployment(self, kwargs: dict[str, Any]) -> None:
        dep = deployment_id(kwargs)
        call_id = kwargs.get("litellm_call_id")
        if dep is not None and call_id:
            self.load.start(str(call_id), DeploymentId(dep))

    async def post_success_deployment(self, request_data: dict[str, Any], response: Any) -> None:
        if not request_data.get("stream"):
            self.load.finish(str(request_data.get("litellm_call_id")))

    async def post_failure_deployment(self, request_data: Mapping[str, Any], exception: Exception) -> None:
        self.load.finish(str(request_data.get("litellm_call_id")))
        dep = deployment_id(request_data)
        if dep is not None and _deployment_failure(exception):
            self.load.failed(DeploymentId(dep))

    async def log_success(self, kwargs: dict[str, Any], response: Any) -> None:
        self.load.finish(str(kwargs.get("litellm_call_id")))

    async def log_failure(self, kwargs: dict[str, Any], response: Any) -> None:
        self.load.finish(str(kwargs.get("litellm_call_id")))

    async def response_headers(self, data: dict[str, Any], response: Any) -> dict[str, str]:
        kept = self._decisions.pop(str(data.get("litellm_call_id")), None)
        if kept is None:
            return {}
        group, tenant, decision = kept
        if tenant != tenant_of(data):
            return {}  # a client can choose its call id (x-litellm-call-id): never hand it another tenant's decision
        router = self._routers.get(group)
        show = router.options.show_header if router is not None else "off"
        if show == "everyone" or (show == "admins" and caller_role(request_metadata(data)) in _ADMIN_ROLES):
            return {HEADER: decision.reason}
        return {}
