"""Configuration of ``litellm-kv indexer`` (a YAML file; every field documented here)."""

from __future__ import annotations

import ipaddress
import os
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml

from litellm_kv.config import RedisSettings, doc, parse_with_env
from litellm_kv.errors import ConfigError

HashAlgo = typing.Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
Assignment = typing.Literal["static", "lease"]
# A bearer token shorter than this could be guessed by a client that can reach the port.
_MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name the API binds) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


@dataclass(slots=True)
class IndexerReplicaSettings:
    """One vLLM replica (``model_groups.<g>.replicas[i]``)."""

    api_base: str = doc(
        "Base URL of the vLLM server (http://host:port, a trailing /v1 is ignored). The replica's id in "
        "the index is scheme://host:port of it, the same id proxies derive from the deployment's api_base."
    )
    event_endpoints: list[str] = doc(
        "ZMQ endpoints of the engine's KV-event publisher, one per data-parallel rank. Empty: discovered "
        "from the replica's GET /kv_event_sources (tcp://*:P becomes tcp://<api_base host>:P).",
        default_factory=list,
    )
    replay_endpoints: list[str] = doc(
        "ZMQ replay (ROUTER) endpoints, aligned with event_endpoints. Empty: discovered. Without a replay "
        "endpoint a gap or an indexer restart purges the replica and re-learns from live events.",
        default_factory=list,
    )
    topic: str | None = doc("KV-event topic. None: discovered (vLLM's default is '').", default=None)
    bind: bool = doc(
        "Bind the subscriber socket instead of connecting: needed when the engine's publisher endpoint is "
        "a concrete tcp://host:port (vLLM then connects to it). Only one indexer can bind an address.",
        default=False,
    )


@dataclass(slots=True)
class IndexerGroupSettings:
    """One model group (``model_groups.<name>``; the name is LiteLLM's model_name)."""

    replicas: list[IndexerReplicaSettings] = doc("The group's vLLM replicas.", default_factory=list)
    hash_seed: str | None = doc(
        "The engines' PYTHONHASHSEED if they run with one (seeds vLLM's NONE_HASH; cannot be read from "
        "the engine). None: the top-level hash_seed.",
        default=None,
    )
    block_size: int | None = doc(
        "Expected KV block size. None: read from vllm:cache_config_info; when set and an engine reports "
        "another value the replica is marked not exact.",
        default=None,
    )
    hash_algo: HashAlgo | None = doc(
        "Expected --prefix-caching-hash-algo. None: read from vllm:cache_config_info.", default=None
    )


