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

import secrets
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from litellm_kv import addresses
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


class NoDatabase(Exception):
    """The proxy has no database (``DATABASE_URL``): LiteLLM stores no keys or teams to read or edit."""


def _hashed(key: str) -> str:
    """The token LiteLLM stores for a key: its hash (``sk-...`` is hashed, a stored hash stays as is)."""
    from litellm.proxy.utils import hash_token

    return str(hash_token(key)) if key.startswith("sk-") else key


async def stored_key(key: str) -> Caller | None:
    """A virtual key and its team as LiteLLM's database holds them now (not its key cache): ``key`` is the
    key itself (``sk-...``) or its hash (the admin UI's "Key ID"). ``None`` when no such key exists; raises
    :class:`NoDatabase` without a database."""
    from litellm.proxy import proxy_server
    from litellm.proxy.auth.auth_checks import get_key_object

    prisma = getattr(proxy_server, "prisma_client", None)
    if prisma is None:
        raise NoDatabase()
    try:
        auth = await get_key_object(_hashed(key), prisma, proxy_server.user_api_key_cache, check_db_only=True)
    except Exception as exc:
        if getattr(exc, "code", None) in (401, "401") or getattr(exc, "status_code", None) in (401, 404):
            return None
        raise
    caller = caller_from_auth(auth)
    if caller.team_id:
        team = await stored_team(caller.team_id)
        if team is not None:
            caller = Caller(caller.key_hash, caller.key_alias, team.team_id, team.team_alias, caller.key_metadata,
                            team.team_metadata)
    return caller


async def stored_team(team_id: str) -> Caller | None:
    """A team as LiteLLM's database holds it now (``key_*`` fields empty); ``None`` when there is no such team;
    raises :class:`NoDatabase` without a database."""
    from litellm.proxy import proxy_server
    from litellm.proxy.auth.auth_checks import get_team_object

    prisma = getattr(proxy_server, "prisma_client", None)
    if prisma is None:
        raise NoDatabase()
    try:
        team = await get_team_object(team_id, prisma, proxy_server.user_api_key_cache, check_db_only=True)
    except Exception as exc:
        if getattr(exc, "status_code", None) == 404 or type(exc).__name__ == "TeamNotFoundError":
            return None
        raise
    return Caller(team_id=str(team.team_id), team_alias=getattr(team, "team_alias", None),
                  team_metadata=getattr(team, "metadata", None) or {})


# -- which request ----------------------------------------------------------------------------------
def model_group(data: Mapping[str, Any]) -> str:
    """The model name a proxy request sends (its ``model`` field): the client's choice, which may be a
    ``model_group_alias``, a wildcard match or a second name over the same deployments (see
    :class:`~litellm_kv.integration.governance.GroupNames` for the group it is governed as)."""
    return str(data.get("model") or "")


def batch_models(data: Mapping[str, Any]) -> list[str]:
    """Every model name whose deployments a ``POST /v1/batches`` body may run on: its ``model`` field and the
    models its input file carries in its id, which LiteLLM 1.110.2 prefers to the body's field. A file kept by
    LiteLLM (``/v1/files`` with ``target_model_names``) has an id that decodes to
    ``litellm_proxy:...;target_model_names,<names>;...``; a file created through a model's own files API
    has one that decodes to ``litellm:<id>;model,<name>``. Read with LiteLLM's own decoders, so a
    form LiteLLM adds later is read as LiteLLM reads it; an id they cannot read adds nothing."""
    names = [model_group(data)]
    file_id = data.get("input_file_id")
    if isinstance(file_id, str) and file_id:
        from litellm.proxy.openai_files_endpoints import common_utils

        names.append(common_utils.decode_model_from_file_id(file_id) or "")
        unified = common_utils.is_base64_encoded_unified_file_id(file_id)
        if unified:
            names.extend(common_utils.get_models_from_unified_file_id(unified))
    return list(dict.fromkeys(n for n in names if n))


# -- what the router makes of a name ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeploymentTarget:
    """Where a deployment sends its calls: ``api_base`` (``None`` for a provider's default), the
    upstream model name (without the ``provider/`` prefix) and whether it is a vLLM server."""

    api_base: str | None
    model: str
    provider: str
    vllm: bool


