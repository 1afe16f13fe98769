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

from litellm_kv.config import Settings, load_settings, parse_section
from litellm_kv.errors import ConfigError
from litellm_kv.routing.fleet import replica_id
from litellm_kv.routing.options import KVRoutingSettings

_ENV_PREFIX = "os.environ/"


def _resolved(value: Any) -> Any:
    """LiteLLM's ``os.environ/NAME`` convention for one value (unset: None, as LiteLLM leaves it)."""
    if isinstance(value, str) and value.startswith(_ENV_PREFIX):
        return os.environ.get(value[len(_ENV_PREFIX):])
    return value


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
            params = {k: _resolved(v) for k, v in dict(entry.get("litellm_params") or {}).items()}
            if not params.get("api_base"):
                continue
            info = dict(entry.get("model_info") or {})
            info.setdefault("id", f"{name}-{i}")
            plan.deployments.append({"model_name": name, "litellm_params": params, "model_info": info})
        if plan.deployments:
            groups.append(plan)
        else:
            unrouted.append(name)
    return DeploymentPlan(p, settings, groups, unrouted)


def served_model(deployment: dict[str, Any]) -> str:
    """The name the engine serves a deployment under: LiteLLM's ``hosted_vllm/<name>`` less the provider."""
    model = str(deployment["litellm_params"].get("model") or "")
    return model.split("/", 1)[1] if "/" in model else model


def doctor_options(options: KVRoutingSettings) -> KVRoutingSettings:
    """The group's options as the doctor runs them: every sampled ``BlockStored`` hash is recomputed."""
    return dataclasses.replace(options, exactness_sample_every=1)
