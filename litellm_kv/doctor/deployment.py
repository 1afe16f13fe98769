"""The deployment as its LiteLLM config file describes it: litellm-kv's section (parsed by
:func:`litellm_kv.config.load_settings`, the proxy's own parser) and the ``model_list`` entries of each
KV-routed group, with ``os.environ/NAME`` values resolved as LiteLLM resolves them."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from litellm_kv import addresses
from litellm_kv.config import Settings, guarded_sections, load_settings, parse_section
from litellm_kv.errors import ConfigError
from litellm_kv.routing.fleet import replica_id
from litellm_kv.routing.options import KVRoutingSettings

_ENV_PREFIX = "os.environ/"


def _resolved(value: Any) -> Any:
    """LiteLLM's ``os.environ/NAME`` convention for one value (unset: None, as LiteLLM leaves it)."""
    if isinstance(value, str) and value.startswith(_ENV_PREFIX):
        return os.environ.get(value[len(_ENV_PREFIX):])
    return value


def _credentials(raw: Any) -> dict[str, dict[str, Any]]:
    """LiteLLM's ``credential_list``: each credential's values by name (``os.environ/`` references resolved)."""
    listed = raw.get("credential_list") if isinstance(raw, dict) else None
    return {str(c["credential_name"]): {k: _resolved(v) for k, v in dict(c.get("credential_values") or {}).items()}
            for c in listed or [] if isinstance(c, dict) and c.get("credential_name")}


def _params(entry: dict[str, Any], credentials: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A ``model_list`` entry's ``litellm_params`` as LiteLLM calls it: references resolved, and, where it names no
    ``api_base``, its own ``base_url``, else the ``api_base`` or ``base_url`` of the credential it names
    (``litellm_credential_name``), as the proxy places it."""
    params = {k: _resolved(v) for k, v in dict(entry.get("litellm_params") or {}).items()}
    named = credentials.get(str(params.get("litellm_credential_name") or ""), {})
    for place, key in ((params, "base_url"), (named, "api_base"), (named, "base_url")):
        if not params.get("api_base") and isinstance(place.get(key), str) and place[key]:
            params["api_base"] = place[key]
    return params


@dataclass(slots=True)
class KVGroupPlan:
    """One ``routing: kv`` group: its options and its deployments (``litellm_params`` values resolved)."""

    name: str
    options: KVRoutingSettings
    deployments: list[dict[str, Any]] = field(default_factory=list)

    def replicas(self) -> list[str]:
        return [replica_id(d["litellm_params"]["api_base"]) for d in self.deployments]


@dataclass(slots=True)
class DeploymentPlan:
    """What the config says should be running."""

    path: Path
    settings: Settings
    groups: list[KVGroupPlan]
    unrouted: list[str]  # KV-routed groups with no deployment that has an api_base
    model_list: list[dict[str, Any]] = field(default_factory=list)  # every entry, litellm_params resolved
    aliases: dict[str, str] = field(default_factory=dict)  # router_settings.model_group_alias


def read_deployment(path: str | os.PathLike[str]) -> DeploymentPlan:
    """Parse ``path`` (a LiteLLM config with a ``litellm_kv`` section). Raises :class:`ConfigError`."""
    p = Path(path)
    settings = load_settings(p)
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:  # load_settings read it already; a race at most
        raise ConfigError(f"cannot read {p}: {exc}") from exc
    models = raw.get("model_list") or [] if isinstance(raw, dict) else []
    if not isinstance(models, list):
        raise ConfigError(f"{p}: model_list is not a list")
    credentials = _credentials(raw)
    entries = [{"model_name": str(e.get("model_name") or ""), "litellm_params": _params(e, credentials)}
               for e in models if isinstance(e, dict)]
    router = raw.get("router_settings") if isinstance(raw, dict) else None
    aliases = (router or {}).get("model_group_alias") if isinstance(router, dict) else None
    aliases = {str(k): str(v if not isinstance(v, dict) else v.get("model")) for k, v in (aliases or {}).items()}
    groups: list[KVGroupPlan] = []
    unrouted: list[str] = []
    for name, g in settings.model_groups.items():
        if g.routing != "kv":
            continue
        opts = parse_section(KVRoutingSettings, g.kv, f"litellm_kv.model_groups.{name}.kv")
        plan = KVGroupPlan(name, opts)
        for i, entry in enumerate(models):
            if not isinstance(entry, dict) or entry.get("model_name") != name:
                continue
            params = _params(entry, credentials)
            if not params.get("api_base"):
                continue
            info = dict(entry.get("model_info") or {})
            info.setdefault("id", f"{name}-{i}")
            plan.deployments.append({"model_name": name, "litellm_params": params, "model_info": info})
        if plan.deployments:
            groups.append(plan)
        else:
            unrouted.append(name)
    return DeploymentPlan(p, settings, groups, unrouted, entries, aliases)


async def names_over_guarded_engines(plan: DeploymentPlan,
                                     resolver: addresses.Resolver | None = None) -> dict[str, dict[str, list[str]]]:
    """The ``model_list`` names without a ``litellm_kv.model_groups`` entry (and not an alias of a configured
    group) that share a vLLM server with a group that has reasoning or vision limits or ``kv.tenant_isolation``:
    the proxy refuses their requests (``governance.model_name``), since what that group guards would not follow
    them. Servers are compared as the proxy compares them: by address however the host is written, DNS names
    resolved (a name that does not resolve, as written). Name → {guarded group: its guarded sections}. Only
    vLLM deployments with an ``api_base`` are compared; the proxy also matches other providers by their model."""
    guarded = {name: [s.replace("_", " ") for s in sections]
               for name, sections in guarded_sections(plan.settings).items()}
    resolver = resolver or addresses.Resolver()

    async def vllm_servers(entry: dict[str, Any]) -> frozenset[addresses.Server]:
        params = entry["litellm_params"]
        if not str(params.get("model") or "").startswith("hosted_vllm/") or not params.get("api_base"):
            return frozenset()
        url = str(params["api_base"])
        try:
            return await resolver.servers(url)
        except addresses.UnresolvedHost:
            written = addresses.server(url)
            return frozenset() if written is None else frozenset({written})

    entries = [(entry["model_name"], await vllm_servers(entry)) for entry in plan.model_list]
    engines = [(servers, name) for name, servers in entries if servers and name in guarded]
    found: dict[str, dict[str, list[str]]] = {}
    for name, servers in entries:
        if not servers or name in plan.settings.model_groups or plan.aliases.get(name) in plan.settings.model_groups:
            continue
        for group in sorted({g for engine, g in engines if engine & servers}):
            found.setdefault(name, {})[group] = guarded[group]
    return found


def served_model(deployment: dict[str, Any]) -> str:
    """The name the engine serves a deployment under: LiteLLM's ``hosted_vllm/<name>`` less the provider."""
    model = str(deployment["litellm_params"].get("model") or "")
    return model.split("/", 1)[1] if "/" in model else model


def doctor_options(options: KVRoutingSettings) -> KVRoutingSettings:
    """The group's options as the doctor runs them: every sampled ``BlockStored`` hash is recomputed."""
    return dataclasses.replace(options, exactness_sample_every=1)
