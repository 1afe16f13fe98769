"""Reasoning budgets: the policy schema, what a request asks for, and the fields that enforce it.

This module is pure (no I/O, no LiteLLM): :mod:`litellm_kv.integration.reasoning_hooks` calls it.

Policy (``metadata.litellm_kv.reasoning`` of a key or team, or ``litellm_kv.model_groups.<g>.reasoning``
in the config; the strictest value wins, see :mod:`litellm_kv.governance.policy`):

=====================  =========================================================================
``allowed``            may the caller think at all (default true)
``default_budget``     thinking budget (tokens) when the caller asks for none; most specific wins
``max_budget``         maximum thinking tokens per request
``over_max``           ``"clamp"`` (default: lower it, say so in a response header) or ``"reject"`` (400)
``tokens_per_day``     reasoning tokens per UTC day (``_week``: from Monday, ``_month``: from the 1st);
``tokens_per_week``    in key metadata they bound the key, in team metadata the whole team, in the
``tokens_per_month``   config each key of the group. Spent → HTTP 429 with ``Retry-After``.
``show_reasoning``     may the caller see ``reasoning_content`` (default true)
=====================  =========================================================================

Group-only settings (:class:`GroupReasoningSettings`) say how the group's provider is told: the
``style`` of the request fields and, for vLLM, the chat-template switch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

from litellm_kv.config import doc
from litellm_kv.governance.budgets import Period
from litellm_kv.governance.policy import (
    FieldSpec,
    Limit,
    PeriodLimit,
    PolicyLayer,
    first_set,
    period_limits,
    strictest_bool,
    strictest_choice,
    strictest_min,
)

Style = Literal["vllm", "openai", "anthropic"]
OverMax = Literal["clamp", "reject"]
OVER_MAX_ORDER: tuple[str, ...] = ("clamp", "reject")  # loosest → strictest

#: Fields of the policy object (key, team or config layer): what each accepts and means.
POLICY_SPECS: tuple[FieldSpec, ...] = (
    FieldSpec("allowed", "boolean", "May the caller think at all (default true)."),
    FieldSpec("default_budget", "integer", "Thinking budget (tokens) when the caller asks for none; the most "
              "specific of key, team and config wins."),
    FieldSpec("max_budget", "integer", "Maximum thinking tokens per request (the smallest of key, team and "
              "config applies)."),
    FieldSpec("over_max", "choice", "Asked for more than max_budget: 'clamp' (lower it, say so in a response "
              "header; default) or 'reject' (400).", choices=OVER_MAX_ORDER),
    FieldSpec("tokens_per_day", "integer", "Reasoning tokens per UTC day (key metadata: the key; team "
              "metadata: the whole team). Spent: 429 with Retry-After."),
    FieldSpec("tokens_per_week", "integer", "Reasoning tokens per UTC week, from Monday 00:00."),
    FieldSpec("tokens_per_month", "integer", "Reasoning tokens per UTC month, from the 1st 00:00."),
    FieldSpec("show_reasoning", "boolean", "May the caller see reasoning_content (default true)."),
)
POLICY_FIELDS = tuple(spec.name for spec in POLICY_SPECS)
_SPEC = {spec.name: spec for spec in POLICY_SPECS}
PERIOD_FIELDS: dict[Period, str] = {
    Period.DAY: "tokens_per_day",
    Period.WEEK: "tokens_per_week",
    Period.MONTH: "tokens_per_month",
}

#: Effort names and the thinking budget each stands for (LiteLLM's own defaults for the thresholds).
DEFAULT_EFFORT_BUDGETS: dict[str, int] = {
    "none": 0,
    "minimal": 512,
    "low": 1024,
    "medium": 2048,
    "high": 4096,
    "xhigh": 8192,
    "max": 16384,
}

#: Request fields through which a client could choose its own reasoning: all are removed, then
#: litellm-kv writes back what the policy allows.
CLIENT_REASONING_FIELDS = (
    "thinking_token_budget",
    "thinking",
    "reasoning_effort",
    "reasoning",
    "include_reasoning",
    "max_thinking_tokens",
    "chat_template",
)
TEMPLATE_SWITCHES = ("enable_thinking", "thinking", "reasoning_effort")
#: The chat-template switch of Qwen3-style templates (``GroupReasoningSettings.template_kwarg``'s default).
DEFAULT_TEMPLATE_KWARG = "enable_thinking"
#: Largest thinking budget a client ask is read as: larger values (a 400-digit integer) are clamped to it,
#: so every later step works with a number an engine accepts (a signed 32-bit integer).
MAX_CLIENT_BUDGET = 2**31 - 1


@dataclass(slots=True)
class GroupReasoningSettings:
    """How a model group's provider is told the budget (``litellm_kv.model_groups.<g>.reasoning``).

    The same section also holds the group's policy defaults (the :data:`POLICY_FIELDS`).
    """

    style: Style = doc(
        "Request fields the group's deployments understand: 'vllm' (thinking_token_budget, "
        "chat_template_kwargs; needs vLLM started with --reasoning-parser), 'openai' (reasoning_effort, "
        "a soft limit: the budget maps to the largest effort whose nominal budget fits), 'anthropic' "
        "(thinking.budget_tokens).",
        default="vllm",
    )
    template_kwarg: str = doc(
        "chat_template_kwargs switch that turns thinking on/off for style 'vllm': 'enable_thinking' "
        "(Qwen3-style templates) or 'thinking' (DeepSeek-V3.1-style).",
        default=DEFAULT_TEMPLATE_KWARG,
    )
    answer_tokens: int = doc(
        "When max_tokens would not leave room for an answer after the thinking budget, max_tokens is "
        "raised to budget + this many tokens.",
        default=512,
    )
    effort_budgets: dict[str, int] = doc(
        "reasoning_effort name -> thinking budget it stands for (client efforts are converted with it; "
        "style 'openai' converts budgets back).",
        default_factory=lambda: dict(DEFAULT_EFFORT_BUDGETS),
    )
    tokenizer: str | None = doc(
        "tokenizer.json (or a directory holding one) of the group's model, used to count reasoning "
        "tokens exactly when the provider does not report usage.completion_tokens_details."
        "reasoning_tokens. Without it the count is estimated as ceil(UTF-8 bytes / 4) and marked "
        "'estimate' in the spend-log breakdown and metrics.",
        default=None,
    )
    completion_includes_reasoning: bool = doc(
        "Whether the provider's usage.completion_tokens already includes reasoning tokens (true for "
        "vLLM, OpenAI, Anthropic). When false, counted reasoning tokens are added to completion_tokens "
        "so they are priced.",
        default=True,
    )
    period_exhausted: Literal["reject", "no_thinking"] = doc(
        "When a period budget is spent: 'reject' (HTTP 429 with Retry-After) or 'no_thinking' (serve "
        "the request with thinking switched off).",
        default="reject",
    )
    invalid_metadata: Literal["reject", "ignore"] = doc(
        "Malformed reasoning settings in key/team metadata: 'reject' (HTTP 400 naming the key and "
        "field; fail closed) or 'ignore' (log, count, and apply the config defaults only).",
        default="reject",
    )


GROUP_FIELDS = tuple(GroupReasoningSettings.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class ReasoningPolicy:
    """The resolved policy for one request (each value remembers where it was set)."""

    allowed: Limit[bool] | None = None
    default_budget: Limit[int] | None = None
    max_budget: Limit[int] | None = None
    over_max: Limit[str] | None = None
    show_reasoning: Limit[bool] | None = None
    periods: tuple[PeriodLimit, ...] = ()

    @property
    def thinking_allowed(self) -> bool:
        return self.allowed is None or self.allowed.value

    @property
    def may_see_reasoning(self) -> bool:
        return self.show_reasoning is None or self.show_reasoning.value

    @property
    def rejects_over_max(self) -> bool:
        return self.over_max is not None and self.over_max.value == "reject"


def resolve_policy(
    key: PolicyLayer, team: PolicyLayer | None, config: PolicyLayer, *, key_scope: str, team_scope: str | None
) -> ReasoningPolicy:
    """Combine the key, team and config layers (strictest wins; defaults: most specific wins).

    Period budgets: the key layer's and the config layer's bound the key (the stricter of the two
    per period), the team layer's bound the team.
    """
    layers = [lay for lay in (key, team, config) if lay is not None]
    for lay in layers:
        lay.check_known(POLICY_FIELDS + (GROUP_FIELDS if not lay.from_metadata else ()))
    periods = period_limits(key, team, config, PERIOD_FIELDS, key_scope=key_scope, team_scope=team_scope)
    return ReasoningPolicy(
        allowed=strictest_bool(*(lay.read(_SPEC["allowed"]) for lay in layers)),
        default_budget=first_set(*(lay.read(_SPEC["default_budget"]) for lay in layers)),
        max_budget=strictest_min(*(lay.read(_SPEC["max_budget"]) for lay in layers)),
        over_max=strictest_choice(OVER_MAX_ORDER, *(lay.read(_SPEC["over_max"]) for lay in layers)),
        show_reasoning=strictest_bool(*(lay.read(_SPEC["show_reasoning"]) for lay in layers)),
        periods=tuple(periods),
    )


# -- what the client asked for ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientAsk:
    """The reasoning a request asked for, whichever field it used."""

    budget: int | None = None  # tokens; None = no explicit budget
    off: bool = False  # the client switched thinking off
    field: str | None = None  # which request field said so (for messages)

    @property
    def explicit_on(self) -> bool:
        return not self.off and self.field is not None


def _effort_budget(effort: Any, efforts: Mapping[str, int]) -> int | None:
    return efforts.get(effort) if isinstance(effort, str) else None


def _as_budget(value: Any) -> int | None:
    """A client's budget as a bounded int; ``None`` when it is not a number >= 0.

    Integers are never converted to float: ``math.isfinite`` of a huge int raises ``OverflowError``.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return min(value, MAX_CLIENT_BUDGET) if value >= 0 else None
    if isinstance(value, float) and value >= 0 and math.isfinite(value):
        return min(int(value), MAX_CLIENT_BUDGET)
    return None


