"""Configuration of litellm-kv: typed dataclasses, one per concern, each field documented.

The settings live in the LiteLLM ``config.yaml`` under a top-level ``litellm_kv:`` key (LiteLLM
ignores keys it does not know), or in a separate YAML file named by the environment variable
``LITELLM_KV_CONFIG``. Every field carries its documentation in ``metadata["doc"]``; the
configuration reference in ``docs/configuration.md`` is generated from these docstrings
(``python -m tools.docsgen``, a repository tool) and a test checks they agree.

Feature modules declare their own section dataclasses and parse them with :func:`parse_section`;
unknown keys and wrongly typed values are a :class:`~litellm_kv.errors.ConfigError` naming the path.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from litellm_kv.errors import ConfigError

T = TypeVar("T")

CONFIG_ENV = "LITELLM_KV_CONFIG"


def doc(text: str, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its documentation attached (``metadata["doc"]``)."""
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


def _check_type(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _check_type(value, arm, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{path}: {value!r} does not match {tp}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{path}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__}")
        (arg,) = typing.get_args(tp)[:1] or (Any,)
        items = [_check_type(v, arg, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
        kt, vt = typing.get_args(tp) or (Any, Any)
        return {_check_type(k, kt, path): _check_type(v, vt, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return parse_section(tp, value, path)  # type: ignore[type-var,arg-type]
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
    return value


def parse_section(cls: type[T], data: Any, path: str) -> T:
    """Build dataclass ``cls`` from a mapping, checking keys and types; errors name ``path``."""
    if data is None:
        data = {}
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{path}: unknown option(s) {unknown}; known: {sorted(known)}")
    kwargs = {name: _check_type(value, hints[name], f"{path}.{name}") for name, value in data.items()}
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    return obj


@dataclass(slots=True)
class ModelGroupSettings:
    """litellm-kv settings of one LiteLLM model group (``litellm_kv.model_groups.<name>``)."""

    routing: typing.Literal["kv", "affinity", "none"] = doc(
        "Replica choice for this group: 'kv' routes on the engines' KV events (vLLM deployments), "
        "'affinity' pins conversations to deployments for providers without KV events, 'none' leaves "
        "LiteLLM's own routing untouched.",
        default="none",
    )
    kv: dict[str, Any] = doc(
        "KV-aware routing options (see 'kv' section of the reference).", default_factory=dict
    )
    affinity: dict[str, Any] = doc(
        "Prompt-cache affinity options (see 'affinity' section).", default_factory=dict
    )
    reasoning: dict[str, Any] = doc(
        "Group defaults for reasoning budgets (same schema as key metadata 'reasoning').",
        default_factory=dict,
    )
    vision: dict[str, Any] = doc(
        "Group defaults and model family for visual-token limits (see 'vision' section).",
        default_factory=dict,
    )


@dataclass(slots=True)
class RedisRoutingSettings:
    """Bounded waits on Redis for the routing path (``litellm_kv.redis_routing``): the index lookup (with
    the shared load read riding in it), the load store's reads and writes, and the affinity pin resolve.
    Period budgets are not covered here."""

    deadline_ms: float = doc(
        "Longest a routed request waits for one Redis call. Past it the call is abandoned and the request "
        "routes without Redis (load-only for KV groups, LiteLLM's own choice for affinity groups); the "
        "abandoned call counts as a failure towards breaker_failures.",
        default=50.0,
    )
    breaker_failures: int = doc(
        "Consecutive failed or late Redis calls of one store (index, a group's load, pins) that open its "
        "circuit breaker: while open, requests skip Redis at once and route as above.",
        default=3,
    )
    breaker_cooldown_s: float = doc(
        "How long an open breaker skips Redis before letting one probe call through; the probe's success "
        "closes it, its failure opens it for another cool-down. Also the longest routing stays without "
        "Redis after Redis is back.",
        default=2.0,
    )

    def validate(self) -> None:
        if not self.deadline_ms > 0:
            raise ValueError("deadline_ms must be positive")
        if self.breaker_failures < 1:
            raise ValueError("breaker_failures must be at least 1")
        if self.breaker_cooldown_s < 0:
            raise ValueError("breaker_cooldown_s must not be negative")


@dataclass(slots=True)
class BudgetSettings:
    """How period budgets (reasoning and visual tokens) use their store (``litellm_kv.budgets``)."""

    on_store_error: typing.Literal["fail_open", "fail_closed"] = doc(
        "When the budget store (Redis) fails, misses its deadline or its circuit breaker is open: 'fail_open' "
        "serves the request unmetered (as if nothing was used; warning logged, "
        "litellm_kv_budget_store_errors_total counted); 'fail_closed' refuses requests that a period budget "
        "applies to with HTTP 503 and Retry-After: 5 (limit reasoning.store / vision.store).",
        default="fail_open",
    )
    deadline_ms: float = doc(
        "Longest wait for one budget call on the request path (reserve before the call, settle after it); "
        "past it the call counts as a store failure. A request waits at most about this long per governance "
        "handler before the call (later periods are not asked once one failed); settling after the call runs "
        "off the response path. Budget calls run on an event loop of their own (a thread), so the deadline "
        "measures Redis and the network, not how busy the proxy is: a burst of requests does not make a "
        "healthy Redis miss it.",
        default=50.0,
    )
    breaker_failures: int = doc(
        "Consecutive budget-store failures (errors or missed deadlines) that open the circuit breaker: "
        "while it is open, budget calls fail at once without asking Redis (then on_store_error applies).",
        default=3,
    )
    breaker_open_s: float = doc(
        "How long the circuit breaker stays open; then one call probes Redis, and its success closes it.",
        default=2.0,
    )
    hold_ttl_s: float = doc(
        "How long a request's hold on a period budget lives if it is neither settled nor released (a "
        "proxy that died mid-call); a call still running then is charged in full when it ends, but its "
        "tokens no longer count as held in the meantime.",
        default=900.0,
    )

    def validate(self) -> None:
        if self.deadline_ms <= 0:
            raise ValueError("deadline_ms must be > 0")
        if self.breaker_failures < 1:
            raise ValueError("breaker_failures must be >= 1")
        if self.breaker_open_s <= 0 or self.hold_ttl_s <= 0:
            raise ValueError("breaker_open_s and hold_ttl_s must be > 0")


@dataclass(slots=True)
class Settings:
    """Top-level litellm-kv settings (``litellm_kv:`` in the LiteLLM config)."""

    mode: typing.Literal["embedded", "shared"] = doc(
        "'embedded': KV-event subscribers and the index run inside the proxy process (one proxy, "
        "nothing else to run). 'shared': indexer processes write Redis and every proxy reads it.",
        default="embedded",
    )
    redis_url: str | None = doc(
        "Redis URL for shared mode, period budgets and cross-proxy load (redis://[:password@]host:port/db, "
        "rediss:// for TLS). Falls back to the environment variable LITELLM_KV_REDIS_URL.",
        default=None,
    )
    metadata_key: str = doc(
        "Key of the litellm-kv object inside virtual-key and team metadata.", default="litellm_kv"
    )
    salt_secret_env: str = doc(
        "Environment variable holding the secret used to derive per-tenant cache_salt values. Required "
        "when any group sets kv.tenant_isolation: the proxy refuses to start when it is unset, empty or a "
        "placeholder this project has shipped.",
        default="LITELLM_KV_SALT_SECRET",
    )
    redis_routing: RedisRoutingSettings = doc(
        "Deadline and circuit breaker of the Redis calls on the routing path (see 'redis_routing').",
        default_factory=RedisRoutingSettings,
    )
    budgets: BudgetSettings = doc(
        "Period-budget store behaviour: deadline, circuit breaker, fail open or closed, hold lifetime.",
        default_factory=BudgetSettings,
    )
    model_groups: dict[str, ModelGroupSettings] = doc(
        "Per model-group settings, keyed by the LiteLLM model_name.", default_factory=dict
    )
    freeze_startup_heap: bool = doc(
        "After start-up, collect once and gc.freeze() the proxy's heap, so later full garbage collections "
        "(which pause the event loop) walk only objects created by requests. Frozen objects are never "
        "freed, so only start-up state is frozen; false leaves the collector as Python configures it.",
        default=True,
    )

    def group(self, name: str) -> ModelGroupSettings | None:
        return self.model_groups.get(name)


# Placeholders this project has shipped (the compose file's old default): a deployment that kept one
# has a secret every reader of the repository knows.
_PUBLISHED_SALT_SECRETS = frozenset({"litellm-kv-salt-local-only"})


def tenant_isolated_groups(settings: Settings) -> list[str]:
    """KV-routed groups whose ``kv.tenant_isolation`` is on (read raw: the kv section is parsed later)."""
    return sorted(
        name for name, g in settings.model_groups.items()
        if g.routing == "kv" and isinstance(g.kv, dict) and g.kv.get("tenant_isolation", "none") != "none"
    )


def salt_secret(settings: Settings) -> bytes:
    """The secret of the per-tenant ``cache_salt`` HMAC, from the variable ``salt_secret_env`` names.

    Unset, empty or a shipped placeholder is a :class:`ConfigError` naming the variable: with a secret
    anyone can guess, tenant isolation would only look on.
    """
    name = settings.salt_secret_env
    raw = os.environ.get(name, "")
    value = raw.strip()
    groups = ", ".join(tenant_isolated_groups(settings)) or "(none)"
    why = None
    if not value:
        why = "is unset or empty"
    elif value in _PUBLISHED_SALT_SECRETS:
        why = "holds a default shipped with litellm-kv"
    if why is not None:
        raise ConfigError(
            f"{name} (litellm_kv.salt_secret_env) {why}, but kv.tenant_isolation is on for group(s) {groups}: "
            f"set it to a long random string (for example `openssl rand -hex 32`), the same on every proxy"
        )
    return raw.encode()  # as set: stripping would change every tenant's salt for existing deployments


def load_settings(path: str | os.PathLike[str] | None = None) -> Settings:
    """Load settings from ``path`` (a LiteLLM config with a ``litellm_kv`` key, or a bare section)."""
    if path is None:
        path = os.environ.get(CONFIG_ENV)
    if path is None:
        return Settings()
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read litellm-kv config {p}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}") from exc
    if isinstance(raw, dict) and "litellm_kv" in raw:
        raw = raw["litellm_kv"]
    settings = parse_section(Settings, raw, "litellm_kv")
    if settings.redis_url is None:
        settings.redis_url = os.environ.get("LITELLM_KV_REDIS_URL")
    if tenant_isolated_groups(settings):
        salt_secret(settings)  # refuse to start without a real secret, rather than isolate with a guessable one
    return settings