@dataclass(slots=True)
class IndexerSettings:
    """``litellm-kv indexer --config FILE``: feeds the shared Redis index from the engines' KV events."""

    redis_url: str | None = doc(
        "Redis URL of the shared index: redis://[:password@]host:port/db, rediss:// for TLS (the short form "
        "of redis: {url: ...}).",
        default=None,
    )
    redis: RedisSettings | None = doc(
        "The shared index's Redis: one server, a Redis Cluster or a Sentinel-managed master, with "
        "credentials and TLS (the same schema as the proxies' litellm_kv.redis). Set this or redis_url.",
        default=None,
    )
    model_groups: dict[str, IndexerGroupSettings] = doc(
        "Model groups to index, keyed by LiteLLM model_name.", default_factory=dict
    )
    split_replicas: bool = doc(
        "Several indexers split each group's replicas between them, each config listing its share (static "
        "assignment): replicas of a configured group that this config does not list are left alone at start "
        "(another indexer feeds them), and one left out of every config expires after heartbeat_ttl_s. "
        "false: this config lists every replica of its groups, and one removed from it is purged when the "
        "indexer starts. Without a split, any number of indexers may each follow every replica (Redis applies "
        "each batch once).",
        default=False,
    )
    assignment: Assignment = doc(
        "How indexers share the replicas. static: this indexer follows every replica its config lists (with "
        "split_replicas, configs list disjoint shares). lease: every indexer lists the same replicas and each "
        "replica is followed by the one live indexer holding its lease in Redis; a dead indexer's replicas are "
        "claimed by the others within lease_ttl_s + lease_renew_interval_s and replayed from the engines' "
        "buffers, and each indexer holds at most ceil(replicas / live indexers) per group once the leases "
        "have settled.",
        default="static",
    )
    lease_ttl_s: float = doc(
        "assignment: lease. A lease not renewed for this long (its indexer died or lost Redis) is free for "
        "the others to claim. Keep it >= 3 x lease_renew_interval_s, so a late round or two does not lose it.",
        default=10.0,
    )
    lease_renew_interval_s: float = doc(
        "assignment: lease. How often the indexer renews its leases, claims free ones and hands over those "
        "past its share (one Redis script per group).",
        default=2.0,
    )
    lease_unreachable_handoff_s: float | None = doc(
        "assignment: lease. An indexer that has failed for this long to follow a replica whose lease it holds "
        "gives the lease up: the next round of another live indexer takes it, whatever that one's share. Failed "
        "to follow: since the last call that worked, a call to the engine's HTTP API (/metrics, "
        "/kv_event_sources) failed, or a stream's replay request got no answer at all and no batch came after it. "
        "With no other live indexer (or only ones that gave the replica up too) it keeps the lease and keeps "
        "trying. None: lease_ttl_s (as long as a dead indexer's replicas wait for a taker).",
        default=None,
    )
    lease_unreachable_cooldown_s: float | None = doc(
        "assignment: lease. After giving a replica up, the indexer claims it neither free nor offered for this long "
        "while a live indexer that has not given it up exists. When every live indexer has given it up, its holder "
        "keeps it, and it changes hands again only as cooldowns run out: at most once per live indexer and "
        "cooldown. None: 6 x the hand-off time.",
        default=None,
    )
    indexer_id: str | None = doc(
        "assignment: lease. This indexer's name in the lease table (at most 200 characters, no '|'); it must "
        "differ between live indexers. None: <hostname>-<pid>-<random>, new at every start.",
        default=None,
    )
    host: str = doc(
        "Address of the indexer's HTTP API (/health, /replicas, /lookup, /metrics). Loopback by default; "
        "any other address needs an API token (api_token_env or api_token), or the indexer refuses to start.",
        default="127.0.0.1",
    )
    port: int = doc("Port of the HTTP API.", default=8790)
    api_token_env: str = doc(
        "Environment variable holding the bearer token of the HTTP API. With a token, /replicas, /lookup and "
        "/metrics need 'Authorization: Bearer <token>': 401 without it, 403 with another; /health without it "
        "answers only its status. Without one the API is open, which is allowed on loopback only.",
        default="LITELLM_KV_INDEXER_TOKEN",
    )
    api_token: str | None = doc(
        "The bearer token itself, when it cannot come from the environment (prefer api_token_env: a config "
        "file is read by more people than a secret store). At least 16 characters.",
        default=None,
    )
    max_request_bytes: int = doc(
        "Largest request body the HTTP API reads; a larger one is refused with 413 before it is parsed.",
        default=4 * 1024 * 1024,
    )
    max_lookup_tokens: int = doc(
        "Most token ids one POST /lookup may carry (the block hashes computed and looked up are this divided "
        "by the block size); more is refused with 413. Raise it above the engines' longest max-model-len.",
        default=262_144,
    )
    hash_seed: str | None = doc("Default PYTHONHASHSEED of the engines (see model_groups.<g>.hash_seed).",
                                default=None)
    exactness_sample_rate: float = doc(
        "Fraction of BlockStored events whose hash chain is recomputed from their token ids and compared "
        "with the engine's hashes (0 disables, 1 checks every event). A mismatch marks the replica not "
        "exact on /health, in litellm_kv_exactness_mismatches_total and in the log.",
        default=0.1,
    )
    heartbeat_interval_s: float = doc(
        "How often each replica's /metrics is read and its heartbeat written to Redis.", default=5.0
    )
    heartbeat_ttl_s: float = doc(
        "A replica without a heartbeat for this long is purged from the index by any indexer's expiry "
        "pass (covers replicas whose indexers all died). Keep it >= 3 x heartbeat_interval_s.",
        default=30.0,
    )
    discovery_interval_s: float = doc(
        "How often replicas that are unreachable or have no event source are retried, and a replay the engine did "
        "not answer is asked for again.", default=5.0
    )
    replay_timeout_s: float = doc(
        "How long to wait for a replay answer before treating the missed batches as lost.", default=5.0
    )
    redis_backoff_max_s: float = doc(
        "Longest wait between Redis reconnection attempts (exponential backoff from 0.1 s).", default=5.0
    )
    engine_timeout_s: float = doc("Timeout of HTTP calls to the engines.", default=5.0)
    shutdown_grace_s: float = doc(
        "On SIGTERM, how long the HTTP server waits for requests still open (a client slow to send its body, or "
        "gone silent) before it cancels them and the indexer stops, releasing its leases.",
        default=5.0,
    )
    apply_call_blocks: int = doc(
        "Block hashes one Redis apply script call carries at most (several queued batches of a stream go in one "
        "call up to this; a single larger batch goes alone). Larger calls mean fewer round trips and more blocks "
        "per second, but each call holds the Redis shard for its whole run (about 2.3 us of Redis CPU per block), "
        "which every proxy's lookup on that shard waits behind.",
        default=256,
    )

    def validate(self) -> None:
        if (self.redis is None) == (not self.redis_url):
            raise ValueError("set one of redis_url or redis (the shared index's Redis)")
        if self.max_request_bytes < 1 or self.max_lookup_tokens < 1:
            raise ValueError("max_request_bytes and max_lookup_tokens must be at least 1")
        if not 0.0 <= self.exactness_sample_rate <= 1.0:
            raise ValueError("exactness_sample_rate must be within [0, 1]")
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ValueError("heartbeat_ttl_s must exceed heartbeat_interval_s")
        if not 0 < self.shutdown_grace_s <= 600:
            raise ValueError(f"shutdown_grace_s is {self.shutdown_grace_s}; use more than 0 and at most 600 seconds")
        if not 1 <= self.apply_call_blocks <= 65536:
            raise ValueError(f"apply_call_blocks is {self.apply_call_blocks}; use 1 to 65536 block hashes per call")
        self._validate_assignment()
        for name, group in self.model_groups.items():
            if not group.replicas:
                raise ValueError(f"model_groups.{name}: no replicas")

    def _validate_assignment(self) -> None:
        if self.assignment != "lease":
            return
        if self.split_replicas:
            raise ValueError("split_replicas is static assignment: with assignment: lease every indexer lists "
                             "every replica and the leases split them; set split_replicas: false")
        if self.lease_renew_interval_s <= 0:
            raise ValueError(f"lease_renew_interval_s is {self.lease_renew_interval_s}; it must be above 0")
        if self.lease_ttl_s < 2 * self.lease_renew_interval_s:
            raise ValueError(f"lease_ttl_s ({self.lease_ttl_s}) must be at least 2 x lease_renew_interval_s "
                             f"({self.lease_renew_interval_s}), or one late round loses the leases")
        takeover = self.lease_ttl_s + self.lease_renew_interval_s + self.heartbeat_interval_s
        if self.heartbeat_ttl_s <= takeover:
            raise ValueError(f"heartbeat_ttl_s ({self.heartbeat_ttl_s}) must exceed lease_ttl_s + "
                             f"lease_renew_interval_s + heartbeat_interval_s ({takeover:g}), or a dead indexer's "
                             f"replicas expire from the index before another indexer takes them over")
        if self.indexer_id is not None and not (0 < len(self.indexer_id) <= 200 and "|" not in self.indexer_id):
            raise ValueError(f"indexer_id {self.indexer_id!r}: use 1 to 200 characters without '|'")
        self._validate_unreachable()

    def _validate_unreachable(self) -> None:
        handoff, cooldown = self.lease_unreachable_handoff_s, self.lease_unreachable_cooldown_s
        if handoff is not None and handoff <= 0:
            raise ValueError(f"lease_unreachable_handoff_s is {handoff}; it must be above 0")
        if cooldown is not None and cooldown < self.lease_renew_interval_s:
            raise ValueError(f"lease_unreachable_cooldown_s ({cooldown}) must be at least lease_renew_interval_s "
                             f"({self.lease_renew_interval_s}), or it runs out before the next round")
        handover = self.unreachable_handoff_s() + self.lease_renew_interval_s + self.heartbeat_interval_s
        if self.heartbeat_ttl_s <= handover:
            raise ValueError(f"heartbeat_ttl_s ({self.heartbeat_ttl_s}) must exceed lease_unreachable_handoff_s + "
                             f"lease_renew_interval_s + heartbeat_interval_s ({handover:g}), or a replica its indexer "
                             f"cannot reach expires from the index before another indexer takes it over")

    def unreachable_handoff_s(self) -> float:
        """``lease_unreachable_handoff_s``, or its default (``lease_ttl_s``)."""
        h = self.lease_unreachable_handoff_s
        return self.lease_ttl_s if h is None else h

    def unreachable_cooldown_s(self) -> float:
        """``lease_unreachable_cooldown_s``, or its default (6 x the hand-off time)."""
        c = self.lease_unreachable_cooldown_s
        return 6 * self.unreachable_handoff_s() if c is None else c

    def token(self) -> str | None:
        """The API's bearer token (``api_token``, else the variable ``api_token_env`` names), checked.

        No token is allowed only while ``host`` is loopback: anywhere else the KV index of every tenant's
        prompts would be open to whoever reaches the port.
        """
        token = self.api_token if self.api_token is not None else os.environ.get(self.api_token_env, "")
        token = token.strip()
        where = "indexer.api_token" if self.api_token is not None else f"{self.api_token_env} (indexer.api_token_env)"
        if token and len(token) < _MIN_TOKEN_CHARS:
            raise ConfigError(f"{where}: the API token has {len(token)} characters; use at least {_MIN_TOKEN_CHARS} "
                              f"(for example `openssl rand -hex 32`)")
        if not token and not is_loopback(self.host):
            raise ConfigError(f"indexer.host is {self.host!r}, not loopback, and {where} is unset or empty: set an "
                              f"API token (for example `openssl rand -hex 32`) or bind 127.0.0.1")
        return token or None

    def redis_target(self) -> RedisSettings:
        """The index's Redis (``redis``, or ``redis_url`` as its short form)."""
        return self.redis if self.redis is not None else RedisSettings(url=self.redis_url)

    def seed_of(self, group: str) -> str | None:
        g = self.model_groups[group]
        return g.hash_seed if g.hash_seed is not None else self.hash_seed


def load_indexer_config(path: str | Path) -> IndexerSettings:
    """Read and check an indexer config file; errors name the offending option."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read indexer config {p}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}") from exc
    # os.environ/NAME values as in the proxy's config (litellm_kv.config.resolve_env_refs).
    return parse_with_env(IndexerSettings, raw, "indexer")
