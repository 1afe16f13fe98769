"""The ``litellm_kv`` object of key and team metadata as a whole: checked before it is saved, and published
as a JSON Schema.

The request path reads one feature section at a time and stops at the first bad field
(:func:`litellm_kv.governance.reasoning.resolve_policy`, :func:`litellm_kv.governance.vision_policy
.resolve_policy`). An admin saving metadata needs every problem at once, each naming its field:
:func:`validate_metadata` runs the same readers field by field and collects what they refuse, and
:func:`metadata_json_schema` is built from the same :class:`~litellm_kv.governance.policy.FieldSpec`
declarations, so the save-time check, the request-time check and the schema cannot disagree.

Stricter than the request path in one respect: a section name litellm-kv does not know (``"reasonig"``)
is refused here, because on the request path it would silently set nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from litellm_kv.errors import MetadataError
from litellm_kv.governance import reasoning, vision_policy
from litellm_kv.governance.policy import DEFAULT_METADATA_KEY, FieldSpec, PolicyLayer, read_kv_settings, read_object

#: Feature sections of the ``litellm_kv`` object and the fields each may set.
SECTIONS: dict[str, tuple[FieldSpec, ...]] = {
    "reasoning": reasoning.POLICY_SPECS,
    "vision": vision_policy.POLICY_SPECS,
}

#: What ``where`` is when the caller names no owner (a message then reads ``litellm-kv: metadata...``).
NO_OWNER = "litellm-kv"


@dataclass(frozen=True, slots=True)
class FieldError:
    """One refused field: its dotted path inside the key's or team's metadata, the problem, the value."""

    path: str  # "metadata.litellm_kv.reasoning.max_budget"
    message: str  # the full sentence, naming the owner, the path and the value
    value: Any = None

    def to_json(self) -> dict[str, Any]:
        return {"field": self.path, "message": self.message, "value": _jsonable(self.value)}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:200]
    return value


def _error(exc: MetadataError) -> FieldError:
    return FieldError(exc.limit_name, exc.message, exc.value)


def validate_metadata(
    metadata: Mapping[str, Any] | str | None, *, metadata_key: str = DEFAULT_METADATA_KEY, where: str = NO_OWNER
) -> list[FieldError]:
    """Every problem of the litellm-kv settings in one key's or team's whole ``metadata`` (``[]``: valid).

    ``metadata`` is what ``/key/generate``, ``/key/update``, ``/team/new`` or ``/team/update`` would store:
    a dict or a JSON string; its ``metadata_key`` entry may be an object or a one-line JSON string (LiteLLM's
    team editor stores it so). Other metadata entries are LiteLLM's or the admin's and are not looked at.
    ``where`` labels the owner in messages (``"key 'bot-a'"``).
    """
    try:
        kv = read_kv_settings(metadata, metadata_key=metadata_key, where=where)
    except MetadataError as exc:
        return [_error(exc)]
    return validate_kv_settings(kv, metadata_key=metadata_key, where=where)


def validate_kv_settings(
    kv: Mapping[str, Any] | str | None, *, metadata_key: str = DEFAULT_METADATA_KEY, where: str = NO_OWNER
) -> list[FieldError]:
    """Every problem of one ``litellm_kv`` object (``{"reasoning": {...}, "vision": {...}}``; ``[]``: valid)."""
    base = f"metadata.{metadata_key}"
    try:
        kv = read_object(kv, where=where, path=base)
    except MetadataError as exc:
        return [_error(exc)]
    errors: list[FieldError] = []
    for name, section in kv.items():
        specs = SECTIONS.get(str(name))
        path = f"{base}.{name}"
        if specs is None:
            errors.append(FieldError(
                path, f"{where}: {path} is not a known section (known: {sorted(SECTIONS)})", section
            ))
            continue
        try:
            layer = PolicyLayer(where, path, read_object(section, where=where, path=path), True)
        except MetadataError as exc:
            errors.append(_error(exc))
            continue
        errors.extend(_section_errors(layer, specs))
    return errors


def _section_errors(layer: PolicyLayer, specs: tuple[FieldSpec, ...]) -> list[FieldError]:
    by_name = {spec.name: spec for spec in specs}
    errors: list[FieldError] = []
    for name, value in layer.values.items():
        one = PolicyLayer(layer.source, layer.path, {name: value}, True)
        try:
            one.check_known(by_name)
            one.read(by_name[str(name)])
        except MetadataError as exc:
            errors.append(_error(exc))
    return errors


def metadata_json_schema(metadata_key: str = DEFAULT_METADATA_KEY) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the ``litellm_kv`` object, built from the same field declarations."""
    sections = {
        name: {
            "type": "object",
            "additionalProperties": False,
            "properties": {spec.name: _field_schema(spec) for spec in specs},
        }
        for name, specs in SECTIONS.items()
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://litellm-kv.invalid/schemas/key-metadata.json",
        "title": f"metadata.{metadata_key}",
        "description": "litellm-kv limits of a LiteLLM virtual key or team (docs/key-metadata.md). "
        "Strictest of key, team and model-group config wins.",
        "type": "object",
        "additionalProperties": False,
        "properties": sections,
    }


def _field_schema(spec: FieldSpec) -> dict[str, Any]:
    # null is accepted everywhere: the readers take it as "not set".
    if spec.kind == "integer":
        return {"type": ["integer", "null"], "minimum": spec.minimum, "description": spec.description}
    if spec.kind == "boolean":
        return {"type": ["boolean", "null"], "description": spec.description}
    return {"enum": [*spec.choices, None], "description": spec.description}
