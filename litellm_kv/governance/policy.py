"""Per-key, per-team and per-group policy: where a limit comes from and which one applies.

Admins set litellm-kv limits in the ``metadata`` JSON of a virtual key or a team (admin UI:
Virtual Keys → edit → Metadata; or ``/key/update``), under one object::

    {"litellm_kv": {"reasoning": {...}, "vision": {...}}}

and operators set defaults per model group in the config (``litellm_kv.model_groups.<g>.<feature>``).
Each place is a :class:`PolicyLayer`; every limit read from a layer is a :class:`Limit` that
remembers its source, so a rejection can say *which* limit was hit and *where it was set*.
When several layers set the same limit, the strictest wins (:func:`strictest_min`,
:func:`strictest_bool`, :func:`strictest_choice`): a key cannot loosen its team's limit, and
neither can loosen the operator's group default.

Malformed metadata raises :class:`~litellm_kv.errors.MetadataError` (HTTP 400) whose message names
the key or team and the exact field, e.g.
``key 'bot-a': metadata.litellm_kv.reasoning.max_budget must be an integer >= 0, got "lots"``.
Malformed config raises :class:`~litellm_kv.errors.ConfigError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from litellm_kv.errors import ConfigError, MetadataError
from litellm_kv.governance.budgets import Period

T = TypeVar("T")

#: Top-level metadata key used when the settings do not say otherwise (``Settings.metadata_key``).
DEFAULT_METADATA_KEY = "litellm_kv"


@dataclass(frozen=True, slots=True)
class Limit(Generic[T]):
    """One limit value and the label of the layer that set it (``"key 'bot-a'"``, ...)."""

    value: T
    source: str


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a feature section (``reasoning``, ``vision``) as key/team metadata may set it.

    The feature modules declare their fields with it; :meth:`PolicyLayer.read` checks a value against it
    and :mod:`litellm_kv.governance.metadata` publishes the JSON Schema from it, so the check at save
    time, the check on the request path and the schema an admin reads are one definition.
    """

    name: str
    kind: Literal["integer", "boolean", "choice"]
    description: str
    minimum: int = 0
    choices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicyLayer:
    """One feature section (e.g. ``reasoning``) as set in one place.

    ``source`` labels the place for error messages (``"key 'bot-a'"``, ``"team 'research'"``,
    ``"config model_groups.qwen.reasoning"``); ``path`` is the dotted path of the section inside
    that place (``"metadata.litellm_kv.reasoning"``), used to name malformed fields;
    ``from_metadata`` selects the error type (MetadataError vs ConfigError).
    """

    source: str
    path: str
    values: Mapping[str, Any] = field(default_factory=dict)
    from_metadata: bool = True

    def error(self, field_name: str, problem: str, value: Any = None) -> Exception:
        """The error for a malformed field of this layer, naming the source and the field path."""
        shown = _shown(value)
        message = f"{self.source}: {self.path}.{field_name} {problem}, got {shown}"
        if self.from_metadata:
            return MetadataError(
                400, message, limit_name=f"{self.path}.{field_name}", value=value, source=self.source
            )
        return ConfigError(message)

    def has(self, name: str) -> bool:
        return name in self.values and self.values[name] is not None

    def int_field(self, name: str, *, minimum: int = 0) -> Limit[int] | None:
        """An integer field (``None``/absent → ``None``); bools and floats with a fraction are errors."""
        if not self.has(name):
            return None
        v = self.values[name]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.error(name, f"must be an integer >= {minimum}", v)
        return Limit(v, self.source)

    def bool_field(self, name: str) -> Limit[bool] | None:
        if not self.has(name):
            return None
        v = self.values[name]
        if not isinstance(v, bool):
            raise self.error(name, "must be true or false", v)
        return Limit(v, self.source)

    def choice_field(self, name: str, choices: Sequence[str]) -> Limit[str] | None:
        if not self.has(name):
            return None
        v = self.values[name]
        if v not in choices:
            raise self.error(name, f"must be one of {list(choices)}", v)
        return Limit(str(v), self.source)

    def mapping_field(self, name: str) -> PolicyLayer | None:
        """A nested object (e.g. ``tokens_per_period``) as a layer of its own."""
        if not self.has(name):
            return None
        v = self.values[name]
        if not isinstance(v, Mapping):
            raise self.error(name, "must be a JSON object", v)
        return PolicyLayer(self.source, f"{self.path}.{name}", v, self.from_metadata)

    def read(self, spec: FieldSpec) -> Limit[Any] | None:
        """The field ``spec`` describes, checked as its kind says (the typed readers above)."""
        if spec.kind == "integer":
            return self.int_field(spec.name, minimum=spec.minimum)
        if spec.kind == "boolean":
            return self.bool_field(spec.name)
        return self.choice_field(spec.name, spec.choices)

    def check_known(self, known: Iterable[str]) -> None:
        """Reject unknown fields: a typo must not silently disable a limit."""
        allowed = set(known)
        for name in self.values:
            if name not in allowed:
                problem = f"is not a known field (known: {sorted(allowed)})"
                raise self.error(str(name), problem, self.values[name])


#: Characters of a bad value quoted in an error message (the rest is cut: a message stays readable).
SHOWN_CHARS = 200


