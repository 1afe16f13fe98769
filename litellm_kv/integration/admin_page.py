"""The litellm-kv admin page: one key's or team's limits, usage and refusals, and the fleet's routing health.

``GET /litellm-kv/ui`` serves a static page (``static/admin.html``, ``.js``, ``.css``: no build step, no data
in it); everything it shows comes from the admin-only JSON routes below, called with the admin's own
credentials: the session of LiteLLM's admin UI (its ``token`` cookie, as LiteLLM's dashboard reads it), or
a master or admin key typed into the page. Edits are saved through LiteLLM's own ``/key/update`` and
``/team/update`` (read, merge, write the whole ``metadata``), so they take LiteLLM's permission checks and
database path and any save-time check installed there; before that, the page asks
``POST /litellm-kv/admin/check`` for every problem of the new settings, each naming its field.

* ``GET /litellm-kv/admin/owner?key=…`` (the key or its hash, LiteLLM's "Key ID") or ``?team_id=…``: the
  stored ``litellm_kv`` settings (as LiteLLM's database holds them now), their problems, usage of each
  period budget that applies (reasoning and visual tokens, from the same store the request path charges),
  and the owner's recent refusals on this proxy process. Without a database: 503 ``no_database``.
* ``POST /litellm-kv/admin/check`` ``{"kind", "id", "litellm_kv": {...}}``: ``{"errors": [{field, message,
  value}]}``, empty when the settings would be accepted.
* ``GET /litellm-kv/admin/fleet``: per KV-routed group its exactness, replicas, prediction accuracy, hit
  rates, routing decisions and fallbacks (this process's counters), refusals by limit, Redis breakers.

All ``/litellm-kv/admin/*`` routes need a proxy admin (``litellm_kv.integration.admin``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from typing import Any

from litellm_kv.config import Settings
from litellm_kv.errors import MetadataError
from litellm_kv.governance import metadata, reasoning, vision_policy
from litellm_kv.governance.budgets import BudgetStoreUnfit, Period, PeriodBudgets
from litellm_kv.governance.policy import (
    PeriodLimit,
    PolicyLayer,
    config_layer,
    metadata_layer,
    period_limits,
    read_kv_settings,
)
from litellm_kv.integration.governance import key_budget_scope, team_budget_scope
from litellm_kv.integration.hooks import Caller, Handler
from litellm_kv.integration.refusals import RecentRefusals
from litellm_kv.integration.workers import status as workers_status
from litellm_kv.redis_client import guard_status
from litellm_kv.redis_eviction import status as eviction_status

#: Feature sections an owner's ``litellm_kv`` object may hold: their period fields and meter (the fields
#: themselves are :data:`litellm_kv.governance.metadata.SECTIONS`).
SECTIONS: dict[str, tuple[Mapping[Period, str], str]] = {
    "reasoning": (reasoning.PERIOD_FIELDS, "reasoning_tokens"),
    "vision": (vision_policy.PERIOD_FIELDS, "visual_tokens"),
}

#: Refusals listed per owner.
REFUSALS_SHOWN = 50

STATIC = ("admin.html", "admin.js", "admin.css")


def static_file(name: str) -> str:
    """One of the page's files, read from the package (``litellm_kv/integration/static/``)."""
    if name not in STATIC:
        raise KeyError(name)
    return resources.files("litellm_kv.integration").joinpath("static", name).read_text(encoding="utf-8")


# -- the form's fields --------------------------------------------------------------------------------
def form_fields() -> dict[str, list[dict[str, Any]]]:
    """Per section, each field the page edits, from the same declarations the save-time check and the JSON
    Schema use: its name, kind (integer, boolean, choice), choices, minimum and description."""
    return {
        section: [{"name": spec.name, "kind": spec.kind, "choices": list(spec.choices), "minimum": spec.minimum,
                   "description": spec.description} for spec in specs]
        for section, specs in metadata.SECTIONS.items()
    }


# -- checking settings before they are saved -----------------------------------------------------------
def field_errors(kv: Any, *, where: str, metadata_key: str) -> list[dict[str, Any]]:
    """Every problem of one ``litellm_kv`` object, each naming its field (``[]``: it would be accepted): the
    save-time check of ``/key/update`` and ``/team/update`` (:func:`litellm_kv.governance.metadata
    .validate_kv_settings`), asked before the page writes anything."""
    return [e.to_json() for e in metadata.validate_kv_settings(kv, metadata_key=metadata_key, where=where)]


# -- one key's or team's view ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Owner:
    """Whose settings the page shows: a key (with its team, if any) or a team alone."""

    kind: str  # "key" or "team"
    caller: Caller

    @property
    def id(self) -> str:
        return str(self.caller.key_hash if self.kind == "key" else self.caller.team_id)

    @property
    def label(self) -> str:
        return self.caller.key_label if self.kind == "key" else self.caller.team_label

    def metadata(self) -> Any:
        return self.caller.key_metadata if self.kind == "key" else self.caller.team_metadata