#: The request fields that ask the engine for several sequences, each of which thinks up to ``thinking_token_budget``.
SEQUENCE_FIELDS = ("n", "best_of")


def requested_sequences(data: Mapping[str, Any]) -> int | None:
    """How many sequences the request asks the engine for: the largest ``n`` or ``best_of`` in the body or
    ``extra_body`` (1 without any); ``None`` when one is not a whole number >= 1 as the engine would read it (an
    int, an integral float, or a string of digits), so the request is refused rather than its count guessed."""
    most = 1
    for place in (data, data.get("extra_body")):
        if not isinstance(place, Mapping):
            continue
        for name in SEQUENCE_FIELDS:
            if name not in place or place[name] is None:
                continue
            count = _as_count(place[name])
            if count is None:
                return None
            most = max(most, count)
    return most


def _as_count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return value if isinstance(value, int) and value >= 1 else None


def read_client_ask(data: Mapping[str, Any], efforts: Mapping[str, int], template_kwarg: str) -> ClientAsk:
    """What the request asks for, looking at every place a client may put it.

    Precedence: an explicit "off" anywhere wins (switching thinking off is always allowed); then the
    largest explicit budget among ``thinking_token_budget``, ``thinking.budget_tokens`` and
    ``reasoning_effort``, in the request body, ``extra_body`` or ``vllm_xargs`` (largest, so a client
    cannot slip a big value past the check in a second place).
    """
    places: list[tuple[str, Mapping[str, Any]]] = [("", data)]
    for nested in ("extra_body", "vllm_xargs"):
        sub = data.get(nested)
        if isinstance(sub, Mapping):
            places.append((f"{nested}.", sub))
    best: ClientAsk = ClientAsk()
    for prefix, place in places:
        asks: list[ClientAsk] = []
        if "thinking_token_budget" in place:
            asks.append(ClientAsk(_as_budget(place["thinking_token_budget"]), False, f"{prefix}thinking_token_budget"))
        thinking = place.get("thinking")
        if isinstance(thinking, Mapping):
            if thinking.get("type") == "disabled":
                asks.append(ClientAsk(0, True, f"{prefix}thinking"))
            else:
                asks.append(ClientAsk(_as_budget(thinking.get("budget_tokens")), False, f"{prefix}thinking"))
        effort = place.get("reasoning_effort")
        reasoning = place.get("reasoning")
        if effort is None and isinstance(reasoning, Mapping):
            effort = reasoning.get("effort")
        if effort is not None:
            budget = _effort_budget(effort, efforts)
            asks.append(ClientAsk(budget, effort == "none", f"{prefix}reasoning_effort"))
        kwargs = place.get("chat_template_kwargs")
        if isinstance(kwargs, Mapping):
            for switch in {template_kwarg, *TEMPLATE_SWITCHES}:
                if kwargs.get(switch) is False:
                    asks.append(ClientAsk(0, True, f"{prefix}chat_template_kwargs.{switch}"))
        for ask in asks:
            if ask.off:
                return ask
            if best.field is None or (ask.budget or 0) > (best.budget or 0):
                best = ask
    return best


