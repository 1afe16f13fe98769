"""One virtual key's litellm-kv metadata, read from a running proxy (``GET /key/info``, ``GET /team/info``)
and resolved against the config as the proxy resolves it per request: key ▸ team ▸ config, strictest wins
(:mod:`litellm_kv.governance`'s own resolvers, so a value that would make every request fail with a 400
here fails the same way)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import httpx

from litellm_kv.config import Settings
from litellm_kv.doctor.report import Report, Status
from litellm_kv.errors import ConfigError, PolicyViolation
from litellm_kv.governance import reasoning, vision_policy
from litellm_kv.governance.policy import Limit, PeriodLimit, config_layer, metadata_layer

_FEATURES = (("reasoning", reasoning.resolve_policy), ("vision", vision_policy.resolve_policy))


async def check_key(settings: Settings, proxy_url: str, key: str, report: Report, *, admin_key: str | None,
                    timeout_s: float) -> None:
    """Findings for ``key``: its metadata parses, and the limits that apply to it on each governed group."""
    target = f"key {hashlib.sha256(key.encode()).hexdigest()[:12]}…"
    base = proxy_url.rstrip("/")
    async with httpx.AsyncClient(base_url=base, timeout=timeout_s) as http:
        info = await _get(http, "/key/info", key, report, target,
                          params={"key": hashlib.sha256(key.encode()).hexdigest()} if admin_key else None,
                          bearer=admin_key or key)
        if info is None:
            return
        row = info.get("info") or {}
        alias = row.get("key_alias")
        if alias:
            target = f"key '{alias}'"
        team_id = row.get("team_id")
        team_md: Any = None
        team_label = None
        if team_id:
            team = await _get(http, "/team/info", key, report, target, params={"team_id": team_id},
                              bearer=admin_key or key, optional=True)
            if team is not None:
                table = team.get("team_info") or {}
                team_md = table.get("metadata")
                team_label = f"team '{table.get('team_alias') or team_id}'"
    report.add("key.found", target, Status.OK,
               f"{base} knows it" + (f" ({team_label or 'team ' + team_id})" if team_id else " (no team)"))
    governed = [(name, g) for name, g in settings.model_groups.items() if g.reasoning or g.vision]
    mk = settings.metadata_key
    if not governed:
        report.add("key.limits", target, Status.OK, "no model group has reasoning or vision limits in the config")
    for group, gs in governed:
        for feature, resolve in _FEATURES:
            section = getattr(gs, feature)
            if not section:
                continue
            try:
                key_layer = metadata_layer(row.get("metadata"), feature, where=target, metadata_key=mk)
                team_layer = (metadata_layer(team_md, feature, where=team_label or f"team '{team_id}'",
                                             metadata_key=mk) if team_id and team_md is not None else None)
                policy = resolve(key_layer, team_layer, config_layer(section, group=group, feature=feature),
                                 key_scope="key", team_scope="team" if team_layer is not None else None)
            except (PolicyViolation, ConfigError) as exc:
                report.add("key.metadata", f"{target} on {group}", Status.ERROR, str(exc),
                           f"edit the key's (or team's) metadata.{mk}.{feature} (docs/key-metadata.md): every "
                           f"request of this key to '{group}' is refused until then")
                continue
            report.add("key.limits", f"{target} on {group}", Status.OK, f"{feature}: {_describe(policy)}")


async def _get(http: httpx.AsyncClient, path: str, key: str, report: Report, target: str, *,
               params: Mapping[str, str] | None, bearer: str, optional: bool = False) -> dict[str, Any] | None:
    try:
        resp = await http.get(path, params=params, headers={"Authorization": f"Bearer {bearer}"})
        body = resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        report.add("key.found", target, Status.ERROR, f"GET {path} failed: {type(exc).__name__}: {exc}",
                   "check --proxy (the LiteLLM proxy's base URL)")
        return None
    if resp.status_code != 200 or not isinstance(body, dict):
        text = str(body)[:200]
        if optional:
            report.add("key.team", target, Status.WARN, f"GET {path}: HTTP {resp.status_code}: {text}",
                       "pass --admin-key to read the team's metadata too")
        else:
            report.add("key.found", target, Status.ERROR, f"GET {path}: HTTP {resp.status_code}: {text}",
                       "check the key (and --admin-key); the proxy needs its database for /key/info")
        return None
    return body


def _describe(policy: Any) -> str:
    parts = []
    for f in dataclasses.fields(policy):
        value = getattr(policy, f.name)
        if isinstance(value, Limit):
            parts.append(f"{f.name}={value.value} ({value.source})")
        elif f.name == "periods":
            parts.extend(f"{_period(p)}" for p in value)
    return ", ".join(parts) or "no limits set"


def _period(p: PeriodLimit) -> str:
    period = getattr(p.period, "value", p.period)
    return f"tokens_per_{period}={p.limit.value} charged to {p.scope_label} ({p.limit.source})"
