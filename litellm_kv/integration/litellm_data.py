"""Where LiteLLM keeps things in the dicts and objects its hooks pass: the one module that reads them.

* Proxy-level hooks get the request body ``data``, with LiteLLM's request metadata in
  ``data["metadata"]`` or (for some routes) ``data["litellm_metadata"]``, and the verified caller in
  ``user_api_key_dict`` (``UserAPIKeyAuth``).
* Router- and deployment-level hooks get ``kwargs``: the same metadata dicts, and often a copy under
  ``kwargs["litellm_params"]``; the caller only as ``user_api_key_*`` fields of that metadata.
* Responses and stream chunks are LiteLLM objects or plain dicts; ``usage`` and ``choices`` are read
  from either.

Handlers call these readers and hand plain values to the domain code (:mod:`litellm_kv.governance`).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from litellm_kv.integration.hooks import Caller

METADATA_FIELDS = ("metadata", "litellm_metadata")


# -- who sent it ------------------------------------------------------------------------------------
def caller_from_auth(user_api_key_dict: Any) -> Caller:
    """Build a :class:`Caller` from LiteLLM's ``UserAPIKeyAuth``."""
    return Caller(
        key_hash=getattr(user_api_key_dict, "token", None),
        key_alias=getattr(user_api_key_dict, "key_alias", None),
        team_id=getattr(user_api_key_dict, "team_id", None),
        team_alias=getattr(user_api_key_dict, "team_alias", None),
        key_metadata=getattr(user_api_key_dict, "metadata", None) or {},
        team_metadata=getattr(user_api_key_dict, "team_metadata", None) or {},
    )


def caller_from_request_metadata(metadata: Mapping[str, Any] | None) -> Caller:
    """Build a :class:`Caller` from the copy LiteLLM puts in ``kwargs["metadata"]`` for router hooks."""
    md = metadata or {}
    return Caller(
        key_hash=md.get("user_api_key_hash") or md.get("user_api_key"),
        key_alias=md.get("user_api_key_alias"),
        team_id=md.get("user_api_key_team_id"),
        team_alias=md.get("user_api_key_team_alias"),
        key_metadata=md.get("user_api_key_metadata") or {},
        team_metadata=md.get("user_api_key_team_metadata") or {},
    )


def caller_role(metadata: Mapping[str, Any] | None) -> str | None:
    """The verified caller's LiteLLM role (``proxy_admin``, ``internal_user``, ...), from the
    ``UserAPIKeyAuth`` copy LiteLLM keeps in the request metadata (``user_api_key_auth``; a client's own
    ``user_api_key_*`` fields are dropped before LiteLLM writes it)."""
    auth = (metadata or {}).get("user_api_key_auth")
    role = field(auth, "user_role")
    if role is None:
        return None
    return str(getattr(role, "value", role))


# -- which request ----------------------------------------------------------------------------------
def model_group(data: Mapping[str, Any]) -> str:
    """The model group a proxy request names (its ``model`` field)."""
    return str(data.get("model") or "")


def is_vllm_deployment(kwargs: Mapping[str, Any]) -> bool:
    """Whether a deployment-level call goes to a vLLM server (``hosted_vllm/`` model or provider)."""
    model = str(kwargs.get("model") or "")
    provider = str(kwargs.get("custom_llm_provider") or "")
    return model.startswith("hosted_vllm/") or provider == "hosted_vllm"


def call_id(data: Mapping[str, Any]) -> str | None:
    """LiteLLM's id of one call (``litellm_call_id``), the same in every hook of that call."""
    value = data.get("litellm_call_id")
    return str(value) if value else None


def routed_call_id(data: Mapping[str, Any]) -> str | None:
    """The call id in any hook of a routed call: top level, else the request metadata (where LiteLLM
    and the kv handler copy it), else ``litellm_params`` (deployment-level hooks)."""
    cid = call_id(data)
    if cid:
        return cid
    md = request_metadata(data)
    for key in ("litellm_call_id", "litellm_kv_call_id"):
        if md.get(key):
            return str(md[key])
    lp = data.get("litellm_params")
    if isinstance(lp, Mapping) and lp.get("litellm_call_id"):
        return str(lp["litellm_call_id"])
    return None


def deployment_model_groups(kwargs: Mapping[str, Any]) -> list[str]:
    """The model-group names a deployment-level call carries, most specific first: ``kwargs["model_group"]``
    and its metadata's ``model_group`` (they differ when the client named an alias)."""
    md = kwargs.get("metadata")
    names = [kwargs.get("model_group"), md.get("model_group") if isinstance(md, Mapping) else None]
    return [str(n) for n in names if n]


