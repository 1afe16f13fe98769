"""What the per-key governance handlers (reasoning, vision) share: a section of their own in each model
group's config, parsed once per group, and period budgets (in memory, or Redis when ``redis_url`` is set)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from litellm_kv.budgets import PeriodBudgets, make_period_budgets
from litellm_kv.config import ModelGroupSettings, Settings, parse_section
from litellm_kv.integration.hooks import Handler

G = TypeVar("G")


class GovernanceHandler(Handler, Generic[G]):
    """Base of a handler that acts on groups whose config has a non-empty ``section``."""

    section = ""  # "reasoning" or "vision": the ModelGroupSettings field
    group_settings_cls: type[Any] = object  # the dataclass of the group-level options
    policy_fields: tuple[str, ...] = ()  # keys of the section that are limits, not group options

    def __init__(self, settings: Settings, budgets: PeriodBudgets | None = None) -> None:
        super().__init__(settings)
        self._budgets = budgets
        self._groups: dict[str, G] = {}

    @property
    def budgets(self) -> PeriodBudgets:
        if self._budgets is None:
            self._budgets = make_period_budgets(self.settings.redis_url)
        return self._budgets

    async def shutdown(self) -> None:
        if self._budgets is not None:
            await self._budgets.close()

    def enabled_for(self, group: ModelGroupSettings | None) -> bool:
        return group is not None and bool(getattr(group, self.section))

    def group_settings(self, name: str) -> G:
        gs = self._groups.get(name)
        if gs is None:
            group = self.settings.group(name)
            raw = dict(getattr(group, self.section)) if group is not None else {}
            own = {k: v for k, v in raw.items() if k not in self.policy_fields}
            gs = parse_section(self.group_settings_cls, own, f"litellm_kv.model_groups.{name}.{self.section}")
            self._groups[name] = gs
        return gs
