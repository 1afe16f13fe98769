"""What the per-key governance handlers (reasoning, vision) share: a section of their own in each model
group's config, parsed once per group, period budgets (in memory, or Redis when ``redis_url`` is set),
failing closed, and the per-call decision kept by the proxy (never read from the request)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, MutableMapping
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

from litellm_kv.config import ModelGroupSettings, Settings, parse_section
from litellm_kv.errors import PolicyViolation
from litellm_kv.governance.budgets import BudgetStoreError, Period, PeriodBudgets, make_period_budgets
from litellm_kv.governance.policy import PolicyLayer, config_layer, metadata_layer
from litellm_kv.integration import litellm_data
from litellm_kv.integration.hooks import Handler, ProxyRequest
from litellm_kv.tasks import spawn_held

G = TypeVar("G")

log = logging.getLogger("litellm_kv.governance")


def _taken_at(charge: MutableMapping[str, Any]) -> datetime:
    """When the charge's hold was taken: settling lands in that window, where the hold lives."""
    try:
        return datetime.fromisoformat(str(charge["at"]))
    except (KeyError, ValueError):
        return datetime.now(timezone.utc)


async def settle_holds(budgets: PeriodBudgets, meter: str, charges: Iterable[MutableMapping[str, Any]],
                       tokens: int) -> None:
    """After the call: each budget's hold (if one was taken) is replaced by the ``tokens`` really used."""
    for ch in charges:
        hold = ch.pop("hold", None)
        try:
            if hold:
                await budgets.settle(ch["scope"], meter, Period(ch["period"]), str(hold), tokens, now=_taken_at(ch))
            elif tokens:
                await budgets.charge(ch["scope"], meter, Period(ch["period"]), tokens, now=_taken_at(ch))
        except BudgetStoreError:
            log.warning("litellm-kv: could not charge %s %s to %s", tokens, meter.replace("_", " "), ch["scope"])


async def release_holds(budgets: PeriodBudgets, meter: str, charges: Iterable[MutableMapping[str, Any]]) -> None:
    """The call will not run (or failed): give back every hold it took, charging nothing."""
    for ch in charges:
        hold = ch.pop("hold", None)
        if not hold:
            continue
        try:
            await budgets.release(ch["scope"], meter, Period(ch["period"]), str(hold), now=_taken_at(ch))
        except BudgetStoreError:
            log.warning("litellm-kv: could not release a hold of %s on %s (it expires by itself)",
                        meter.replace("_", " "), ch["scope"])


class GovernanceHandler(Handler, Generic[G]):
    """Base of a handler that acts on groups whose config has a non-empty ``section``."""

    section = ""  # "reasoning" or "vision": the ModelGroupSettings field
    group_settings_cls: type[Any] = object  # the dataclass of the group-level options
    policy_fields: tuple[str, ...] = ()  # keys of the section that are limits, not group options
    fails_closed = True  # an error while deciding must not send the request on without its limits

    def __init__(self, settings: Settings, budgets: PeriodBudgets | None = None) -> None:
        super().__init__(settings)
        self._budgets = budgets
        self._groups: dict[str, G] = {}
        self._settling: set[asyncio.Task[None]] = set()

    def settle_later(self, meter: str, charges: list[dict[str, Any]], tokens: int) -> None:
        """Settle the call's holds off the response path: until it lands the hold still counts, so
        waiting on the store (slow or down) here would only delay the caller, never protect the budget."""
        spawn_held(self._settling, settle_holds(self.budgets, meter, charges, tokens))

    @property
    def budgets(self) -> PeriodBudgets:
        if self._budgets is None:
            self._budgets = make_period_budgets(self.settings.redis_url, self.settings.budgets)
        return self._budgets

    async def shutdown(self) -> None:
        if self._budgets is not None:
            await self._budgets.close()

    def enabled_for(self, group: ModelGroupSettings | None) -> bool:
        return group is not None and bool(getattr(group, self.section))

    def keep_decision(self, req: ProxyRequest, decision: object) -> None:
        """Keep this call's decision in the proxy for the hooks after the upstream call."""
        if not req.record_key:
            # Without LiteLLM's call id the later hooks could not find the decision: nothing would be charged.
            raise PolicyViolation(
                500, f"The {self.section} limits of model '{req.model_group}' cannot be applied: the request has "
                "no litellm_call_id to keep the decision under.", limit_name=f"{self.section}.internal_error",
                source="litellm-kv",
            )
        self.records.put(req.record_key, self.section, decision)

    def decision_of(self, data: Mapping[str, Any]) -> Any | None:
        """The decision :meth:`keep_decision` kept for the call ``data`` belongs to (any hook); ``None``
        when the proxy decided nothing for it (an ungoverned group): then nothing is charged."""
        return self.records.get(litellm_data.call_key(data), self.section)

    def group_settings(self, name: str) -> G:
        gs = self._groups.get(name)
        if gs is None:
            group = self.settings.group(name)
            raw = dict(getattr(group, self.section)) if group is not None else {}
            own = {k: v for k, v in raw.items() if k not in self.policy_fields}
            gs = parse_section(self.group_settings_cls, own, f"litellm_kv.model_groups.{name}.{self.section}")
            self._groups[name] = gs
        return gs

    def policy_layers(self, req: ProxyRequest) -> tuple[PolicyLayer, PolicyLayer | None, PolicyLayer, str, str | None]:
        """Key, team and group-config layers of this feature's limits, and the key and team budget scopes.

        Raises :class:`~litellm_kv.errors.MetadataError` (naming the key or team and the field) when the
        caller's metadata is malformed.
        """
        caller = req.caller
        mk = self.settings.metadata_key
        team_scope = f"team:{caller.team_id}" if caller.team_id else None
        key = metadata_layer(caller.key_metadata, self.section, where=caller.key_label, metadata_key=mk)
        team = None
        if caller.team_id:
            team = metadata_layer(caller.team_metadata, self.section, where=caller.team_label, metadata_key=mk)
        return key, team, self.config_layer(req), self.key_scope(req), team_scope

    def config_layer(self, req: ProxyRequest) -> PolicyLayer:
        section = getattr(req.group, self.section) if req.group else {}
        return config_layer(section, group=req.model_group, feature=self.section)

    @staticmethod
    def key_scope(req: ProxyRequest) -> str:
        caller = req.caller
        return f"key:{caller.key_hash or caller.key_alias or 'anonymous'}"
