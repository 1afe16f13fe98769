"""What the per-key governance handlers (reasoning, vision) share: a section of their own in each model
group's config, parsed once per group, the group a request is governed as whatever name the client
sent (:class:`GroupNames`), period budgets (in memory, or Redis when one is configured: ``redis``,
``redis_url``, ``budgets.redis``), failing closed, and the per-call decision kept by the proxy (never read
from the request)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

from litellm_kv import addresses
from litellm_kv.config import ModelGroupSettings, Settings, guarded_sections, parse_section
from litellm_kv.errors import ConfigError, PolicyViolation
from litellm_kv.governance.budgets import (
    BudgetStoreError,
    BudgetStoreUnfit,
    Period,
    PeriodBudgets,
    make_period_budgets,
)
from litellm_kv.governance.policy import PolicyLayer, config_layer, metadata_layer
from litellm_kv.integration import litellm_data
from litellm_kv.integration.hooks import Caller, Handler, ProxyRequest
from litellm_kv.integration.litellm_data import DeploymentTarget
from litellm_kv.integration.workers import budgets_not_shared_why, proxy_workers
from litellm_kv.redis_client import RedisUse
from litellm_kv.redis_eviction import problem as eviction_problem
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


def store_failure(meter_title: str, exc: BudgetStoreError) -> tuple[str, dict[str, str]]:
    """The message and headers of the 503 when ``meter_title`` ("Reasoning") budgets could not be asked:
    an outage is worth retrying soon; a configuration that cannot share budgets is not."""
    if isinstance(exc, BudgetStoreUnfit):
        return f"{meter_title} budgets cannot be enforced on this proxy: {exc}.", {}
    return f"{meter_title} budgets cannot be checked right now: {exc}", {"Retry-After": "5"}


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


#: The LiteLLM call types a group with reasoning or vision limits serves: those of /v1/chat/completions, the
#: one endpoint whose requests, answers and usage the governance handlers read and charge. Any other call
#: type is refused on such a group (an allowlist: an endpoint LiteLLM adds later is refused until it is read).
METERED_CALL_TYPES = frozenset({"acompletion", "completion"})

#: Where a client sent the call types refused there, for the refusal's message (others are named by type).
_ENDPOINT_OF = {"aresponses": "/v1/responses", "responses": "/v1/responses", "_aresponses_websocket": "/v1/responses",
                "anthropic_messages": "/v1/messages", "aanthropic_messages": "/v1/messages",
                "atext_completion": "/v1/completions", "text_completion": "/v1/completions",
                "aembedding": "/v1/embeddings", "embedding": "/v1/embeddings",
                "pass_through_endpoint": "a pass-through route", "allm_passthrough_route": "a pass-through route",
                "llm_passthrough_route": "a pass-through route", "acreate_batch": "/v1/batches",
                "agenerate_content": "Google's generateContent", "agenerate_content_stream": "Google's generateContent"}


def unmetered_endpoint(call_type: str) -> str | None:
    """How to name the endpoint of ``call_type`` in a refusal when governed groups may not serve it; ``None``
    for the call types of /v1/chat/completions."""
    if call_type in METERED_CALL_TYPES:
        return None
    known = _ENDPOINT_OF.get(call_type)
    return known if known is not None else f"the '{call_type[:64]}' call"


#: The config sections whose limits a client must not escape by naming the same deployments differently.
GOVERNED_SECTIONS = ("reasoning", "vision")
#: A KV-routed group's ``kv.tenant_isolation``, which a name or route that skips its pre-call salt would escape too.
ISOLATION = "cache isolation"


def same_engine(a: DeploymentTarget, b: DeploymentTarget,
                same_server: Callable[[str, str], bool] = addresses.same_server) -> bool:
    """Whether calls to ``a`` land on the engine ``b`` sends to: the same server (``same_server``; by default the
    address however written, and port) and the same upstream model, or any model when either is a vLLM deployment,
    since one vLLM server answers every name it serves (``--served-model-name`` lists, LoRA adapters) on the same
    engine. Without an api_base (a provider's default endpoint): the same provider and model."""
    if a.api_base is None or b.api_base is None:
        return a.api_base is None and b.api_base is None and (a.provider, a.model) == (b.provider, b.model)
    if not same_server(a.api_base, b.api_base):
        return False
    return a.vllm or b.vllm or a.model == b.model


class GroupNames:
    """The configured model group a request is governed as, whatever name the client sent.

    * a name under ``litellm_kv.model_groups`` is governed by its own entry (an empty entry is the
      operator saying that name has no limits);
    * a ``router_settings.model_group_alias`` of a configured group is governed as that group, the one
      LiteLLM's router serves it from;
    * any other name (a second ``model_name``, a wildcard, a deployment id, an alias of an unconfigured
      group) that LiteLLM would serve from the deployments of a group with reasoning or vision limits
      is refused (400 ``governance.model_name``): which of several groups' limits it should carry is
      the operator's to say, not the client's.

    Routing reads stay open to failure where no limit is at stake; where governed groups exist, a
    failure to tell where a name goes refuses the request (500 ``governance.internal_error``).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: Each group with limits, and which sections it has them in (``ISOLATION`` for tenant cache isolation).
        self.governed: dict[str, list[str]] = {}
        #: The groups with reasoning or vision limits, which only calls that passed the pre-call hook may reach.
        self.limited: set[str] = set()
        for name, sections in guarded_sections(settings).items():
            self.governed[name] = [ISOLATION if s == "tenant_isolation" else s for s in sections]
            if set(sections) & set(GOVERNED_SECTIONS):
                self.limited.add(name)
        self._engines: tuple[int | None, list[tuple[DeploymentTarget, str]]] | None = None
        self._resolver = addresses.Resolver()  # the deployments' host names (the operator's)
        # Host names clients name, apart: a client spraying names that never resolve holds only this one's lookups.
        self._client_resolver = addresses.Resolver()
        self._warned: dict[str, float] = {}

    def resolve(self, requested: str, team_id: str | None = None, own_upstream: bool = False) -> str:
        """The group name to govern (and route) ``requested`` as; raises :class:`PolicyViolation` when
        the name reaches governed deployments without an entry of its own, or lists several models of which
        one reaches them. ``own_upstream``: the request names its own upstream (checked apart), so a name
        is not matched to deployments by their ``litellm_params.model``."""
        if "," in requested:
            self._check_batch(requested, team_id)
        if requested in self.settings.model_groups:
            return requested
        try:
            target = litellm_data.router_alias_target(requested)
            if target is not None and target in self.settings.model_groups:
                return target
            if not self.governed:
                return target or requested
            reached = litellm_data.router_deployments(requested, team_id, by_model=not own_upstream)
            groups = self._governed_reached(reached or [])
        except Exception as exc:
            if not self.governed:
                log.warning("litellm-kv: cannot resolve model '%s' through the router; using it as sent",
                            requested, exc_info=True)
                return requested
            log.exception("litellm-kv: cannot tell whether model '%s' reaches governed deployments", requested)
            raise PolicyViolation(
                500, f"Whether model '{requested}' is served by the deployments of a model group with limits "
                f"({', '.join(sorted(self.governed))}) could not be checked ({type(exc).__name__}), so the request "
                "was refused rather than sent without them; the proxy log has the details.",
                limit_name="governance.internal_error", value=requested, source="litellm-kv",
            ) from None
        if groups:
            raise self._unconfigured(requested, groups)
        return target or requested

    def groups_reached(self, name: str, team_id: str | None = None) -> list[str]:
        """The groups with limits whose engines a call naming ``name`` reaches without those limits being applied
        to it (a pass-through route applies none): its own group when it has limits, an alias's target when that
        has limits, else the governed groups whose engines its deployments (``team_id``'s team models included)
        send to. A name configured under ``litellm_kv.model_groups`` without limits reaches none: the operator said
        it has no limits. Raises what the router raises."""
        if not self.governed:
            return []
        if name in self.settings.model_groups:
            return [name] if name in self.governed else []
        target = litellm_data.router_alias_target(name)
        if target is not None and target in self.settings.model_groups:
            return [target] if target in self.governed else []
        return self._governed_reached(litellm_data.router_deployments(name, team_id) or [])

    async def prepare(self, names: Iterable[str | None], team_id: str | None = None, *,
                      urls: Iterable[str] = ()) -> None:
        """Resolve the DNS names of the deployments ``names`` may reach and of the governed groups' deployments, so
        that :meth:`resolve` and :meth:`groups_reached`, which do no I/O, match a second name to a governed engine
        by address, not only by the host name as written (``vllm.ns`` and ``vllm.ns.svc.cluster.local``, or the
        Service's address). Names with an entry of their own, or an alias of one, need none. Answers are cached
        (:class:`addresses.Resolver`); a name that does not resolve is compared as written, since LiteLLM cannot
        reach it either, and is logged. ``urls``: other upstreams to compare (a pass-through route's targets)."""
        if not self.governed:
            return
        try:
            wanted = set(urls)
            for name in {n.strip() for entry in names if entry for n in entry.split(",") if n.strip()}:
                if name in self.settings.model_groups \
                        or litellm_data.router_alias_target(name) in self.settings.model_groups:
                    continue
                wanted.update(str(target.api_base) for d in litellm_data.router_deployments(name, team_id) or []
                              if (target := litellm_data.deployment_target(d)).api_base)
            if not wanted:
                return  # every name has an entry of its own: nothing is matched by address
            wanted |= {engine.api_base for engine, _ in self._governed_engines() if engine.api_base}
        except Exception:  # the checks that follow read the router again and refuse on the same error
            return
        named = sorted(u for u in wanted if (s := addresses.server(u)) is not None and s.named)
        if not named:
            return
        answers = await asyncio.gather(*(self._resolver.servers(u) for u in named), return_exceptions=True)
        for url, answer in zip(named, answers, strict=True):
            if isinstance(answer, BaseException):
                self._warn_unresolved(url, answer)

    def _warn_unresolved(self, url: str, error: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned.get(url, -1e9) >= 60.0:
            self._warned[url] = now
            if len(self._warned) > 1024:
                self._warned = {u: t for u, t in self._warned.items() if now - t < 60.0}
            log.warning("litellm-kv: deployment %s cannot be resolved (%s); it is matched to governed engines by its "
                        "host name as written", url, error)

    def _same_server(self, a: str, b: str) -> bool:
        """:func:`addresses.same_server`, DNS names also matched by the addresses :meth:`prepare` last resolved
        them to. Does no I/O."""
        if addresses.same_server(a, b):
            return True
        first, second = self._resolver.known(a), self._resolver.known(b)
        return first is not None and second is not None and bool(first & second)

    def groups_served_at(self, url: str) -> list[str]:
        """The groups with limits that have a deployment on the server of ``url`` (:meth:`_same_server`). Does no
        I/O."""
        return sorted({g for engine, g in self._governed_engines()
                       if engine.api_base is not None and self._same_server(url, engine.api_base)})

    async def check_client_upstreams(self, urls: list[str]) -> None:
        """Refuse (400 ``governance.client_upstream``) a request whose client-chosen upstream (``api_base``,
        ``base_url``, a ``user_config`` deployment: LiteLLM accepts them only with
        ``general_settings.allow_client_side_credentials``) is the server of a governed group's deployment: the call
        would reach that engine under a name the limits do not follow. Servers are compared by address, DNS names
        resolved (:class:`addresses.Resolver`); a name that cannot be resolved in time is refused too, since where it
        goes cannot be told."""
        if not self.governed or not urls:
            return
        for url in urls:
            try:
                groups = await self._groups_at_servers(url)
            except addresses.UnresolvedHost as exc:
                raise PolicyViolation(
                    400, f"The request names its own upstream (api_base, base_url or user_config), and whether it is "
                    f"the engine of a model with limits ({', '.join(sorted(self.governed))}) could not be checked: "
                    f"{exc}. The request was refused rather than sent where those limits may not follow it (limit "
                    "governance.client_upstream).", limit_name="governance.client_upstream", value=url[:256],
                    source="litellm-kv",
                ) from None
            if groups:
                named = ", ".join(f"'{g}'" for g in groups)
                raise PolicyViolation(
                    400, f"The request names its own upstream (api_base, base_url or user_config), and it is the "
                    f"engine of model {named}, which has reasoning or vision limits that a client-chosen upstream "
                    f"would skip: the request was refused (limit governance.client_upstream). Use model {named} "
                    "without an upstream of your own.", limit_name="governance.client_upstream",
                    source=f"config model_groups.{groups[0]}",
                )

    async def _groups_at_servers(self, url: str) -> list[str]:
        """The governed groups with a deployment on a server ``url`` may connect to, DNS names followed on both
        sides. Raises :class:`addresses.UnresolvedHost`, also for a URL whose host and port cannot be read (LiteLLM's
        client may read it otherwise)."""
        if addresses.server(url) is None:
            raise addresses.UnresolvedHost(f"{url[:128]!a} names no host and port this proxy can read")
        quick = self.groups_served_at(url)
        if quick:
            return quick
        reached = await self._client_resolver.servers(url)
        found: set[str] = set()
        for engine, group in self._governed_engines():
            if group in found or engine.api_base is None:
                continue
            try:
                engine_servers = await self._resolver.servers(engine.api_base)
            except addresses.UnresolvedHost as exc:  # the operator's host names stay out of the client's answer
                log.warning("litellm-kv: the engine of governed group '%s' cannot be resolved: %s", group, exc)
                raise addresses.UnresolvedHost(f"the engine of model '{group}' cannot be resolved now") from None
            if reached & engine_servers:
                found.add(group)
        return sorted(found)

    def _check_batch(self, requested: str, team_id: str | None) -> None:
        """LiteLLM serves a chat whose model lists names separated by commas as one call to each name (its batch
        completion; with ``fastest_response``, the first to answer), each with the body as the client wrote it and
        none through the pre-call hook under its own name. Refused when a name reaches a group with limits: one
        request's limits cannot be applied to several groups' calls."""
        if not self.governed:
            return
        try:
            groups = sorted({g for name in requested.split(",") if name.strip()
                             for g in self.groups_reached(name.strip(), team_id)})
        except Exception as exc:
            log.exception("litellm-kv: cannot tell whether the models of '%s' reach governed deployments",
                          requested[:256])
            raise PolicyViolation(
                500, f"Whether the models listed in '{requested[:256]}' are served by the deployments of a model "
                f"group with limits could not be checked ({type(exc).__name__}), so the request was refused; the "
                "proxy log has the details.",
                limit_name="governance.internal_error", value=requested[:256], source="litellm-kv",
            ) from None
        if not groups:
            return
        named, sections = self._named(groups)
        raise PolicyViolation(
            400, f"Model '{requested[:256]}' lists several models, which LiteLLM calls each with the request as sent "
            f"(a batch completion); model {named} among them has {sections} limits, which apply to a "
            f"request for that model alone, so the request was refused. Send one request per model, to {named} "
            "by its own name.",
            limit_name="governance.model_name", value=requested[:256], source=f"config model_groups.{groups[0]}",
        )

    def _named(self, groups: list[str]) -> tuple[str, str]:
        """``groups`` quoted for a message, and the sections they have limits in (``"reasoning and vision"``)."""
        sections = sorted({s for g in groups for s in self.governed[g]}, key=(*GOVERNED_SECTIONS, ISOLATION).index)
        return ", ".join(f"'{g}'" for g in groups), " and ".join(sections)

    def _unconfigured(self, requested: str, groups: list[str]) -> PolicyViolation:
        named, sections = self._named(groups)
        return PolicyViolation(
            400, f"Model '{requested}' is served by the same deployments as model {named}, which has "
            f"{sections} limits, but '{requested}' has no litellm_kv.model_groups entry of its own, "
            f"so those limits cannot follow it and the request was refused. Use model {named}; the proxy's "
            f"operator can instead configure '{requested}' under litellm_kv.model_groups or make it a "
            "router_settings.model_group_alias of a governed group.",
            limit_name="governance.model_name", value=requested, source=f"config model_groups.{groups[0]}",
        )

    def _governed_reached(self, reached: list[Mapping[str, Any]]) -> list[str]:
        """The governed groups whose engines any of ``reached`` sends to."""
        engines = self._governed_engines()
        found: set[str] = set()
        for dep in reached:
            target = litellm_data.deployment_target(dep)
            for engine, group in engines:
                if group not in found and same_engine(target, engine, self._same_server):
                    log.info("litellm-kv: %s reaches %s of governed group '%s'", target, engine, group)
                    found.add(group)
        return sorted(found)

    def _governed_engines(self) -> list[tuple[DeploymentTarget, str]]:
        """Where each governed group's deployments send to, read again whenever the router's deployments change."""
        version = litellm_data.router_version()
        if self._engines is not None and version is not None and self._engines[0] == version:
            return self._engines[1]
        engines = [
            (litellm_data.deployment_target(dep), name)
            for name in self.governed
            for dep in litellm_data.router_deployments(name) or []
        ]
        self._engines = (version, engines)
        return engines


class GovernanceHandler(Handler, Generic[G]):
    """Base of a handler that acts on groups whose config has a non-empty ``section``."""

    section = ""  # "reasoning" or "vision": the ModelGroupSettings field
    meter = ""  # the period budgets' meter: "reasoning_tokens" or "visual_tokens"
    group_settings_cls: type[Any] = object  # the dataclass of the group-level options
    policy_fields: tuple[str, ...] = ()  # keys of the section that are limits, not group options
    fails_closed = True  # an error while deciding must not send the request on without its limits

    def __init__(self, settings: Settings, budgets: PeriodBudgets | None = None) -> None:
        super().__init__(settings)
        self._budgets = budgets
        self._groups: dict[str, G] = {}
        self._settling: set[asyncio.Task[None]] = set()

    @property
    def holds_record(self) -> str:
        """The call record under which this handler keeps the budgets it charges (and the holds on them)."""
        return f"{self.section}.charges"

    def track_holds(self, req: ProxyRequest, charges: list[dict[str, Any]]) -> None:
        """Keep ``charges`` (whose holds are about to be taken) under the call's record, so that
        :meth:`abandon` finds every hold whatever happens next, in this handler or a later one."""
        self._require_record_key(req)
        assert req.record_key is not None
        self.records.put(req.record_key, self.holds_record, charges)

    def abandon(self, record_key: str | None) -> None:
        charges = self.records.get(record_key, self.holds_record)
        if charges and any(ch.get("hold") for ch in charges):
            # Spawned, not awaited: this also runs in a cancelled request, which may not wait any more.
            spawn_held(self._settling, release_holds(self.budgets, self.meter, charges))

    def settle_later(self, meter: str, charges: list[dict[str, Any]], tokens: int) -> None:
        """Settle the call's holds off the response path: until it lands the hold still counts, so
        waiting on the store (slow or down) here would only delay the caller, never protect the budget."""
        spawn_held(self._settling, settle_holds(self.budgets, meter, charges, tokens))

    @property
    def budgets(self) -> PeriodBudgets:
        if self._budgets is None:
            workers = proxy_workers()
            target = self.settings.redis_for("budgets")
            self._budgets = make_period_budgets(
                target, self.settings.budgets,
                unshared_why=budgets_not_shared_why(workers) if workers.several else None,
                unfit=lambda: eviction_problem(target, RedisUse.BUDGETS.value))
        return self._budgets

    async def startup(self) -> None:
        # Connections to the budget store opened now, not by the first burst of requests.
        if any(self.enabled_for(g) for g in self.settings.model_groups.values()):
            warm = getattr(self.budgets, "warm", None)
            if warm is not None:
                await warm()

    async def shutdown(self) -> None:
        if self._budgets is not None:
            await self._budgets.close()

    def enabled_for(self, group: ModelGroupSettings | None) -> bool:
        return group is not None and bool(getattr(group, self.section))

    def keep_decision(self, req: ProxyRequest, decision: object) -> None:
        """Keep this call's decision in the proxy for the hooks after the upstream call."""
        self._require_record_key(req)
        assert req.record_key is not None
        self.records.put(req.record_key, self.section, decision)

    def _require_record_key(self, req: ProxyRequest) -> None:
        if not req.record_key:
            # Without LiteLLM's call id the later hooks could not find the decision: nothing would be charged.
            raise PolicyViolation(
                500, f"The {self.section} limits of model '{req.model_group}' cannot be applied: the request has "
                "no litellm_call_id to keep the decision under.", limit_name=f"{self.section}.internal_error",
                source="litellm-kv",
            )

    def decision_of(self, data: Mapping[str, Any]) -> Any | None:
        """The decision :meth:`keep_decision` kept for the call ``data`` belongs to (any hook); ``None``
        when the proxy decided nothing for it (an ungoverned group): then nothing is charged."""
        return self.records.get(litellm_data.call_key(data), self.section)

    def check_config(self) -> None:
        for name, group in self.settings.model_groups.items():
            if self.enabled_for(group):
                self.group_settings(name)
                layer = config_layer(getattr(group, self.section), group=name, feature=self.section)
                try:
                    self.check_policy(layer)
                except PolicyViolation as exc:  # a limit of the config itself, not of a caller's metadata
                    raise ConfigError(exc.message) from exc

    def check_policy(self, config: PolicyLayer) -> None:
        """Resolve the group's config limits alone, as a request would (raises naming the field)."""

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
        team_scope = team_budget_scope(caller.team_id) if caller.team_id else None
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
        return key_budget_scope(req.caller)


def key_budget_scope(caller: Caller) -> str:
    """The period-budget scope a key's own budgets are kept under (by its hash; the admin page reads it too)."""
    return f"key:{caller.key_hash or caller.key_alias or 'anonymous'}"


def team_budget_scope(team_id: str) -> str:
    """The period-budget scope a team's budgets are kept under (shared by all its keys)."""
    return f"team:{team_id}"
