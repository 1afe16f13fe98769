"""Configuration of litellm-kv: typed dataclasses, one per concern, each field documented.

The settings live in the LiteLLM ``config.yaml`` under a top-level ``litellm_kv:`` key (LiteLLM
ignores keys it does not know), or in a separate YAML file named by the environment variable
``LITELLM_KV_CONFIG``. Every field carries its documentation in ``metadata["doc"]``; the
configuration reference in ``docs/configuration.md`` is generated from these docstrings
(``python -m tools.docsgen``, a repository tool) and a test checks they agree.

Feature modules declare their own section dataclasses and parse them with :func:`parse_section`;
unknown keys and wrongly typed values are a :class:`~litellm_kv.errors.ConfigError` naming the path.

Values written ``os.environ/NAME`` are resolved before parsing, everywhere in the section, the way LiteLLM
resolves its own config (:func:`resolve_env_refs`), so one config file reads the same to both.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from litellm_kv.errors import ConfigError

T = TypeVar("T")

log = logging.getLogger("litellm_kv")

CONFIG_ENV = "LITELLM_KV_CONFIG"
#: Where a Redis can be configured, for the messages that ask for one (the order of :meth:`Settings.redis_for`).
REDIS_SOURCES = "litellm_kv.redis or redis_url (or LITELLM_KV_REDIS_URL, or LiteLLM's cache Redis)"

#: The prefix of a value LiteLLM reads from the environment (``redis_url: os.environ/REDIS_URL``).
ENV_REF_PREFIX = "os.environ/"
# LiteLLM's DEFAULT_MAX_RECURSE_DEPTH: nesting below it is left as written.
_MAX_ENV_DEPTH = 100

#: Reads one ``os.environ/NAME`` reference (the whole string) and returns its value.
SecretLookup = Callable[[str], Any]


class EnvText(str):
    """Text read from an ``os.environ/NAME`` reference. The environment only holds text, so where the option
    is a number the parser reads the number from it (as LiteLLM's pydantic settings do), and its errors name
    the reference."""

    reference: str

    def __new__(cls, text: str, reference: str) -> EnvText:
        obj = super().__new__(cls, text)
        obj.reference = reference
        return obj


def env_secret(reference: str) -> Any:
    """The value of an ``os.environ/NAME`` reference as LiteLLM 1.110.2's ``get_secret`` gives it without a
    secret manager: the variable's text, ``True``/``False`` for the words true/false (any case, spaces
    around ignored), and ``None`` when the variable is unset. The proxy passes LiteLLM's own function
    instead (see ``integration.callback``), which also asks a configured secret manager."""
    value = os.environ.get(reference.removeprefix(ENV_REF_PREFIX))
    if value is not None and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def resolve_env_refs(
    data: Any, lookup: SecretLookup = env_secret, path: str = "litellm_kv", unset: list[str] | None = None,
    _depth: int = 0,
) -> Any:
    """``data`` with every ``os.environ/NAME`` value replaced by ``lookup(value)``, walked as LiteLLM walks
    its config: into mappings at any depth and into mappings inside lists, but a list's own string items
    stay as written (LiteLLM does not resolve them either). A reference that resolves to None (an unset
    variable) is recorded in ``unset`` as ``"<path> (os.environ/NAME)"``, for the error message."""
    if not isinstance(data, dict) or _depth > _MAX_ENV_DEPTH:
        return data
    out: dict[Any, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}"
        if isinstance(value, dict):
            out[key] = resolve_env_refs(value, lookup, where, unset, _depth + 1)
        elif isinstance(value, list):
            out[key] = [resolve_env_refs(item, lookup, f"{where}[{i}]", unset, _depth + 1)
                        if isinstance(item, dict) else item for i, item in enumerate(value)]
        elif isinstance(value, str) and value.startswith(ENV_REF_PREFIX):
            resolved = lookup(value)
            out[key] = EnvText(resolved, value) if isinstance(resolved, str) else resolved
            if resolved is None and unset is not None:
                unset.append(f"{where} ({value})")
        else:
            out[key] = value
    return out


def parse_with_env(cls: type[T], raw: Any, path: str, lookup: SecretLookup = env_secret) -> T:
    """:func:`parse_section` after :func:`resolve_env_refs`; an error names the unset variables it read."""
    unset: list[str] = []
    data = resolve_env_refs(raw, lookup, path, unset)
    for ref in unset:
        log.warning("litellm-kv: %s is unset; the option reads as null", ref)
    try:
        return parse_section(cls, data, path)
    except ConfigError as exc:
        if not unset:
            raise
        raise ConfigError(f"{exc} (unset environment variables, read as null: {', '.join(unset)})") from exc


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
        return str(value) if isinstance(value, EnvText) else value
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
    if isinstance(value, EnvText):
        return _env_text_as(value, tp, path)
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


def _env_text_as(value: EnvText, tp: Any, path: str) -> Any:
    """An option written as an ``os.environ/NAME`` reference: a number read from its text, else plain text."""
    if tp is int or tp is float:
        try:
            return tp(value.strip())
        except ValueError:
            kind = "an integer" if tp is int else "a number"
            raise ConfigError(f"{path}: {value.reference} is {str(value)!r}, not {kind}") from None
    if tp is bool:
        raise ConfigError(f"{path}: {value.reference} is {str(value)!r}, not true or false")
    return _check_type(str(value), tp, path)


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
class RedisSentinelSettings:
    """A Redis master found through Sentinel (``redis.sentinel``): redis-py's ``Sentinel`` client asks the
    sentinels for the current master and asks again after a failover."""

    master: str = doc("Name of the monitored master (the name in the sentinels' 'sentinel monitor <name> ...').")
    nodes: list[str] = doc("The sentinels, as host:port (at least one; list them all so any can answer).")
    username: str | None = doc("Username of the sentinels themselves (ACL), when they require one.", default=None)
    password: str | None = doc(
        "Password of the sentinels themselves (their requirepass), when they require one; the master's own "
        "credentials are the enclosing redis.username / redis.password.",
        default=None,
    )

    def validate(self) -> None:
        if not self.master:
            raise ValueError("master must name the monitored master")
        if not self.nodes:
            raise ValueError("nodes must list at least one sentinel (host:port)")
        for node in self.nodes:
            host_port(node)


@dataclass(slots=True)
class RedisSettings:
    """Where a Redis lives and how to log in (``litellm_kv.redis``, ``litellm_kv.budgets.redis``, the indexer's
    ``redis``): exactly one of ``url`` (one server), ``cluster_nodes`` (Redis Cluster, through redis-py's
    ``RedisCluster``) or ``sentinel`` (a master found through Redis Sentinel). Credentials and TLS are
    redis-py's own connection options and apply to every server of the cluster or to the sentinel's master.
    """

    url: str | None = doc(
        "One Redis server: redis://[[user]:password@]host:port/db, rediss:// for TLS.", default=None
    )
    cluster_nodes: list[str] | None = doc(
        "Redis Cluster: some of its nodes as host:port (the client learns the rest and follows failovers and "
        "resharding). Every key litellm-kv writes carries a hash tag, so one model group's index, load and "
        "pins, and one budget scope's counters, each live in one slot.",
        default=None,
    )
    sentinel: RedisSentinelSettings | None = doc(
        "Redis Sentinel: the master's name and the sentinels (see 'redis.sentinel').", default=None
    )
    username: str | None = doc("Username (Redis ACL) of the data servers; with url, the URL's own wins.",
                               default=None)
    password: str | None = doc(
        "Password of the data servers (use os.environ/NAME to keep it out of the file); with url, the URL's own "
        "wins.",
        default=None,
    )
    db: int = doc("Database number (single server or sentinel; a cluster has only database 0).", default=0)
    ssl: bool = doc("TLS to the data servers (a rediss:// url implies it).", default=False)
    ssl_ca_certs: str | None = doc("TLS: file of the CA certificates that sign the servers' certificates.",
                                   default=None)
    ssl_certfile: str | None = doc("TLS: client certificate file (mutual TLS).", default=None)
    ssl_keyfile: str | None = doc("TLS: client key file (mutual TLS).", default=None)
    ssl_cert_reqs: typing.Literal["required", "optional", "none"] = doc(
        "TLS: whether the server's certificate must verify ('none' only for tests).", default="required"
    )
    ssl_check_hostname: bool = doc("TLS: check that the certificate names the host connected to.",
                                   default=True)

    def validate(self) -> None:
        given = [name for name, v in (("url", self.url), ("cluster_nodes", self.cluster_nodes),
                                      ("sentinel", self.sentinel)) if v]
        if len(given) != 1:
            raise ValueError(f"set exactly one of url, cluster_nodes, sentinel (got {given or 'none'})")
        for node in self.cluster_nodes or ():
            host_port(node)
        if self.cluster_nodes and self.db:
            raise ValueError("a Redis Cluster has only database 0")

    @property
    def kind(self) -> typing.Literal["single", "cluster", "sentinel"]:
        return "cluster" if self.cluster_nodes else "sentinel" if self.sentinel else "single"


def host_port(node: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``, or ``redis://host:port``) as a pair; a ValueError names a bad one."""
    text = node.split("://", 1)[-1].rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{node!r} is not host:port")
    return host.strip("[]"), int(port)