def strip_client_reasoning(data: MutableMapping[str, Any], template_kwarg: str) -> list[str]:
    """Remove every client-chosen reasoning field (top level, ``extra_body``, ``vllm_xargs``,
    thinking switches in ``chat_template_kwargs``); returns the dotted names removed."""
    removed: list[str] = []
    switches = {template_kwarg, *TEMPLATE_SWITCHES}

    def clean(place: MutableMapping[str, Any], prefix: str) -> None:
        for name in CLIENT_REASONING_FIELDS:
            if name in place:
                place.pop(name)
                removed.append(prefix + name)
        kwargs = place.get("chat_template_kwargs")
        if isinstance(kwargs, MutableMapping):
            for switch in switches:
                if switch in kwargs:
                    kwargs.pop(switch)
                    removed.append(f"{prefix}chat_template_kwargs.{switch}")
            if not kwargs:
                place.pop("chat_template_kwargs")

    clean(data, "")
    for nested in ("extra_body", "vllm_xargs"):
        sub = data.get(nested)
        if isinstance(sub, MutableMapping):
            clean(sub, f"{nested}.")
            if not sub:
                data.pop(nested)
    return removed


# -- the decision and how it is written on the wire ----------------------------------------------


@dataclass(slots=True)
class ReasoningDecision:
    """What litellm-kv decided for one request (stored in the request metadata for later hooks)."""

    thinking: bool
    budget: int | None  # None: no cap (only when no limit applies)
    requested: int | None = None
    clamped_by: str | None = None  # source label of the limit that lowered the budget
    disabled_by: str | None = None  # why thinking was switched off
    show_reasoning: bool = True
    charges: list[dict[str, Any]] = field(default_factory=list)  # {scope, period, limit, source}
    sequences: int = 1  # the request's n: they share ``budget``, each thinking up to ``per_sequence``

    @property
    def per_sequence(self) -> int | None:
        """What each of the request's sequences may think (the engine's ``thinking_token_budget`` is per sequence)."""
        return None if self.budget is None else self.budget // max(1, self.sequences)

    def to_json(self) -> dict[str, Any]:
        return {
            "thinking": self.thinking,
            "budget": self.budget,
            "requested": self.requested,
            "clamped_by": self.clamped_by,
            "disabled_by": self.disabled_by,
            "show_reasoning": self.show_reasoning,
            "charges": list(self.charges),
            "sequences": self.sequences,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ReasoningDecision:
        return cls(
            thinking=bool(raw.get("thinking")),
            budget=raw.get("budget"),
            requested=raw.get("requested"),
            clamped_by=raw.get("clamped_by"),
            disabled_by=raw.get("disabled_by"),
            show_reasoning=bool(raw.get("show_reasoning", True)),
            charges=list(raw.get("charges") or []),
            sequences=int(raw.get("sequences") or 1),
        )


def effort_for_budget(budget: int, efforts: Mapping[str, int]) -> str:
    """The largest effort whose nominal budget fits in ``budget`` (the smallest effort if none fits)."""
    ordered = sorted(efforts.items(), key=lambda kv: kv[1])
    fitting = [name for name, b in ordered if b <= budget]
    return fitting[-1] if fitting else ordered[0][0]


def _max_tokens_field(data: Mapping[str, Any]) -> str | None:
    for name in ("max_completion_tokens", "max_tokens"):
        if isinstance(data.get(name), int) and not isinstance(data.get(name), bool):
            return name
    return None


def apply_decision(data: MutableMapping[str, Any], decision: ReasoningDecision, group: GroupReasoningSettings) -> None:
    """Write the decided reasoning into the request in the group's provider style.

    Assumes :func:`strip_client_reasoning` ran first. For vLLM, ``thinking_token_budget`` and
    ``chat_template_kwargs`` become top-level JSON fields of the upstream request (LiteLLM sends
    unknown parameters of OpenAI-compatible providers as-is); ``max_tokens`` is raised when it would
    not leave ``answer_tokens`` after the thinking budget.
    """
    # Per sequence: the engine applies the budget to each of the request's n sequences.
    budget = decision.per_sequence if decision.thinking else 0
    if group.style == "vllm":
        kwargs = data.get("chat_template_kwargs")
        # Not an object (the client's junk): the engine would refuse it, so the proxy's own replaces it.
        data["chat_template_kwargs"] = {**(kwargs if isinstance(kwargs, Mapping) else {}),
                                        group.template_kwarg: decision.thinking}
        if budget is not None:
            data["thinking_token_budget"] = budget
    elif group.style == "openai":
        data["reasoning_effort"] = (
            effort_for_budget(budget, group.effort_budgets) if budget is not None else None
        )
        if data["reasoning_effort"] is None:
            data.pop("reasoning_effort")
    elif group.style == "anthropic":
        if decision.thinking and budget:
            data["thinking"] = {"type": "enabled", "budget_tokens": budget}
        else:
            data["thinking"] = {"type": "disabled"}
    if budget:
        name = _max_tokens_field(data)
        if name is not None and data[name] <= budget:
            data[name] = budget + group.answer_tokens


# -- counting --------------------------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """Fallback when no tokenizer is configured: ~4 UTF-8 bytes per token (documented as an estimate)."""
    return math.ceil(len(text.encode()) / 4) if text else 0