def deployment_target(deployment: Mapping[str, Any]) -> DeploymentTarget:
    """The :class:`DeploymentTarget` of one ``model_list`` entry (wildcard entries as the router copied
    them for a name, with the ``*`` already replaced)."""
    params = deployment.get("litellm_params")
    params = params if isinstance(params, Mapping) else {}
    model = str(params.get("model") or "")
    prefix, sep, rest = model.partition("/")
    provider = str(params.get("custom_llm_provider") or (prefix if sep else ""))
    upstream = rest if sep and prefix == provider else model
    named = _named_bases(params)  # its own api_base, else its LiteLLM credential's
    api_base = named[0] if named else default_base(model, provider)
    return DeploymentTarget(api_base, upstream, provider, provider == "hosted_vllm")


def default_base(model: str, provider: str = "") -> str | None:
    """Where LiteLLM sends a call for ``model`` that names no ``api_base``: the provider's default from this
    process's settings (``litellm.api_base``, ``HOSTED_VLLM_API_BASE`` for ``hosted_vllm/``), as LiteLLM's own
    ``get_llm_provider`` reads it; ``None`` for a provider's public endpoint or a model it cannot place."""
    try:
        import litellm

        found = litellm.get_llm_provider(model=model, custom_llm_provider=provider or None)
    except Exception:
        return None
    base = found[3] if len(found) > 3 else None
    return str(base) if isinstance(base, str) and base else None


def _router() -> Any | None:
    try:
        from litellm.proxy import proxy_server
    except ImportError:  # not inside a proxy (tests, scripts)
        return None
    return getattr(proxy_server, "llm_router", None)


def router_version() -> int | None:
    """The router's registry version (it changes whenever deployments change); ``None`` without a router."""
    router = _router()
    return None if router is None else int(router.registry().version)


def router_alias_target(name: str) -> str | None:
    """The group ``router_settings.model_group_alias`` sends ``name`` to (LiteLLM's own lookup), or ``None``."""
    router = _router()
    if router is None:
        return None
    target = router.registry().resolve(name, kind="alias")
    return str(target) if target else None


def router_deployments(name: str, team_id: str | None = None, *, by_model: bool = False,
                       ) -> list[Mapping[str, Any]] | None:
    """Every deployment the router may serve ``name`` from, as LiteLLM looks it up: the group, its
    aliases, routing groups, then wildcards (``registry().deployments``), or the deployment whose id it
    is, or else (``by_model``) the deployments the router routes the name to by their own ``litellm_params.model``
    (``"hosted_vllm/<served name>"``: what a client's request is routed by, unless it names its own upstream,
    which LiteLLM sends it to instead). ``None`` without a router (not inside a proxy)."""
    router = _router()
    if router is None:
        return None
    registry = router.registry()
    found = [d for d in registry.deployments(name, team_id=team_id) or [] if isinstance(d, Mapping)]
    if not found and registry.has_deployment(name):
        dep = registry.deployment_dict(name)
        if isinstance(dep, Mapping):
            found.append(dep)
    if not found and by_model:
        found = [d for d in registry.deployments(name, source="routable", team_id=team_id) or []
                 if isinstance(d, Mapping)]
    return found


def is_vllm_deployment(kwargs: Mapping[str, Any]) -> bool:
    """Whether a deployment-level call goes to a vLLM server (``hosted_vllm/`` model or provider)."""
    model = str(kwargs.get("model") or "")
    provider = str(kwargs.get("custom_llm_provider") or "")
    return model.startswith("hosted_vllm/") or provider == "hosted_vllm"


def call_id(data: Mapping[str, Any]) -> str | None:
    """LiteLLM's id of one call (``litellm_call_id``), the same in every hook of that call."""
    value = data.get("litellm_call_id")
    return str(value) if value else None


def hook_call_id(data: Mapping[str, Any]) -> str | None:
    """The call id in any hook of a call, from where only LiteLLM writes it: top level, else
    ``litellm_params`` (never the request metadata, which the client writes too)."""
    cid = call_id(data)
    if cid:
        return cid
    lp = data.get("litellm_params")
    if isinstance(lp, Mapping) and lp.get("litellm_call_id"):
        return str(lp["litellm_call_id"])
    return None


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