@dataclass(slots=True)
class BudgetSettings:
    """How period budgets (reasoning and visual tokens) use their store (``litellm_kv.budgets``)."""

    on_store_error: typing.Literal["fail_open", "fail_closed"] = doc(
        "When the budget store (Redis) fails, misses its deadline or its circuit breaker is open: 'fail_open' "
        "serves the request without the store, within what this proxy knows is left (the usage the store last "
        "reported for that budget, less the holds of this proxy's own requests in flight; a budget it never "
        "saw counts as unused; warning logged, litellm_kv_budget_store_errors_total counted), so a budget it "
        "saw spent stays spent; 'fail_closed' refuses requests that a period budget "
        "applies to with HTTP 503 and Retry-After: 5 (limit reasoning.store / vision.store).",
        default="fail_open",
    )
    deadline_ms: float = doc(
        "Longest wait for one budget call on the request path (reserve before the call, settle after it); "
        "past it the call counts as a store failure. A request waits at most about this long per governance "
        "handler before the call (later periods are not asked once one failed); settling after the call runs "
        "off the response path. Budget calls run on an event loop of their own (a thread), so the deadline "
        "measures Redis and the network, not how busy the proxy is: a burst of requests does not make a "
        "healthy Redis miss it. Time that thread was not scheduled (no CPU, or another thread holding the "
        "interpreter lock) does not count either, up to four deadlines of wall time in all.",
        default=150.0,
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
    redis: RedisSettings | None = doc(
        "A Redis of their own for period budgets (which need persistence: AOF or RDB snapshots, and a "
        "replica) when the index and load live in one that need not persist. None: the one of "
        "litellm_kv.redis / redis_url (or in memory without one).",
        default=None,
    )

    def validate(self) -> None:
        if self.deadline_ms <= 0:
            raise ValueError("deadline_ms must be > 0")
        if self.breaker_failures < 1:
            raise ValueError("breaker_failures must be >= 1")
        if self.breaker_open_s <= 0 or self.hold_ttl_s <= 0:
            raise ValueError("breaker_open_s and hold_ttl_s must be > 0")


@dataclass(frozen=True, slots=True)
class StorePlace:
    """One store of a configuration (``use``: budgets, index, load, pins) and its Redis (``None``: the proxy
    process's memory)."""

    use: str
    redis: RedisSettings | None


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
        "rediss:// for TLS): the short form of redis: {url: ...}. Falls back to the environment variable "
        "LITELLM_KV_REDIS_URL.",
        default=None,
    )
    redis: RedisSettings | None = doc(
        "The Redis of shared mode, period budgets, cross-proxy load and affinity pins: one server, a Redis "
        "Cluster or a Sentinel-managed master (see 'redis'). Which wins: this, then redis_url, then "
        "LITELLM_KV_REDIS_URL, then LiteLLM's own cache Redis (litellm_settings.cache: true with "
        "cache_params.type redis, as LiteLLM reads it: url/host/port/password/ssl, redis_startup_nodes, "
        "sentinel_nodes + service_name, and the REDIS_* environment variables); none of these: in memory.",
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
    redis_eviction_check_s: float = doc(
        "How often the proxy reads, from each Redis its stores use, maxmemory, maxmemory-policy and evicted_keys "
        "(INFO): a Redis that may delete their keys when full is reported, and once it has deleted keys, period "
        "budgets kept there are refused and a shared index there routes load-only (docs/operations.md).",
        default=60.0,
    )
    freeze_startup_heap: bool = doc(
        "After start-up, collect once and gc.freeze() the proxy's heap, so later full garbage collections "
        "(which pause the event loop) walk only objects created by requests. Frozen objects are never "
        "freed, so only start-up state is frozen; false leaves the collector as Python configures it.",
        default=True,
    )

    def group(self, name: str) -> ModelGroupSettings | None:
        return self.model_groups.get(name)

    def redis_for(self, use: typing.Literal["index", "load", "pins", "budgets"] = "index") -> RedisSettings | None:
        """The Redis a store uses (budgets may have their own), or None when there is none (in memory)."""
        if use == "budgets" and self.budgets.redis is not None:
            return self.budgets.redis
        if self.redis is not None:
            return self.redis
        return RedisSettings(url=self.redis_url) if self.redis_url else None

    def stores(self) -> list[StorePlace]:
        """The stores this configuration's groups use, each with where it keeps its state: period budgets (groups
        with reasoning or vision limits), the KV index and load (KV-routed groups; in the process in embedded
        mode) and affinity pins (listed twice when some groups keep them in memory and others in Redis)."""
        groups = self.model_groups.values()
        out: list[StorePlace] = []
        if any(g.reasoning or g.vision for g in groups):
            out.append(StorePlace("budgets", self.redis_for("budgets")))
        if any(g.routing == "kv" for g in groups):
            shared = self.mode == "shared"
            out.append(StorePlace("index", self.redis_for("index") if shared else None))
            out.append(StorePlace("load", self.redis_for("load") if shared else None))
        pins = self.redis_for("pins")
        kinds = set()
        for g in groups:
            if g.routing == "affinity":
                store = g.affinity.get("store", "auto") if isinstance(g.affinity, dict) else "auto"
                # As the affinity handler chooses (an invalid value is refused there, with the reason).
                kinds.add(store == "redis" or (store == "auto" and (self.mode == "shared" or pins is not None)))
        out.extend(StorePlace("pins", pins if in_redis else None) for in_redis in sorted(kinds))
        return out

    def validate(self) -> None:
        if not self.redis_eviction_check_s > 0:
            raise ValueError("redis_eviction_check_s must be > 0")
        if self.redis is not None and self.redis_url and (self.redis.url != self.redis_url):
            raise ValueError("set either redis_url or redis, not both (redis_url is the short form of redis.url)")


# Placeholders this project has shipped (the compose file's old default): a deployment that kept one
# has a secret every reader of the repository knows.
_PUBLISHED_SALT_SECRETS = frozenset({"litellm-kv-salt-local-only"})


def tenant_isolated_groups(settings: Settings) -> list[str]:
    """KV-routed groups whose ``kv.tenant_isolation`` is on (read raw: the kv section is parsed later)."""
    return sorted(
        name for name, g in settings.model_groups.items()
        if g.routing == "kv" and isinstance(g.kv, dict) and g.kv.get("tenant_isolation", "none") != "none"
    )


#: What a group may guard that a client must not get around by another name, route or endpoint: its reasoning and
#: vision limits, and its tenant cache isolation (``kv.tenant_isolation``).
GUARDED_SECTIONS = ("reasoning", "vision", "tenant_isolation")


def guarded_sections(settings: Settings) -> dict[str, list[str]]:
    """Each group that guards something, and what (a subset of :data:`GUARDED_SECTIONS`, in that order)."""
    isolated = set(tenant_isolated_groups(settings))
    found: dict[str, list[str]] = {}
    for name, g in settings.model_groups.items():
        sections = [s for s in ("reasoning", "vision") if getattr(g, s)] + (["tenant_isolation"] if name in isolated
                                                                            else [])
        if sections:
            found[name] = sections
    return found


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


def load_settings(path: str | os.PathLike[str] | None = None, lookup: SecretLookup = env_secret) -> Settings:
    """Load settings from ``path`` (a LiteLLM config with a ``litellm_kv`` key, or a bare section), with
    ``os.environ/NAME`` values read through ``lookup`` (:func:`resolve_env_refs`)."""
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
    whole = raw
    if isinstance(raw, dict) and "litellm_kv" in raw:
        raw = raw["litellm_kv"]
    settings = parse_with_env(Settings, raw, "litellm_kv", lookup)
    if settings.redis_url is None and settings.redis is None:
        settings.redis_url = os.environ.get("LITELLM_KV_REDIS_URL")
    if settings.redis_for() is None and isinstance(whole, dict):
        try:
            settings.redis = litellm_cache_redis(whole)
        except ValueError as exc:
            raise ConfigError(f"litellm_settings.cache_params (LiteLLM's Redis, used by litellm-kv): {exc}") from exc
    if tenant_isolated_groups(settings):
        salt_secret(settings)  # refuse to start without a real secret, rather than isolate with a guessable one
    return settings


def _json_env(name: str) -> Any:
    text = os.environ.get(name)
    if not text:
        return None
    try:
        return yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise ValueError(f"{name} is not JSON: {exc}") from exc


def litellm_cache_redis(litellm_config: dict[str, Any]) -> RedisSettings | None:
    """The Redis of LiteLLM's own cache (``litellm_settings.cache: true``, ``cache_params.type: redis``, the
    default type), read as LiteLLM 1.110 reads it: a cluster from ``redis_startup_nodes`` (or the
    REDIS_CLUSTER_NODES variable), else a Sentinel master from ``sentinel_nodes`` + ``service_name`` (or
    REDIS_SENTINEL_NODES / REDIS_SERVICE_NAME), else ``url``, else ``host``/``port``, else REDIS_URL, else
    REDIS_HOST/REDIS_PORT; password, username and ssl from cache_params or REDIS_PASSWORD / REDIS_USERNAME /
    REDIS_SSL. None when LiteLLM has no Redis cache."""
    ls = litellm_config.get("litellm_settings")
    if not isinstance(ls, dict) or ls.get("cache") is not True:
        return None
    raw_params = ls.get("cache_params")
    params = resolve_env_refs(raw_params if isinstance(raw_params, dict) else {}, path="litellm_settings.cache_params")
    if params.get("type", "redis") != "redis":
        return None
    env = os.environ
    ssl = params.get("ssl")
    common: dict[str, Any] = {
        "password": params.get("password") or env.get("REDIS_PASSWORD") or None,
        "username": params.get("username") or env.get("REDIS_USERNAME") or None,
        "ssl": bool(ssl) if ssl is not None else env.get("REDIS_SSL", "").lower() == "true",
    }
    scheme = "rediss" if common["ssl"] else "redis"
    nodes = params.get("redis_startup_nodes") or _json_env("REDIS_CLUSTER_NODES")
    sentinels = params.get("sentinel_nodes") or _json_env("REDIS_SENTINEL_NODES")
    service = params.get("service_name") or env.get("REDIS_SERVICE_NAME")
    if nodes:
        found = RedisSettings(cluster_nodes=[f"{n['host']}:{n['port']}" for n in nodes], **common)
    elif sentinels and service:
        found = RedisSettings(sentinel=RedisSentinelSettings(
            master=str(service), nodes=[f"{h}:{p}" for h, p in sentinels],
            password=params.get("sentinel_password") or env.get("REDIS_SENTINEL_PASSWORD") or None), **common)
    elif params.get("url"):
        found = RedisSettings(url=str(params["url"]), **common)
    elif params.get("host"):
        found = RedisSettings(url=f"{scheme}://{params['host']}:{params.get('port') or 6379}", **common)
    elif env.get("REDIS_URL"):
        found = RedisSettings(url=env["REDIS_URL"], **common)
    elif env.get("REDIS_HOST"):
        found = RedisSettings(url=f"{scheme}://{env['REDIS_HOST']}:{env.get('REDIS_PORT') or 6379}", **common)
    else:
        return None
    found.validate()
    return found
