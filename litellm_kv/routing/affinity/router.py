"""The affinity router: one request of one model group to a deployment, with no LiteLLM import."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from litellm_kv.routing.affinity.inflight import DeploymentId, InFlightCounter
from litellm_kv.routing.affinity.keys import PrefixDigest, conversation_prefixes, select_keys
from litellm_kv.routing.affinity.meters import TokenMemo, make_meter
from litellm_kv.routing.affinity.options import AffinitySettings
from litellm_kv.routing.affinity.pins import Candidates, PinStore
from litellm_kv.routing.affinity.profiles import profile_for
from litellm_kv.routing.affinity.ttl import parse_ttl, request_ttl


@dataclass(slots=True)
class PinDecision:
    """One request's affinity decision, kept for its failure hook and for metrics."""

    deployment: str | None
    reason: str  # hit | new | repin | overloaded | too_short | store_error
    keys: list[str] = field(default_factory=list)
    stale: str = ""
    cached_tokens_estimate: int = 0


class AffinityRouter:
    """Chooses a deployment for a request of one model group; owns nothing LiteLLM-specific."""

    def __init__(
        self,
        group: str,
        options: AffinitySettings,
        store: PinStore,
        load: InFlightCounter,
        *,
        memo: TokenMemo | None = None,
        rng: Callable[[Sequence[str]], str] | None = None,
    ) -> None:
        self.group = group
        self.options = options
        self.store = store
        self.load = load
        self.memo = memo or TokenMemo()
        self._pick = rng or random.choice

    def namespace(self, tenant: str, extra: str = "") -> str:
        """The seed of a request's key chain: group, tenant (unless shared) and the client's extra part.

        JSON keeps the parts apart: a client-chosen ``extra`` (``prompt_cache_key``) cannot be made to
        read as another tenant's name.
        """
        scope = "" if self.options.share_pins_across_tenants else tenant
        if not scope:
            return f"{self.group}\x00{extra}"
        return json.dumps([self.group, scope, extra], ensure_ascii=False)

    def key_name(self, digest: PrefixDigest) -> str:
        # The hash tag keeps a group's pins in one Redis Cluster slot (one script call per request).
        return f"{self.options.key_prefix}:{{{self.group}}}:{digest}"

    async def choose(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None,
        deployments: Sequence[tuple[str, str, str, Mapping[str, Any]]],
        *,
        failed_in_request: frozenset[str] = frozenset(),
        namespace_extra: str = "",
        retention: Any = None,
        tenant: str = "",
    ) -> PinDecision:
        """``deployments``: (id, provider, model, model_info) of the healthy deployments.

        ``tenant``: who the verified caller is (team or key); it seeds the keys unless the group shares
        pins across tenants, so one tenant's pins are invisible to every other.
        """
        opts = self.options
        failed = set(failed_in_request)
        window = opts.avoid_failed_seconds
        failed.update(d for d, *_ in deployments if self.load.recently_failed(DeploymentId(d), window))
        allowed = [d for d in deployments if d[0] not in failed]
        if not allowed:
            allowed = [d for d in deployments if d[0] not in failed_in_request]
        if not allowed:
            return PinDecision(None, "no_deployment")
        _, provider, model, _ = allowed[0]
        profile = profile_for(provider, opts)
        meter = make_meter(opts.tokenizer, opts, provider, model)
        prefixes = conversation_prefixes(
            messages, tools, namespace=self.namespace(tenant, namespace_extra), meter=meter, memo=self.memo
        )
        chosen = select_keys(prefixes, profile, opts)
        if not chosen:
            return PinDecision(None, "too_short")
        keys = [self.key_name(p.digest) for p in chosen]
        req_ttl = request_ttl(messages, tools, retention) if opts.follow_request_ttl else None
        ttl_ms: dict[str, int] = {}
        busy: set[str] = set()
        least = min(self.load.in_flight(DeploymentId(d)) for d, *_ in allowed)
        for dep_id, _, _, info in allowed:
            dep_ttl = parse_ttl(info.get("affinity_ttl_seconds")) if info.get("affinity_ttl_seconds") else None
            ttl_ms[dep_id] = int(1000 * (req_ttl or dep_ttl or opts.ttl_seconds))
            cap = info.get("affinity_max_in_flight", opts.max_in_flight)
            n = self.load.in_flight(DeploymentId(dep_id))
            if (isinstance(cap, int) and n >= cap) or (
                opts.max_imbalance is not None and n - least > opts.max_imbalance
            ):
                busy.add(dep_id)
        if len(busy) == len(allowed):
            busy.clear()  # everyone is over the cap: bypassing would only move the queue
        free = [d for d, *_ in allowed if d not in busy]
        lightest = min(self.load.in_flight(DeploymentId(d)) for d in free)
        proposal = self._pick([d for d in free if self.load.in_flight(DeploymentId(d)) == lightest])
        candidates = Candidates(ttl_ms, proposal, frozenset(busy), frozenset(failed))
        res = await self.store.resolve(keys, candidates)
        hit_tokens = chosen[res.hit_index].tokens if res.outcome == "hit" else 0
        return PinDecision(res.deployment, res.outcome, keys, res.stale, profile.cacheable(hit_tokens))