def _shown(value: Any) -> str:
    """``value`` as an error message quotes it: JSON if it can be, cut to :data:`SHOWN_CHARS`."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        try:
            text = repr(value)
        except RecursionError:
            text = "<nested too deeply to show>"
    except RecursionError:
        text = "<nested too deeply to show>"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


def read_object(value: Any, *, where: str, path: str) -> Mapping[str, Any]:
    """A dict, or a JSON string holding an object (the admin UI stores what the admin typed)."""
    if value is None:
        return {}
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MetadataError(
                400, f"{where}: {path} is not valid JSON ({exc.msg} at position {exc.pos})",
                limit_name=path, value=text[:200], source=where,
            ) from None
        except RecursionError:
            # json.loads recurses once per nesting level: a deep enough string exhausts the stack.
            raise MetadataError(
                400, f"{where}: {path} is nested too deeply to be read as JSON",
                limit_name=path, value=text[:200], source=where,
            ) from None
    if not isinstance(value, Mapping):
        raise MetadataError(
            400, f"{where}: {path} must be a JSON object, got {type(value).__name__}",
            limit_name=path, value=value, source=where,
        )
    return value


def read_kv_settings(
    metadata: Mapping[str, Any] | str | None, *, metadata_key: str = DEFAULT_METADATA_KEY, where: str
) -> Mapping[str, Any]:
    """The litellm-kv object of one key's or team's ``metadata`` (``{}`` when absent).

    ``metadata`` may be a dict or a JSON string; the object under ``metadata_key`` too. ``where``
    labels the owner in errors (``Caller.key_label`` / ``Caller.team_label``). Raises
    :class:`MetadataError` (400) naming ``where`` and the field when either is not a JSON object.
    """
    md = read_object(metadata, where=where, path="metadata")
    return read_object(md.get(metadata_key), where=where, path=f"metadata.{metadata_key}")


def metadata_layer(
    metadata: Mapping[str, Any] | str | None,
    feature: str,
    *,
    where: str,
    metadata_key: str = DEFAULT_METADATA_KEY,
) -> PolicyLayer:
    """The ``feature`` section (``"reasoning"``, ``"vision"``) of one key's or team's metadata."""
    kv = read_kv_settings(metadata, metadata_key=metadata_key, where=where)
    path = f"metadata.{metadata_key}.{feature}"
    return PolicyLayer(where, path, read_object(kv.get(feature), where=where, path=path), True)


def config_layer(values: Mapping[str, Any] | None, *, group: str, feature: str) -> PolicyLayer:
    """A model group's config defaults for ``feature`` (``litellm_kv.model_groups.<g>.<feature>``)."""
    path = f"model_groups.{group}.{feature}"
    if values is not None and not isinstance(values, Mapping):
        raise ConfigError(f"litellm_kv.{path}: expected a mapping, got {type(values).__name__}")
    return PolicyLayer(f"config {path}", f"litellm_kv.{path}", values or {}, False)


def strictest_min(*limits: Limit[int] | None) -> Limit[int] | None:
    """The smallest of the numeric limits that are set (ties: the first given wins)."""
    best: Limit[int] | None = None
    for lim in limits:
        if lim is not None and (best is None or lim.value < best.value):
            best = lim
    return best


def strictest_bool(*limits: Limit[bool] | None) -> Limit[bool] | None:
    """``False`` (not allowed) wins over ``True``; ``None`` when no layer sets it."""
    seen: Limit[bool] | None = None
    for lim in limits:
        if lim is None:
            continue
        if not lim.value:
            return lim
        seen = seen or lim
    return seen


def strictest_choice(order: Sequence[str], *limits: Limit[str] | None) -> Limit[str] | None:
    """The value latest in ``order`` (``order`` runs from loosest to strictest)."""
    best: Limit[str] | None = None
    for lim in limits:
        if lim is None:
            continue
        if best is None or order.index(lim.value) > order.index(best.value):
            best = lim
    return best


def first_set(*limits: Limit[T] | None) -> Limit[T] | None:
    """The first limit that is set: for preferences (not limits) where the most specific layer wins."""
    return next((lim for lim in limits if lim is not None), None)


@dataclass(frozen=True, slots=True)
class PeriodLimit:
    """One period budget that applies to a request: who is charged, over which window, how much."""

    scope: str  # "key:<hash>" or "team:<id>"
    scope_label: str  # "key 'bot-a'" (for messages)
    period: Period
    limit: Limit[int]


def period_limits(
    key: PolicyLayer,
    team: PolicyLayer | None,
    config: PolicyLayer,
    fields: Mapping[Period, str],
    *,
    key_scope: str,
    team_scope: str | None,
) -> list[PeriodLimit]:
    """The period budgets of one request: the key layer's and the config layer's bound the key (the
    stricter of the two per period), the team layer's bound the team."""
    periods: list[PeriodLimit] = []
    for period, name in fields.items():
        per_key = strictest_min(key.int_field(name), config.int_field(name))
        if per_key is not None:
            periods.append(PeriodLimit(key_scope, key.source, period, per_key))
        if team is not None and team_scope is not None:
            per_team = team.int_field(name)
            if per_team is not None:
                periods.append(PeriodLimit(team_scope, team.source, period, per_team))
    return periods