def configured_fallbacks(group: str) -> set[str]:
    """The groups the operator's router settings let ``group`` fall back to (``fallbacks``,
    ``context_window_fallbacks``, ``content_policy_fallbacks``, their ``*`` entries included); empty without a
    router."""
    router = _router()
    if router is None:
        return set()
    settings = router.settings()
    out: set[str] = set()
    for name in ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks"):
        for entry in getattr(settings, name, None) or []:
            if not isinstance(entry, Mapping):
                continue
            for source, targets in entry.items():
                if source in (group, "*") and isinstance(targets, list):
                    out.update(t for t in targets if isinstance(t, str))
    return out


def client_upstreams(data: Mapping[str, Any]) -> list[str]:
    """The upstreams a proxy request names itself (LiteLLM honours them only with
    ``general_settings.allow_client_side_credentials``): ``api_base`` and ``base_url`` at the top level or in
    ``extra_body``, and for a ``user_config`` (a router of the client's own) its ``default_litellm_params``' and
    each deployment's, or where neither names one, where LiteLLM sends that deployment's model by default
    (:func:`default_base`: ``HOSTED_VLLM_API_BASE`` for ``hosted_vllm/``)."""
    out: list[str] = []
    for place in (data, data.get("extra_body")):
        if isinstance(place, Mapping):
            out += _named_bases(place)
    config = data.get("user_config")
    if isinstance(config, Mapping):
        defaults = config.get("default_litellm_params")
        defaults = defaults if isinstance(defaults, Mapping) else {}
        out += _named_bases(defaults)
        deployments = config.get("model_list")
        for dep in deployments if isinstance(deployments, list) else []:
            params = dep.get("litellm_params") if isinstance(dep, Mapping) else None
            if not isinstance(params, Mapping):
                continue
            own = _named_bases(params)
            out += own
            if not own and not _named_bases(defaults):
                base = default_base(str(params.get("model") or ""), str(params.get("custom_llm_provider") or ""))
                out += [base] if base else []
    return out


def with_upstream(deployment: dict[str, Any]) -> dict[str, Any]:
    """``deployment`` with ``litellm_params.api_base`` filled in where it names none, as LiteLLM will call it
    (:func:`deployment_target`: its ``base_url``, its LiteLLM credential's ``api_base``, or the provider's default),
    so that code reading ``api_base`` (a KV-routed group's replicas) sees the engine the calls go to. A copy where
    filled."""
    params = deployment.get("litellm_params")
    if not isinstance(params, Mapping) or params.get("api_base"):
        return deployment
    base = deployment_target(deployment).api_base
    return {**deployment, "litellm_params": {**params, "api_base": base}} if base else deployment


def _named_bases(place: Mapping[str, Any]) -> list[str]:
    """The upstreams ``place`` names: its ``api_base`` and ``base_url``, and those of a LiteLLM credential it names
    (``litellm_credential_name``, whose values LiteLLM merges into the call)."""
    out = [str(place[k]) for k in ("api_base", "base_url") if isinstance(place.get(k), str) and place[k]]
    credential = place.get("litellm_credential_name")
    if isinstance(credential, str) and credential:
        out += credential_bases(credential)
    return out


def credential_bases(name: str) -> list[str]:
    """The ``api_base`` and ``base_url`` of LiteLLM's stored credential ``name`` (``credential_list``), with an
    ``os.environ/`` reference read as LiteLLM reads it; empty for an unknown name."""
    import litellm
    from litellm.litellm_core_utils.credential_accessor import CredentialAccessor

    values = CredentialAccessor.get_credential_values(name)
    out: list[str] = []
    for key in ("api_base", "base_url"):
        value = values.get(key)
        if isinstance(value, str) and value.startswith("os.environ/"):
            value = litellm.get_secret_str(value)
        if isinstance(value, str) and value:
            out.append(value)
    return out


