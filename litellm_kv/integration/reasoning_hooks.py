"""Reasoning budgets in the proxy: decide and enforce before the call, measure and charge after it.

Before the call (:meth:`ReasoningHandler.pre_call`): read what the client asked for (any field) and
remove every client reasoning field, before anything else can fail; resolve the key/team/group
policy, check period budgets (429), clamp or reject over the per-request maximum, and write the
decided fields in the group's provider style (:func:`litellm_kv.governance.reasoning.apply_decision`).
The decision is kept by the proxy under the call's id (:meth:`GovernanceHandler.keep_decision`): a
call the proxy decided nothing for is charged nothing and hides nothing.

After the call (deployment-level hooks, streams included): take ``reasoning_tokens`` from the
provider's usage, else count ``reasoning_content`` with the group's tokenizer; write them into
``usage`` (so LiteLLM prices them), charge the period budgets, put a breakdown in the spend log
metadata, and remove ``reasoning_content`` when the key may not see it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from litellm_kv.config import Settings
from litellm_kv.errors import ConfigError, MetadataError, PolicyViolation
from litellm_kv.governance.budgets import FAIL_OPEN_NOTE, BudgetStoreError, Period, PeriodBudgets
from litellm_kv.governance.policy import PolicyLayer
from litellm_kv.governance.reasoning import (
    DEFAULT_TEMPLATE_KWARG,
    POLICY_FIELDS,
    ClientAsk,
    GroupReasoningSettings,
    ReasoningDecision,
    ReasoningPolicy,
    apply_decision,
    estimate_tokens,
    read_client_ask,
    requested_sequences,
    resolve_policy,
    strip_client_reasoning,
)
from litellm_kv.integration import litellm_data, stream_usage
from litellm_kv.integration.billing import record_breakdown, reported_reasoning_tokens, set_reasoning_tokens
from litellm_kv.integration.governance import GovernanceHandler, release_holds, store_failure, unmetered_endpoint
from litellm_kv.integration.hooks import ProxyRequest
from litellm_kv.observability import counter
from litellm_kv.routing.affinity.meters import HFMeter

log = logging.getLogger("litellm_kv.governance.reasoning")

METER = "reasoning_tokens"
HEADER_BUDGET = "x-litellm-kv-reasoning-budget"
HEADER_CLAMPED = "x-litellm-kv-reasoning-clamped"
HEADER_DISABLED = "x-litellm-kv-reasoning-disabled"

TOKENS_CHARGED = counter(
    "reasoning_tokens_charged",
    "Reasoning tokens written into usage and charged to period budgets, by model group and how they "
    "were measured (reported by the provider, counted with the tokenizer, or estimated).",
    ["model_group", "source"],
)
CLAMPS = counter(
    "reasoning_clamps",
    "Requests whose thinking budget was lowered, by model group and limit.",
    ["model_group", "limit"],
)
DISABLED = counter(
    "reasoning_disabled", "Requests served with thinking switched off by policy.", ["model_group", "reason"]
)
REJECTED = counter(
    "reasoning_rejections", "Requests rejected by a reasoning limit.", ["model_group", "reason"]
)
NEUTRALISED = counter(
    "reasoning_client_fields_removed", "Client reasoning fields removed before the call.", ["model_group", "field"]
)
HIDDEN = counter(
    "reasoning_content_hidden", "Responses/chunks whose reasoning_content was removed (key may not see it).",
    ["model_group"],
)
INVALID_METADATA = counter(
    "reasoning_invalid_metadata", "Requests with malformed reasoning settings in key/team metadata.", ["action"]
)


@dataclass(frozen=True, slots=True)
class _Reasoned:
    """What pre_call kept for one call: the decision and the configured model group it was taken for."""

    model_group: str
    decision: ReasoningDecision


@dataclass(slots=True)
class _StreamTally:
    text: list[str] = field(default_factory=list)
    done: bool = False
    started: float = field(default_factory=time.monotonic)


def _reasoning_text(container: Any) -> str:
    """``reasoning_content`` (LiteLLM's name) or ``reasoning`` (vLLM >= 0.10's name) of a message/delta."""
    if container is None:
        return ""
    for name in ("reasoning_content", "reasoning"):
        value = container.get(name) if isinstance(container, Mapping) else getattr(container, name, None)
        if isinstance(value, str) and value:
            return value
    return ""


def _hide_reasoning(container: Any) -> bool:
    hid = False
    for name in ("reasoning_content", "reasoning", "thinking_blocks"):
        if isinstance(container, MutableMapping):
            if container.get(name) is not None:
                container[name] = None
                hid = True
        elif getattr(container, name, None) is not None:
            setattr(container, name, None)
            hid = True
    psf = getattr(container, "provider_specific_fields", None)
    if isinstance(psf, MutableMapping):
        for name in ("reasoning_content", "reasoning"):
            if psf.pop(name, None) is not None:
                hid = True
    return hid


class ReasoningHandler(GovernanceHandler[GroupReasoningSettings]):
    """Per-key reasoning budgets (see :mod:`litellm_kv.governance.reasoning` for the policy schema)."""

    name = "reasoning"
    section = "reasoning"
    meter = METER
    group_settings_cls = GroupReasoningSettings
    policy_fields = POLICY_FIELDS

    def check_policy(self, config: PolicyLayer) -> None:
        resolve_policy(PolicyLayer("start-up check", "metadata", {}, True), None, config, key_scope="key:check",
                       team_scope=None)

    def __init__(self, settings: Settings, budgets: PeriodBudgets | None = None) -> None:
        super().__init__(settings, budgets)
        self._tokenizers: dict[str, HFMeter | None] = {}
        self._streams: dict[str, _StreamTally] = {}

    # -- set-up ----------------------------------------------------------------------------------
    def tokenizer(self, group: str) -> HFMeter | None:
        if group not in self._tokenizers:
            path = self.group_settings(group).tokenizer if self.settings.group(group) else None
            tok: HFMeter | None = None
            if path:
                try:
                    tok = HFMeter.of_model(path)
                except Exception:
                    log.exception("litellm-kv: cannot load tokenizer %s for group %s; estimating", path, group)
            self._tokenizers[group] = tok
        return self._tokenizers[group]

    # -- before the call -------------------------------------------------------------------------
    def _policy(self, req: ProxyRequest, gs: GroupReasoningSettings) -> ReasoningPolicy:
        try:
            key, team, config, key_scope, team_scope = self.policy_layers(req)
            return resolve_policy(key, team, config, key_scope=key_scope, team_scope=team_scope)
        except MetadataError:
            if gs.invalid_metadata == "reject":
                INVALID_METADATA.labels("reject").inc()
                raise
            INVALID_METADATA.labels("ignore").inc()
            log.warning("litellm-kv: ignoring malformed reasoning metadata of %s", req.caller.key_label, exc_info=True)
            empty = PolicyLayer(req.caller.key_label, "metadata", {}, True)
            return resolve_policy(empty, None, self.config_layer(req), key_scope=self.key_scope(req), team_scope=None)

    async def pre_call(self, req: ProxyRequest) -> None:
        data = req.data
        group = req.model_group
        template_kwarg = DEFAULT_TEMPLATE_KWARG
        try:
            gs = self.group_settings(group)
            template_kwarg = gs.template_kwarg
            ask = read_client_ask(data, gs.effort_budgets, template_kwarg)
        except ConfigError:
            log.exception("litellm-kv: invalid reasoning config for group %s; refusing", group)
            raise
        finally:
            # The client's fields go first, whatever fails next: none of them may reach the provider.
            removed = strip_client_reasoning(data, template_kwarg)
        for name in removed:
            NEUTRALISED.labels(group, name).inc()
        endpoint = unmetered_endpoint(req.call_type)
        if endpoint is not None:
            REJECTED.labels(group, "endpoint").inc()
            raise PolicyViolation(
                400, f"Model '{group}' has reasoning budgets, which are measured and enforced on "
                f"/v1/chat/completions only; {endpoint} is refused on it (limit reasoning.endpoint; use "
                "/v1/chat/completions).",
                limit_name="reasoning.endpoint", value=endpoint, source=f"config model_groups.{group}.reasoning",
            )
        sequences = requested_sequences(data)
        if sequences is None:
            REJECTED.labels(group, "sequences").inc()
            raise PolicyViolation(
                400, f"Model '{group}' has reasoning budgets, which the request's sequences share: 'n' and 'best_of' "
                "must be whole numbers >= 1 (limit reasoning.sequences).",
                limit_name="reasoning.sequences", source=f"config model_groups.{group}.reasoning",
            )
        policy = self._policy(req, gs)

        decision = self._decide(policy, ask, req)
        decision.sequences = sequences
        await self._check_periods(policy, decision, req, gs)
        if decision.thinking and decision.per_sequence == 0:
            # Less than a token each: the engine would still open and close a thought per sequence.
            DISABLED.labels(group, "sequences").inc()
            decision.disabled_by = (f"a budget of {decision.budget} reasoning tokens cannot be shared by "
                                    f"{sequences} sequences")
            decision.thinking, decision.budget = False, 0
            req.response_headers[HEADER_DISABLED] = decision.disabled_by
        apply_decision(data, decision, gs)
        # Ask the provider for usage so reasoning tokens are measured (and billed) on streams too.
        litellm_data.ask_stream_usage(data)
        self.keep_decision(req, _Reasoned(group, decision))
        req.response_headers[HEADER_BUDGET] = (
            "off" if not decision.thinking else ("unlimited" if decision.budget is None else str(decision.budget))
        )

    def _decide(self, policy: ReasoningPolicy, ask: ClientAsk, req: ProxyRequest) -> ReasoningDecision:
        group = req.model_group
        decision = ReasoningDecision(thinking=True, budget=None, show_reasoning=policy.may_see_reasoning)
        if not policy.thinking_allowed:
            source = policy.allowed.source if policy.allowed else "policy"
            if ask.explicit_on and policy.rejects_over_max:
                REJECTED.labels(group, "not_allowed").inc()
                raise PolicyViolation(
                    400,
                    f"Reasoning is not allowed for {req.caller.key_label} on model '{group}' "
                    f"(set in {source}); the request asked for it with '{ask.field}'.",
                    limit_name="reasoning.allowed", limit=False, value=ask.field, source=source,
                )
            DISABLED.labels(group, "not_allowed").inc()
            decision.thinking, decision.budget, decision.disabled_by = False, 0, f"allowed=false ({source})"
            req.response_headers[HEADER_DISABLED] = f"not allowed ({source})"
            return decision
        if ask.off:
            decision.thinking, decision.budget = False, 0
            return decision
        requested = ask.budget
        if requested is None and policy.default_budget is not None:
            requested = policy.default_budget.value
        decision.requested = requested
        decision.budget = requested
        mx = policy.max_budget
        if mx is not None and (requested is None or requested > mx.value):
            if requested is not None:
                if policy.rejects_over_max:
                    REJECTED.labels(group, "over_max").inc()
                    raise PolicyViolation(
                        400,
                        f"Requested thinking budget {requested} (from '{ask.field or 'default_budget'}') exceeds "
                        f"the maximum of {mx.value} reasoning tokens per request for {req.caller.key_label} on "
                        f"model '{group}' (set in {mx.source}).",
                        limit_name="reasoning.max_budget", limit=mx.value, value=requested, source=mx.source,
                    )
                CLAMPS.labels(group, "max_budget").inc()
                decision.clamped_by = mx.source
                req.response_headers[HEADER_CLAMPED] = (
                    f"requested={requested}; budget={mx.value}; limit=max_budget; source={mx.source}"
                )
            decision.budget = mx.value
        return decision

    async def _check_periods(
        self, policy: ReasoningPolicy, decision: ReasoningDecision, req: ProxyRequest, gs: GroupReasoningSettings
    ) -> None:
        """Reserve the request's thinking budget in every period budget before the call (settled after
        it), so concurrent requests cannot all think on the same remainder."""
        now = datetime.now(timezone.utc)
        group = req.model_group
        metered = True
        self.track_holds(req, decision.charges)
        for pl in policy.periods:
            charge: dict[str, Any] = {"scope": pl.scope, "period": pl.period.value, "limit": pl.limit.value,
                                      "source": pl.limit.source, "at": now.isoformat()}
            decision.charges.append(charge)
            if not decision.thinking:
                continue
            hold_id = uuid.uuid4().hex  # ours, not the client's call id: a client cannot aim at another hold
            if not metered:
                # The store failed open: asking it again for the other periods would only add waits.
                held = self.budgets.fail_open_hold(pl.scope, METER, pl.period, pl.limit.value, decision.budget,
                                                   hold_id, now)
            else:
                try:
                    held = await self.budgets.reserve(pl.scope, METER, pl.period, pl.limit.value, decision.budget,
                                                      hold_id, now=now)
                except BudgetStoreError as exc:
                    await release_holds(self.budgets, METER, decision.charges)
                    REJECTED.labels(group, "store_unavailable").inc()
                    message, headers = store_failure("Reasoning", exc)
                    raise PolicyViolation(503, message, limit_name="reasoning.store", headers=headers) from None
                metered = held.metered
            if held.granted:
                # A hold granted while the store failed open is this process's own (settled like the others).
                charge["hold"], charge["held"] = hold_id, held.granted
                if not held.metered:
                    charge["unmetered"] = True
            state = held.state
            if state.exhausted:
                reset = state.reset_at.strftime("%Y-%m-%dT%H:%M:%SZ")
                # What earlier periods held was for thinking that will not happen now.
                await release_holds(self.budgets, METER, decision.charges)
                if gs.period_exhausted == "no_thinking":
                    DISABLED.labels(group, f"{pl.period.value}_budget_spent").inc()
                    decision.thinking, decision.budget = False, 0
                    decision.disabled_by = f"{pl.period.value} budget of {pl.scope_label} spent until {reset}"
                    req.response_headers[HEADER_DISABLED] = decision.disabled_by
                    continue
                REJECTED.labels(group, f"{pl.period.value}_budget_spent").inc()
                retry = state.retry_after_seconds(now)
                in_flight = f" ({state.held} more held by requests in flight)" if state.held else ""
                if not state.metered:
                    in_flight += f"; {FAIL_OPEN_NOTE}"
                raise PolicyViolation(
                    429,
                    f"Reasoning token budget spent: {pl.scope_label} has used {state.used} of {state.limit} "
                    f"reasoning tokens this {pl.period.value}{in_flight} on model '{group}' (limit set in "
                    f"{pl.limit.source}). It resets at {reset} (in {retry} s).",
                    limit_name=f"reasoning.tokens_per_{pl.period.value}", limit=state.limit, value=state.used,
                    source=pl.limit.source,
                    headers={"Retry-After": str(retry), "x-litellm-kv-reasoning-reset": reset},
                )
            if decision.budget is None or decision.budget > held.granted:
                # Never let one request think past what is left of the period.
                CLAMPS.labels(group, f"tokens_per_{pl.period.value}").inc()
                decision.clamped_by = f"{pl.period.value} budget of {pl.scope_label} ({pl.limit.source})"
                req.response_headers[HEADER_CLAMPED] = (
                    f"requested={decision.requested if decision.requested is not None else 'unlimited'}; "
                    f"budget={held.granted}; limit=tokens_per_{pl.period.value}; source={pl.limit.source}"
                )
                decision.budget = held.granted
        if decision.thinking and decision.budget is not None:
            await self._shrink_holds(decision, now)

    async def _shrink_holds(self, decision: ReasoningDecision, now: datetime) -> None:
        """A later period may have lowered the budget: earlier holds keep only what the request may use."""
        assert decision.budget is not None
        for ch in decision.charges:
            if ch.get("hold") and int(ch.get("held") or 0) > decision.budget:
                if ch.get("unmetered"):
                    held = self.budgets.fail_open_hold(ch["scope"], METER, Period(ch["period"]), int(ch["limit"]),
                                                       decision.budget, str(ch["hold"]), now)
                    ch["held"] = held.granted
                    continue
                try:
                    held = await self.budgets.reserve(ch["scope"], METER, Period(ch["period"]), int(ch["limit"]),
                                                      decision.budget, str(ch["hold"]), now=now)
                except BudgetStoreError:
                    continue  # the larger hold stays until it is settled: it can only under-spend
                if held.metered:
                    ch["held"] = held.granted

    # -- after the call --------------------------------------------------------------------------
    def _count(self, group: str, text: str) -> tuple[int, str]:
        tok = self.tokenizer(group) if group else None
        if tok is not None:
            return tok.count(text), "tokenizer"
        return estimate_tokens(text), "estimate"

    def _settle(
        self, targets: list[Mapping[str, Any]], decision: ReasoningDecision, group: str, usage: Any, text: str
    ) -> None:
        """Write reasoning tokens into ``usage``, charge the period budgets, record the breakdown."""
        reported = reported_reasoning_tokens(usage)
        if reported is not None:
            tokens, source = reported, "reported"
        elif text:
            tokens, source = self._count(group, text)
        else:
            tokens, source = 0, "none"
        gs = self.group_settings(group) if self.settings.group(group) else GroupReasoningSettings()
        if tokens and reported is None:
            set_reasoning_tokens(usage, tokens, add_to_completion=not gs.completion_includes_reasoning)
        if tokens:
            TOKENS_CHARGED.labels(group, source).inc(tokens)
        self.settle_later(METER, decision.charges, tokens)
        breakdown = {
            "reasoning_tokens": tokens,
            "measured_by": source,
            "budget": decision.budget if decision.thinking else 0,
            "requested": decision.requested,
            "clamped_by": decision.clamped_by,
            "disabled_by": decision.disabled_by,
            "charged_to": [f"{c['scope']}/{c['period']}" for c in decision.charges],
        }
        for target in targets:
            record_breakdown(target, "reasoning", breakdown)

    def _reasoned(self, data: Mapping[str, Any]) -> _Reasoned | None:
        kept = self.decision_of(data)
        return kept if isinstance(kept, _Reasoned) else None

    async def post_success_deployment(self, request_data: dict[str, Any], response: Any) -> None:
        kept = self._reasoned(request_data)
        if kept is None:
            return
        group, decision = kept.model_group, kept.decision
        text = "".join(_reasoning_text(litellm_data.field(c, "message")) for c in litellm_data.choices_of(response))
        # Hidden before settling: a failure while counting must not show what the key may not see.
        if not decision.show_reasoning and any(
            [_hide_reasoning(litellm_data.field(c, "message")) for c in litellm_data.choices_of(response)]
        ):
            HIDDEN.labels(group).inc()
        usage = litellm_data.usage_of(response)
        if usage is not None:
            self._settle([request_data], decision, group, usage, text)

    async def post_success(self, data: dict[str, Any], response: Any) -> None:
        kept = self._reasoned(data)
        decision = kept.decision if kept is not None else None
        if decision is not None and not decision.show_reasoning:
            for c in litellm_data.choices_of(response):
                _hide_reasoning(litellm_data.field(c, "message"))

    async def stream_start(self, data: dict[str, Any], stream: Any) -> None:
        """Settle the stream when LiteLLM records its usage chunk (:mod:`~litellm_kv.integration.stream_usage`):
        then the reasoning tokens are in the usage LiteLLM prices and the breakdown is in the metadata its
        spend-log row is built from, which the success callbacks (:meth:`log_success`) run too late for."""
        kept = self._reasoned(data)
        call_id = litellm_data.call_id(data) or ""
        if kept is None or not call_id:
            return
        group, decision = kept.model_group, kept.decision
        tally = self._streams.setdefault(call_id, _StreamTally())
        self._forget_stale_streams()
        targets: list[Mapping[str, Any]] = [data]

        def on_usage(usage: Any, chunk: Any) -> None:
            if tally.done:
                return
            tally.done = True
            # The usage chunk may carry the last delta too; the stream hook sees it only after this.
            last = "".join(_reasoning_text(litellm_data.field(c, "delta")) for c in litellm_data.choices_of(chunk))
            self._settle(targets, decision, group, usage, "".join(tally.text) + last)

        details = stream_usage.watch(stream, on_usage)
        if details:
            targets.append(details)

    async def stream_chunk(self, data: dict[str, Any], chunk: Any) -> None:
        """Tally streamed reasoning (before hiding it) for the settlement at the usage chunk.

        LiteLLM 1.110 passes only a stream's *final* chunk to the deployment-level streaming hook and
        keeps the usage chunk to itself, so streams are measured here.
        """
        kept = self._reasoned(data)
        if kept is None:
            return
        decision = kept.decision
        call_id = litellm_data.call_id(data) or ""
        tally = self._streams.get(call_id) if call_id else None
        if call_id and tally is None:
            tally = self._streams[call_id] = _StreamTally()
            self._forget_stale_streams()
        for c in litellm_data.choices_of(chunk):
            delta = litellm_data.field(c, "delta")
            text = _reasoning_text(delta)
            if text and tally is not None and not tally.done:
                tally.text.append(text)
            if not decision.show_reasoning and _hide_reasoning(delta):
                HIDDEN.labels(kept.model_group).inc()

    async def log_success(self, kwargs: dict[str, Any], response: Any) -> None:
        """Streams whose usage chunk was never seen (no usage from the provider): charge budgets and record
        the breakdown once the whole stream was logged. The spend-log row may already be written then."""
        if not kwargs.get("stream"):
            return
        kept = self._reasoned(kwargs)
        if kept is None:
            return
        group, decision = kept.model_group, kept.decision
        call_id = litellm_data.call_id(kwargs) or ""
        tally = self._streams.pop(call_id, None)
        if tally is not None and tally.done:
            return
        usage = litellm_data.usage_of(response)
        text = "".join(tally.text) if tally is not None else "".join(
            _reasoning_text(litellm_data.field(c, "message")) for c in litellm_data.choices_of(response)
        )
        targets: list[Mapping[str, Any]] = list(litellm_data.logged_call_targets(kwargs))
        self._settle(targets, decision, group, usage if usage is not None else {}, text)

    async def log_failure(self, kwargs: dict[str, Any], response: Any) -> None:
        """The call failed: give its holds back (a retry that succeeds still charges what it used)."""
        kept = self._reasoned(kwargs)
        if kept is None:
            return
        self._streams.pop(litellm_data.call_id(kwargs) or "", None)
        await release_holds(self.budgets, METER, kept.decision.charges)

    def _forget_stale_streams(self) -> None:
        # Streams abandoned by the client never send usage; bound the tally table.
        if len(self._streams) < 1024:
            return
        cutoff = time.monotonic() - 3600
        for key, tally in list(self._streams.items()):
            if tally.started < cutoff:
                self._streams.pop(key, None)