def deployment_id(data: Mapping[str, Any]) -> str | None:
    """The LiteLLM deployment id (``model_info.id``) a call went to, from the call or its metadata."""
    info = data.get("model_info")
    if not isinstance(info, Mapping):
        md = data.get("metadata")
        info = md.get("model_info") if isinstance(md, Mapping) else None
    dep = info.get("id") if isinstance(info, Mapping) else None
    return str(dep) if dep is not None else None


def previous_deployment_ids(data: Mapping[str, Any]) -> set[str]:
    """Deployments LiteLLM's retry bookkeeping (``metadata.previous_models``) says this call already tried."""
    ids: set[str] = set()
    for bucket in METADATA_FIELDS:
        md = data.get(bucket)
        if not isinstance(md, Mapping):
            continue
        for record in md.get("previous_models") or []:
            if isinstance(record, Mapping) and isinstance(record.get("deployment_id"), str):
                ids.add(record["deployment_id"])
    return ids


# -- the request metadata ---------------------------------------------------------------------------
def request_metadata(data: Mapping[str, Any]) -> dict[str, Any]:
    """The request's metadata dict as LiteLLM passes it to router-level hooks."""
    md = data.get("metadata") or data.get("litellm_metadata") or {}
    return md if isinstance(md, dict) else {}


def metadata_dicts(data: Mapping[str, Any]) -> list[MutableMapping[str, Any]]:
    """Every metadata dict LiteLLM may read for this request (proxy ``metadata``/``litellm_metadata``
    and, in router-level hooks, ``litellm_params.metadata``)."""
    out: list[MutableMapping[str, Any]] = []
    for name in METADATA_FIELDS:
        md = data.get(name)
        if isinstance(md, MutableMapping):
            out.append(md)
    params = data.get("litellm_params")
    if isinstance(params, Mapping):
        for name in METADATA_FIELDS:
            md = params.get(name)
            if isinstance(md, MutableMapping) and all(md is not o for o in out):
                out.append(md)
    return out


def read_entry(data: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """The first mapping stored under ``key`` in any of the request's metadata dicts."""
    for md in metadata_dicts(data):
        raw = md.get(key)
        if isinstance(raw, Mapping):
            return raw
    return None


def drop_entry(data: Mapping[str, Any], key: str) -> None:
    """Remove ``key`` from every metadata dict (a client may not send what only litellm-kv writes)."""
    for md in metadata_dicts(data):
        md.pop(key, None)


def write_entry(data: dict[str, Any], key: str, value: Any) -> None:
    """Store ``value`` under ``key`` in ``data["metadata"]`` (created if missing) and ``litellm_metadata``,
    where the later hooks of the call find it."""
    if not isinstance(data.get("metadata"), dict):
        data["metadata"] = {}
    data["metadata"][key] = value
    lm = data.get("litellm_metadata")
    if isinstance(lm, dict):
        lm[key] = value


def add_response_headers(data: dict[str, Any], key: str, headers: Mapping[str, str]) -> None:
    """Keep ``headers`` under ``key`` of the request metadata for the response-headers hook."""
    request_metadata(data).setdefault(key, {}).update(headers)
    data.setdefault("metadata", {}).setdefault(key, {}).update(headers)


def response_headers_of(data: Mapping[str, Any], key: str) -> dict[str, str]:
    """The headers :func:`add_response_headers` kept (empty when none)."""
    md = data.get("metadata") if isinstance(data.get("metadata"), dict) else None
    if md and isinstance(md.get(key), dict):
        return dict(md[key])
    return {}


def logged_call_targets(kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """The dicts of a logged call (``async_log_success_event``) whose metadata the spend log is built
    from: the call's kwargs and, when present, its ``standard_logging_object``."""
    targets = [kwargs]
    slo = kwargs.get("standard_logging_object")
    if isinstance(slo, dict):
        targets.append(slo)
    return targets


def ask_stream_usage(data: dict[str, Any]) -> None:
    """On a streamed request, ask the provider for the final usage chunk (``include_usage``)."""
    if data.get("stream"):
        opts = data.get("stream_options")
        data["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}


# -- responses and stream chunks ----------------------------------------------------------------------
def field(obj: Any, name: str) -> Any:
    """``obj[name]`` of a dict or ``obj.name`` of a LiteLLM object; ``None`` when absent."""
    if obj is None:
        return None
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def dig(obj: Any, *path: str) -> Any:
    """:func:`field` along a path (``dig(usage, "prompt_tokens_details", "cached_tokens")``)."""
    for name in path:
        obj = field(obj, name)
    return obj


def usage_of(response: Any) -> Any:
    """The ``usage`` object of a response or stream chunk (``None`` when it has none)."""
    return field(response, "usage")


def choices_of(obj: Any) -> list[Any]:
    """The ``choices`` of a response or stream chunk (empty when it has none)."""
    return list(field(obj, "choices") or [])