def deployment_group(kwargs: Mapping[str, Any]) -> str | None:
    """The group (``model_name``) of the deployment a deployment-level call goes to, found by the deployment id
    the router writes at the call's top level (``model_info``). That id is the call's own, where the metadata's
    ``model_group`` may be shared: the lines of LiteLLM's batch completion share one metadata dict, and each
    line's router call overwrites it. ``None`` without a router or a known id, or when the call goes to another
    server than the deployment's (a request that named its own ``api_base``, where the operator allows it: the
    router keeps the deployment it matched the name to, but the call goes where the client said)."""
    info = kwargs.get("model_info")
    dep_id = info.get("id") if isinstance(info, Mapping) else None
    router = _router()
    if not dep_id or router is None:
        return None
    registry = router.registry()
    if not registry.has_deployment(str(dep_id)):
        return None
    dep = registry.deployment_dict(str(dep_id))
    if not isinstance(dep, Mapping):
        return None
    params = dep.get("litellm_params")
    configured = params.get("api_base") if isinstance(params, Mapping) else None
    called = kwargs.get("api_base")
    if configured and called and not addresses.same_server(str(called), str(configured)):
        return None
    name = dep.get("model_name")
    return str(name) if name else None


def deployment_model_groups(kwargs: Mapping[str, Any]) -> list[str]:
    """The model-group names a deployment-level call carries, most specific first: ``kwargs["model_group"]``
    and the ``model_group`` of its metadata, then of its ``litellm_metadata`` (the pass-through and Responses
    routes' dict); they differ when the client named an alias."""
    names = [kwargs.get("model_group")]
    for name in ("metadata", "litellm_metadata"):
        md = kwargs.get(name)
        names.append(md.get("model_group") if isinstance(md, Mapping) else None)
    out: list[str] = []
    for n in names:
        if n and str(n) not in out:
            out.append(str(n))
    return out


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


#: Names litellm-kv writes into request metadata (its routing record, its spend-log breakdown): a client
#: sending any of them is dropped on entry, so what a later hook finds there was written by the proxy.
OWN_PREFIX = "litellm_kv"


def drop_client_entries(data: Mapping[str, Any]) -> list[str]:
    """Remove every ``litellm_kv*`` key (and ``spend_logs_metadata.litellm_kv``) from the request's
    metadata dicts; returns the dotted names removed."""
    removed: list[str] = []
    for md in metadata_dicts(data):
        for key in [k for k in md if isinstance(k, str) and k.startswith(OWN_PREFIX)]:
            md.pop(key, None)
            removed.append(key)
        slm = md.get("spend_logs_metadata")
        if isinstance(slm, MutableMapping) and OWN_PREFIX in slm:
            slm.pop(OWN_PREFIX, None)
            removed.append(f"spend_logs_metadata.{OWN_PREFIX}")
    return removed


#: Where pre_call writes the proxy's own token of a call (after every client ``litellm_kv*`` key is gone).
CALL_TOKEN_KEY = "litellm_kv_call"


def stamp_call(data: dict[str, Any]) -> str | None:
    """Give the call a token of the proxy's own, in the metadata dict LiteLLM hands to the later hooks,
    and return the key of its records (``<litellm_call_id>/<token>``; ``None`` without a call id).

    The client chooses ``litellm_call_id`` (``x-litellm-call-id``), so the id alone would let a second
    call, concurrent or later, read or drop the records of the first; the token tells them apart.
    """
    cid = call_id(data)
    if not cid:
        return None
    token = secrets.token_urlsafe(16)
    # LiteLLM's own dict: ``litellm_metadata`` on the routes that have one (there ``metadata`` is the
    # provider's parameter and is sent upstream), else ``metadata``.
    lm = data.get("litellm_metadata")
    if isinstance(lm, dict):
        lm[CALL_TOKEN_KEY] = token
    else:
        if not isinstance(data.get("metadata"), dict):
            data["metadata"] = {}
        data["metadata"][CALL_TOKEN_KEY] = token
    return f"{cid}/{token}"


def call_key(data: Mapping[str, Any]) -> str | None:
    """The key :func:`stamp_call` returned for the call ``data`` belongs to, in any hook of it."""
    cid = hook_call_id(data)
    if not cid:
        return None
    for md in metadata_dicts(data):
        token = md.get(CALL_TOKEN_KEY)
        if isinstance(token, str) and token:
            return f"{cid}/{token}"
    return None


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


def carries_output(chunk: Any) -> bool:
    """Whether a stream chunk carries generated output (content, reasoning or a tool call), not only the
    role or usage: the chunk a client's time to first token is taken at."""
    for choice in choices_of(chunk):
        delta = field(choice, "delta")
        for name in ("content", "reasoning_content", "reasoning", "tool_calls"):
            if field(delta, name):
                return True
    return False