def _section_of(metadata: Any, section: str, *, where: str, metadata_key: str) -> tuple[PolicyLayer, str | None]:
    """The owner's layer for one section, or an empty one and the problem that made it unreadable."""
    try:
        return metadata_layer(metadata, section, where=where, metadata_key=metadata_key), None
    except MetadataError as exc:
        return PolicyLayer(where, f"metadata.{metadata_key}.{section}", {}, True), exc.message


def _stored_object(metadata: Any, *, where: str, metadata_key: str) -> tuple[dict[str, Any], str | None]:
    try:
        return {k: v for k, v in read_kv_settings(metadata, metadata_key=metadata_key, where=where).items()}, None
    except MetadataError as exc:
        return {}, exc.message


def _groups_with(settings: Settings, section: str) -> list[str]:
    return sorted(name for name, g in settings.model_groups.items() if getattr(g, section, None))


def _limits(settings: Settings, owner: Owner, section: str, period_fields: Mapping[Period, str]) -> list[PeriodLimit]:
    """Every period budget of ``section`` that bounds the owner: its own, its team's, and the per-key defaults
    of each model group's config (a key's usage is one counter whatever group it was spent in)."""
    mk = settings.metadata_key
    caller = owner.caller
    key_scope = key_budget_scope(caller)
    team_scope = team_budget_scope(caller.team_id) if caller.team_id else None
    if owner.kind == "key":
        key, _ = _section_of(caller.key_metadata, section, where=caller.key_label, metadata_key=mk)
    else:
        key = PolicyLayer(caller.team_label, "-", {}, True)
    team = None
    if caller.team_id:
        team, _ = _section_of(caller.team_metadata, section, where=caller.team_label, metadata_key=mk)
    configs = [config_layer({}, group="-", feature=section)]
    for name in _groups_with(settings, section):
        group = settings.group(name)
        values = {f: v for f, v in (getattr(group, section) or {}).items() if f in period_fields.values()}
        configs.append(config_layer(values, group=name, feature=section))
    found: dict[tuple[str, str, int, str], PeriodLimit] = {}
    for cfg in configs:
        try:
            pls = period_limits(key, team, cfg, period_fields, key_scope=key_scope, team_scope=team_scope)
        except MetadataError:
            continue  # a bad field is reported with the stored settings' problems
        for pl in pls:
            if owner.kind == "team" and pl.scope != team_scope:
                continue
            found.setdefault((pl.scope, pl.period.value, pl.limit.value, pl.limit.source), pl)
    order = list(Period)
    return sorted(found.values(), key=lambda pl: (pl.scope != key_scope, order.index(pl.period), pl.limit.value))


async def _usage(budgets: PeriodBudgets | None, meter: str, section: str, pls: Iterable[PeriodLimit],
                 now: datetime) -> list[dict[str, Any]]:
    rows = []
    for pl in pls:
        row: dict[str, Any] = {
            "section": section, "meter": meter, "period": pl.period.value, "scope": pl.scope,
            "scope_label": pl.scope_label, "limit": pl.limit.value, "source": pl.limit.source,
            "reset_at": pl.period.window(now)[1].isoformat(),
        }
        if budgets is None:
            row["error"] = f"{section} is not enabled on this proxy: nothing is metered"
        else:
            try:
                state = await budgets.check(pl.scope, meter, pl.period, pl.limit.value, now=now)
            except BudgetStoreUnfit as exc:  # several workers and no Redis: nothing is enforced, say why
                row["error"] = f"not enforced: {exc}"
            except Exception as exc:  # the store is down and fails closed: say so instead of a number
                row["error"] = f"budget store unavailable ({type(exc).__name__})"
            else:
                row.update(used=state.used, held=state.held, remaining=state.remaining, metered=state.metered)
                if not state.metered:
                    row["error"] = "budget store unavailable (failing open): usage unknown"
        rows.append(row)
    return rows


async def owner_view(settings: Settings, handlers: Mapping[str, Handler | None], refusals: RecentRefusals,
                     owner: Owner) -> dict[str, Any]:
    """Everything the page shows about one key or team (JSON-ready)."""
    mk = settings.metadata_key
    caller = owner.caller
    stored, _ = _stored_object(owner.metadata(), where=owner.label, metadata_key=mk)
    errors = [e.to_json() for e in metadata.validate_metadata(owner.metadata(), metadata_key=mk, where=owner.label)]
    team: dict[str, Any] | None = None
    if owner.kind == "key" and caller.team_id:
        team_stored, team_unreadable = _stored_object(caller.team_metadata, where=caller.team_label, metadata_key=mk)
        team = {"id": caller.team_id, "label": caller.team_label, "litellm_kv": team_stored,
                "problem": team_unreadable}
    now = datetime.now(timezone.utc)
    usage: list[dict[str, Any]] = []
    for section, (period_fields, meter) in SECTIONS.items():
        budgets = getattr(handlers.get(section), "budgets", None)
        usage.extend(await _usage(budgets, meter, section, _limits(settings, owner, section, period_fields), now))
    shown = (refusals.latest(key_hash=caller.key_hash, limit=REFUSALS_SHOWN) if owner.kind == "key"
             else refusals.latest(team_id=caller.team_id, limit=REFUSALS_SHOWN))
    return {
        "kind": owner.kind,
        "id": owner.id,
        "label": owner.label,
        "alias": caller.key_alias if owner.kind == "key" else caller.team_alias,
        "metadata_key": mk,
        "litellm_kv": stored,
        "errors": errors,
        "team": team,
        "applies_to": {section: _groups_with(settings, section) for section in SECTIONS},
        "enabled": {section: handlers.get(section) is not None for section in SECTIONS},
        "usage": usage,
        "refusals": [r.to_json() for r in shown],
        "refusals_scope": f"this proxy process (pid {os.getpid()})",
        "fields": form_fields(),
    }


# -- the fleet -------------------------------------------------------------------------------------------
def _samples() -> dict[str, list[tuple[dict[str, str], float]]]:
    """This process's litellm-kv metric samples by sample name (``…_total`` for counters)."""
    from prometheus_client import REGISTRY

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in REGISTRY.collect():
        if not family.name.startswith("litellm_kv_"):
            continue
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _by(samples: Mapping[str, list[tuple[dict[str, str], float]]], name: str, label: str,
        where: Mapping[str, str]) -> dict[str, float]:
    """Sum of ``name`` per value of ``label``, over the samples whose labels match ``where``."""
    out: dict[str, float] = {}
    for labels, value in samples.get(name, []):
        if all(labels.get(k) == v for k, v in where.items()):
            key = labels.get(label, "")
            out[key] = out.get(key, 0.0) + value
    return {k: v for k, v in out.items() if v}


def _total(samples: Mapping[str, list[tuple[dict[str, str], float]]], name: str, group: str) -> float:
    return sum(v for labels, v in samples.get(name, []) if labels.get("model_group") == group)


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def fleet_view(kv: Any, affinity: Any, settings: Settings) -> dict[str, Any]:
    """The fleet as this proxy process sees it: ``/litellm-kv/health`` and the counters behind the metrics."""
    samples = _samples()
    health = kv.health() if kv is not None else None
    groups: dict[str, Any] = {}
    for name, g in ((health or {}).get("groups") or {}).items():
        where = {"model_group": name}
        checks = _by(samples, "litellm_kv_prediction_checks_total", "outcome", where)
        compared = sum(checks.get(o, 0.0) for o in ("exact", "under", "over"))
        prompt = _total(samples, "litellm_kv_routed_prompt_tokens_total", name)
        groups[name] = {
            **g,
            "decisions": _by(samples, "litellm_kv_routing_decisions_total", "reason", where),
            "fallbacks": _by(samples, "litellm_kv_routing_fallbacks_total", "why", where),
            "prediction_checks": checks,
            "prediction_accuracy": _ratio(checks.get("exact", 0.0), compared),
            "prompt_tokens": prompt,
            "predicted_cached_tokens": _total(samples, "litellm_kv_predicted_cached_tokens_total", name),
            "actual_cached_tokens": _total(samples, "litellm_kv_actual_cached_tokens_total", name),
            "hit_rate": _ratio(_total(samples, "litellm_kv_actual_cached_tokens_total", name), prompt),
            "predicted_hit_rate": _ratio(_total(samples, "litellm_kv_predicted_cached_tokens_total", name), prompt),
        }
    affinity_groups: dict[str, Any] = {}
    if affinity is not None:
        names = {labels.get("group", "") for labels, _ in samples.get("litellm_kv_affinity_hits_total", [])}
        names |= {labels.get("group", "") for labels, _ in samples.get("litellm_kv_affinity_misses_total", [])}
        for name in sorted(n for n in names if n):
            hits = _total_by(samples, "litellm_kv_affinity_hits_total", "group", name)
            misses = _by(samples, "litellm_kv_affinity_misses_total", "reason", {"group": name})
            affinity_groups[name] = {"hits": hits, "misses": misses,
                                     "hit_rate": _ratio(hits, hits + sum(misses.values()))}
    return {
        "at": time.time(),
        "process": f"pid {os.getpid()}",
        "workers": workers_status(settings),
        "redis_eviction": eviction_status(),
        "mode": (health or {}).get("mode"),
        "hashing": (health or {}).get("hashing"),
        "kv_routing": health is not None,
        "groups": groups,
        "affinity": affinity_groups,
        "refusals": _refusal_counts(samples),
        "redis": guard_status(),
    }


def _total_by(samples: Mapping[str, list[tuple[dict[str, str], float]]], name: str, label: str, value: str) -> float:
    return sum(v for labels, v in samples.get(name, []) if labels.get(label) == value)


def _refusal_counts(samples: Mapping[str, list[tuple[dict[str, str], float]]]) -> list[dict[str, Any]]:
    rows = [{"limit": labels.get("limit", ""), "status": labels.get("status", ""), "count": value}
            for labels, value in samples.get("litellm_kv_policy_rejections_total", []) if value]
    return sorted(rows, key=lambda r: -r["count"])
