"""Property-based fuzzing (hypothesis) of the request readers, through the real callback.

The LiteLLM callback (:class:`~litellm_kv.integration.callback.LiteLLMKV`) runs with the real vision and
reasoning handlers over in-memory budgets, and its hooks are called as LiteLLM 1.110 calls them
(pre-call, deployment success, proxy success, response headers, logging), in process: hypothesis needs
thousands of requests, which a proxy process cannot serve in the time of a unit test. The proxy-level
cases of the same limits are in ``tests/integration/test_adversarial_*.py``.

The inputs are what a hostile client controls: message lists of any shape (roles; content as a string,
a list, a dict or None; parts with and without ``type``; every image form the engine reads, valid or
broken), Responses-API ``input`` items, Anthropic ``/v1/messages`` blocks (thinking, image, tool_result),
reasoning and processor fields at top level, in ``extra_body`` and ``vllm_xargs`` (huge integers, NaN,
wrong types), the request metadata (forged ``litellm_kv*`` records), and the key and team metadata an
admin may have pasted (JSON strings, deep nesting, wrong types, fields naming other scopes).

Properties:

1. the pre-call either passes or refuses with a limit named (never a handler crash turned into
   ``*.internal_error``, never another exception), and a governed request whose images the proxy did not
   count as the engine will read them never passes;
2. a governed request that passes carries the proxy's limits as the engine will receive them (LiteLLM
   merges ``extra_body`` over the top level): ``thinking_token_budget`` at most the maximum, the
   proxy's chat-template switch, no client reasoning field, no client ``mm_processor_kwargs``;
3. after the post-call hooks, only the caller's own key and team were charged or held, reasoning is
   hidden where the policy says so, and response headers are litellm-kv's own.

``HYPOTHESIS_PROFILE=ci`` runs the same properties derandomized (the same examples on every run).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import json
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from litellm.proxy._types import ProxyException
from PIL import Image

from litellm_kv.config import Settings, parse_section
from litellm_kv.governance.budgets import MemoryPeriodBudgets
from litellm_kv.governance.reasoning import CLIENT_REASONING_FIELDS, TEMPLATE_SWITCHES
from litellm_kv.integration.callback import INTERNAL_ERRORS, LiteLLMKV
from litellm_kv.integration.reasoning_hooks import ReasoningHandler
from litellm_kv.integration.vision_hooks import VisionHandler

MAX_BUDGET = 64
MAX_IMAGES = 3
KEY_HASH = "hash-of-the-caller"
TEAM_ID = "team-of-the-caller"

GROUPS = {
    # Both governance features, as a reasoning vision-language model would be configured.
    "gov": {
        "reasoning": {"style": "vllm", "max_budget": MAX_BUDGET, "tokens_per_day": 10**6, "show_reasoning": False},
        "vision": {"family": "qwen2_5_vl", "max_images_per_request": MAX_IMAGES, "tokens_per_day": 10**7,
                   "max_visual_tokens_per_request": 40_000},
    },
    # Vision only: served on every endpoint, so the Responses and Anthropic readers are reached.
    "vis": {"vision": {"family": "qwen2_5_vl", "max_images_per_request": MAX_IMAGES, "tokens_per_day": 10**7}},
    "free": {},
}
SETTINGS = parse_section(Settings, {"model_groups": GROUPS, "freeze_startup_heap": False}, "litellm_kv")

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
FUZZ = settings(
    max_examples=60 if PROFILE == "default" else 150,
    derandomize=PROFILE == "ci",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _png(w: int, h: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), 9).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


PNG_B64 = _png(56, 56)
PNG_URL = "data:image/png;base64," + PNG_B64
REMOTE_URL = "https://images.example.invalid/cat.png"  # no host is allow-listed: counted at the ceiling

# -- what a client can write ------------------------------------------------------------------------

leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10**6), st.just(int("9" * 400)), st.just(-(10**30)),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["image_url", "image", "none", "max", "high", "disabled", "enabled", "data:", "base64"]),
)
junk = st.recursive(leaf, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                 st.dictionaries(st.text(max_size=8), kids, max_size=3)),
                    max_leaves=12)
budget_value = st.one_of(st.integers(-5, 10**7), st.just(int("9" * 400)), st.floats(allow_nan=True), junk)


@dataclass
class Media:
    """What the generator put in a request: the parts the engine reads as images, and broken ones."""

    images: int = 0
    broken: int = 0
    parts: list[Any] = field(default_factory=list)


@st.composite
def image_part(draw: st.DrawFn) -> tuple[Any, bool]:
    """One part the engine reads as an image, in any of the forms it accepts; (part, valid)."""
    url = draw(st.sampled_from([PNG_URL, REMOTE_URL]))
    detail = draw(st.sampled_from([None, "low", "high", "auto", 7]))
    spec: Any = {"url": url, **({"detail": detail} if detail is not None else {})}
    forms = [
        {"type": "image_url", "image_url": spec},
        {"type": "image_url", "image_url": url},
        {"image_url": spec},  # no type: vLLM takes the first media key
        {"type": "text", "text": "x", "uuid": "u-1", "image_url": spec},  # a uuid: the media key wins
        {"type": "input_image", "image_url": url},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
        {"type": "image", "source": {"type": "url", "url": url}},
        {"type": "tool_result", "tool_use_id": "t1",
         "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}]},
    ]
    return draw(st.sampled_from(forms)), True


@st.composite
def broken_image(draw: st.DrawFn) -> tuple[Any, bool]:
    """A part the engine would read as an image that cannot be counted: must be refused, never skipped."""
    forms = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!not base64!!"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"GIF89a").decode()}},
        {"type": "image_url", "image_url": {"url": "ftp://host/x.png"}},
        {"type": "image_url", "image_url": {"url": draw(st.one_of(st.none(), st.integers(), st.just("")))}},
        {"image_url": draw(st.one_of(st.none(), st.integers(), st.lists(st.integers(), max_size=2)))},
        {"type": "image_embeds", "image_embeds": "AAAA"},
        {"type": "image", "source": draw(st.one_of(st.none(), st.just({"type": "file", "file_id": "f"}),
                                                   st.just({"type": "base64", "data": 5})))},
        {"type": "image_url", "image_url": {"url": "http://[::1"}},
    ]
    return draw(st.sampled_from(forms)), False


#: Part types that are not media by the engine's rule (and carry no media key).
TEXTUAL = ["text", "input_text", "output_text", "refusal", "thinking", "redacted_thinking", "tool_use",
           "cache_control", None, 3]


@st.composite
def plain_part(draw: st.DrawFn) -> Any:
    """A part that is not media: text-like parts of any type, with junk around them, or not a dict at all."""
    kind = draw(st.sampled_from(TEXTUAL))
    part: dict[str, Any] = {"text": draw(st.one_of(st.text(max_size=10), junk))}
    if kind is not None:
        part["type"] = kind
    if kind == "thinking":
        part["thinking"] = draw(st.text(max_size=20))
        part["signature"] = draw(st.text(max_size=8))
    extra = draw(st.dictionaries(st.sampled_from(["foo", "cache_control", "citations", "id"]), junk, max_size=2))
    part.update(extra)
    return draw(st.one_of(st.just(part), junk.filter(lambda v: not isinstance(v, dict))))


@st.composite
def content(draw: st.DrawFn, media: Media) -> Any:
    """A message's content: a string, None, a dict, junk, or a list of parts (images counted in ``media``)."""
    shape = draw(st.sampled_from(["list", "list", "list", "str", "none", "dict", "junk"]))
    if shape == "str":
        return draw(st.text(max_size=20))
    if shape == "none":
        return None
    if shape == "dict":
        return draw(st.dictionaries(st.sampled_from(["type", "text"]), st.text(max_size=5), max_size=2))
    if shape == "junk":
        return draw(st.one_of(st.integers(), st.floats(allow_nan=True), st.booleans()))
    parts: list[Any] = []
    for _ in range(draw(st.integers(0, 4))):
        pick = draw(st.sampled_from(["plain", "plain", "image", "broken"]))
        if pick == "plain":
            parts.append(draw(plain_part()))
            continue
        part, valid = draw(image_part() if pick == "image" else broken_image())
        parts.append(part)
        if valid:
            media.images += 1
        else:
            media.broken += 1
    return parts


ROLES = st.sampled_from(["user", "system", "assistant", "tool", "developer", "function", "", 5, None])


@st.composite
def chat_messages(draw: st.DrawFn, media: Media) -> Any:
    msgs: list[Any] = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 9)) == 0:
            msgs.append(draw(junk))  # not a message at all
            continue
        msg: dict[str, Any] = {"role": draw(ROLES), "content": draw(content(media))}
        if draw(st.booleans()):
            msg.update(draw(st.dictionaries(st.sampled_from(["name", "tool_call_id", "reasoning_content",
                                                             "thinking_blocks", "tool_calls"]), junk, max_size=2)))
        msgs.append(msg)
    return msgs


@st.composite
def responses_input(draw: st.DrawFn, media: Media) -> Any:
    if draw(st.integers(0, 5)) == 0:
        return draw(st.one_of(st.text(max_size=20), junk))
    items: list[Any] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["message", "function_call_output", "reasoning", "junk"]))
        if kind == "message":
            items.append({"type": "message", "role": draw(ROLES), "content": draw(content(media))})
        elif kind == "function_call_output":
            items.append({"type": "function_call_output", "call_id": "c", "output": draw(content(media))})
        elif kind == "reasoning":
            items.append({"type": "reasoning", "summary": draw(junk)})
        else:
            items.append(draw(junk))
    return items


@st.composite
def reasoning_fields(draw: st.DrawFn) -> dict[str, Any]:
    """Every field a client can choose its own reasoning with, with any value."""
    thinking = st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled", "adaptive", 1]),
                               "budget_tokens": budget_value}),
        junk,
    )
    kwargs = st.one_of(st.dictionaries(st.sampled_from([*TEMPLATE_SWITCHES, "custom", "tools"]), junk, max_size=3),
                       junk)
    pool = {
        "thinking": thinking,
        "thinking_token_budget": budget_value,
        "reasoning_effort": st.one_of(st.sampled_from(["none", "low", "high", "max", "xhigh"]), junk),
        "reasoning": st.one_of(st.fixed_dictionaries({"effort": st.sampled_from(["high", "none", 3])}), junk),
        "include_reasoning": junk,
        "max_thinking_tokens": budget_value,
        "chat_template_kwargs": kwargs,
        "chat_template": st.text(max_size=10),
    }
    names = draw(st.lists(st.sampled_from(sorted(pool)), max_size=4, unique=True))
    return {n: draw(pool[n]) for n in names}


processor_kwargs = st.one_of(
    st.dictionaries(st.sampled_from(["min_pixels", "max_pixels", "size", "fps"]),
                    st.one_of(st.integers(-5, 10**9), st.just(int("9" * 400)), junk), max_size=2),
    junk,
)


@st.composite
def request_metadata(draw: st.DrawFn) -> dict[str, Any]:
    """What a client can put in ``metadata``: forged decision records aimed at another team, anything else."""
    forged = {"model_group": "gov", "tokens": 10**9,
              "charges": [{"scope": "team:victim", "period": "day", "limit": 1, "source": "forged"}]}
    pool = {
        "litellm_kv_vision": st.one_of(st.just(forged), junk),
        "litellm_kv_reasoning": st.one_of(st.just({**forged, "thinking": True, "show_reasoning": True}), junk),
        "litellm_kv_headers": st.one_of(st.just({"set-cookie": "s=1"}), junk),
        "litellm_kv_call": st.text(max_size=8),
        "user_api_key_team_id": st.just("victim"),
        "spend_logs_metadata": st.one_of(st.just({"litellm_kv": forged}), junk),
        "tags": junk,
    }
    names = draw(st.lists(st.sampled_from(sorted(pool)), max_size=4, unique=True))
    return {n: draw(pool[n]) for n in names}


@st.composite
def owner_metadata(draw: st.DrawFn) -> Any:
    """A key's or team's metadata as an admin may have stored it: right, wrong, a JSON string, deep."""
    fields = ["max_budget", "default_budget", "allowed", "over_max", "tokens_per_day", "tokens_per_week",
              "show_reasoning", "max_images_per_request", "max_visual_tokens_per_request", "max_pixels_per_image",
              "over_limit", "scope", "team_id", "charges"]
    section = st.dictionaries(st.sampled_from(fields), st.one_of(budget_value, st.booleans(),
                                                                 st.sampled_from(["clamp", "reject", "downscale"]),
                                                                 st.just("team:victim")), max_size=3)
    feature = st.one_of(section, section.map(json.dumps), junk)
    kv = st.dictionaries(st.sampled_from(["reasoning", "vision", "scope"]), feature, max_size=2)
    return draw(st.one_of(
        st.none(), junk,
        kv.map(lambda v: {"litellm_kv": v}),
        kv.map(lambda v: {"litellm_kv": json.dumps(v)}),
        kv.map(lambda v: json.dumps({"litellm_kv": v})),
        st.integers(100, 3000).map(lambda n: {"litellm_kv": "[" * n + "]" * n}),
        st.integers(50, 1500).map(lambda n: {"litellm_kv": {"reasoning": {"max_budget": _nested(n)}}}),
    ))


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


ENDPOINTS = st.sampled_from(["completion", "acompletion", "aresponses", "anthropic_messages", "atext_completion",
                             "aembedding", "pass_through_endpoint"])


@st.composite
def scenario(draw: st.DrawFn) -> tuple[dict[str, Any], Any, str, Media]:
    media = Media()
    call_type = draw(ENDPOINTS)
    body: dict[str, Any] = {"model": draw(st.sampled_from(["gov", "gov", "vis", "free"])),
                            "litellm_call_id": draw(st.sampled_from(["c-1", "c-2", "x"]))}
    if call_type == "aresponses":
        body["input"] = draw(responses_input(media))
    else:
        body["messages"] = draw(chat_messages(media))
    if call_type == "anthropic_messages" and draw(st.booleans()):
        body["system"] = draw(content(media))  # Anthropic system blocks: images in a list are counted too
    body.update(draw(reasoning_fields()))
    if draw(st.booleans()):
        extra: dict[str, Any] = draw(reasoning_fields())
        if draw(st.booleans()):
            extra["mm_processor_kwargs"] = draw(processor_kwargs)
        body["extra_body"] = extra if draw(st.integers(0, 9)) else draw(junk)
    if draw(st.booleans()):
        body["vllm_xargs"] = draw(reasoning_fields())
    if draw(st.booleans()):
        body["mm_processor_kwargs"] = draw(processor_kwargs)
    for name in ("max_tokens", "max_completion_tokens", "stream"):
        if draw(st.booleans()):
            body[name] = draw(st.one_of(st.integers(0, 10**6), junk))
    body["metadata"] = draw(request_metadata()) if draw(st.integers(0, 9)) else draw(junk)
    if draw(st.booleans()):
        body["litellm_metadata"] = draw(request_metadata())
    auth = SimpleNamespace(
        token=KEY_HASH, key_alias=draw(st.sampled_from([None, "k"])),
        team_id=draw(st.sampled_from([None, TEAM_ID])), team_alias=None,
        metadata=draw(owner_metadata()), team_metadata=draw(owner_metadata()),
    )
    return body, auth, call_type, media


# -- the run, as LiteLLM calls the hooks --------------------------------------------------------------


@dataclass
class Outcome:
    passed: bool
    data: dict[str, Any]
    refusal: ProxyException | None
    response: dict[str, Any]
    headers: dict[str, str] | None
    scopes: set[str]
    images: int | None  # images in the vision decision the proxy kept (None: no decision)


def _internal_errors() -> float:
    return sum(INTERNAL_ERRORS.labels(h, hook)._value.get()
               for h in ("vision", "reasoning")
               for hook in ("post_success_deployment", "post_success", "response_headers", "log_success",
                            "log_failure"))


async def _run(body: dict[str, Any], auth: Any, call_type: str, fail: bool, reasoning_tokens: Any) -> Outcome:
    budgets = MemoryPeriodBudgets()
    vision, reasoning = VisionHandler(SETTINGS, budgets), ReasoningHandler(SETTINGS, budgets)
    cb = LiteLLMKV(settings=SETTINGS, handlers=[vision, reasoning])
    data = body
    images: int | None = None
    try:
        await cb.async_pre_call_hook(auth, None, data, call_type)
    except ProxyException as exc:
        return Outcome(False, data, exc, {}, None, _scopes(budgets), None)
    kept = vision._decision_of(data)
    if kept is not None:
        images = len(kept["images"])
    response: dict[str, Any] = {
        "choices": [{"message": {"role": "assistant", "content": "answer", "reasoning_content": "thought " * 5}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42,
                  "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}},
    }
    before = _internal_errors()
    if fail:
        await cb.async_post_call_failure_deployment_hook(data, RuntimeError("upstream"), call_type)
        await cb.async_log_failure_event(data, None, None, None)
        await cb.async_post_call_failure_hook(data, RuntimeError("upstream"), auth)
        headers = None
    else:
        await cb.async_pre_call_deployment_hook(data, call_type)
        await cb.async_post_call_success_deployment_hook(data, response, call_type)
        await cb.async_post_call_success_hook(data, auth, response)
        headers = await cb.async_post_call_response_headers_hook(data, auth, response)
        await cb.async_log_success_event(data, response, None, None)
    for h in (vision, reasoning):
        await asyncio.gather(*h._settling)  # settling runs off the response path: wait for it here
    assert _internal_errors() == before, "a post-call hook of a governance handler failed"
    return Outcome(True, data, None, response, headers, _scopes(budgets), images)


def _scopes(budgets: MemoryPeriodBudgets) -> set[str]:
    """Every scope the store holds usage or holds for."""
    keys = set(budgets._used) | {k for k, holds in budgets._holds.items() if holds}
    return {scope for scope, *_ in keys}


def _engine_view(data: dict[str, Any]) -> dict[str, Any]:
    """The fields the engine receives: LiteLLM sends ``extra_body`` entries as top-level fields. Where both
    places hold one, the top level's reached the engine through a real proxy
    (``tests/integration/test_fuzz_findings_proxy.py``); the checks below hold whichever wins."""
    extra = data.get("extra_body")
    return {**extra, **data} if isinstance(extra, dict) else dict(data)


def _check_governed_request(data: dict[str, Any], group: str) -> None:
    """Property 2: what the engine receives carries the proxy's own limits only."""
    sent = _engine_view(data)
    if "reasoning" in GROUPS[group]:
        for place, where in ((sent, "the engine's body"), (data.get("vllm_xargs"), "vllm_xargs")):
            if not isinstance(place, dict):
                continue
            for name in CLIENT_REASONING_FIELDS:
                if name == "thinking_token_budget" and place is sent:
                    continue  # the proxy's own, checked below
                assert name not in place, f"client field {name} reaches {where}"
        budget = sent["thinking_token_budget"]
        assert isinstance(budget, int) and 0 <= budget <= MAX_BUDGET, budget
        kwargs = sent["chat_template_kwargs"]
        assert isinstance(kwargs, dict) and isinstance(kwargs.get("enable_thinking"), bool), kwargs
        assert all(kwargs.get(s) is None for s in TEMPLATE_SWITCHES if s != "enable_thinking"), kwargs
        extra = data.get("extra_body")
        extra_kwargs = extra.get("chat_template_kwargs") if isinstance(extra, dict) else None
        if isinstance(extra_kwargs, dict):
            assert not set(extra_kwargs) & set(TEMPLATE_SWITCHES), "a client thinking switch left in extra_body"
    if "vision" in GROUPS[group]:
        mm = sent.get("mm_processor_kwargs")
        assert mm is None or mm == data.get("mm_processor_kwargs"), "client mm_processor_kwargs in extra_body"
        if mm is not None:
            assert set(mm) <= {"min_pixels", "max_pixels"}, mm
            assert all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in mm.values()), mm


def _found(**body: Any) -> tuple[dict[str, Any], Any, str, Media]:
    """A case the fuzzing found, kept as an explicit example (it runs first, on every profile)."""
    auth = SimpleNamespace(token=KEY_HASH, key_alias="k", team_id=TEAM_ID, team_alias=None,
                           metadata={"litellm_kv": {"reasoning": {"allowed": False}}}, team_metadata=None)
    request = {"model": "gov", "litellm_call_id": "c-found", "messages": [{"role": "user", "content": "hi"}], **body}
    return request, auth, "completion", Media()


@FUZZ
# Template kwargs in extra_body beside the proxy's own switch (the proxy's reaches the engine).
@example(case=_found(extra_body={"chat_template_kwargs": {"custom": 1}}), fail=False, reasoning_tokens=None)
# A chat_template_kwargs that is not an object crashed the handler (500 reasoning.internal_error).
@example(case=_found(chat_template_kwargs="yes"), fail=False, reasoning_tokens=None)
@given(case=scenario(), fail=st.booleans(),
       reasoning_tokens=st.one_of(st.none(), st.integers(0, 10**6), st.text(max_size=3), st.booleans()))
def test_reasoning_and_vision_limits_hold_against_any_request(case: tuple[dict[str, Any], Any, str, Media], fail: bool,
                                              reasoning_tokens: Any) -> None:
    body, auth, call_type, media = case
    body = copy.deepcopy(body)  # the hooks change the request in place; an example may run twice
    group = body["model"]
    out = asyncio.run(_run(body, auth, call_type, fail, reasoning_tokens))
    # What the examples reached (pytest --hypothesis-show-statistics): passes and refusals per group.
    event(f"{group}: " + ("passed" if out.passed else f"refused {out.refusal.param if out.refusal else ''}"))
    own = {f"key:{KEY_HASH}"} | ({f"team:{auth.team_id}"} if auth.team_id else set())
    # 3. Only the caller's key and team are ever charged or held, whatever the metadata says.
    assert out.scopes <= own, out.scopes - own
    if not out.passed:
        # 1. A refusal names the limit; a handler crash (internal_error) is a reader bug.
        assert out.refusal is not None
        assert out.refusal.param and not out.refusal.param.endswith(".internal_error"), out.refusal.message
        assert int(out.refusal.code) in range(400, 600)
        return
    if group == "free":
        return
    governs_images = "vision" in GROUPS[group]
    # 1. Images the engine will read are counted (or the request refused); broken ones never pass.
    if governs_images:
        assert call_type in ("completion", "acompletion"), "an endpoint vision does not charge passed"
        assert media.broken == 0, "an image that cannot be counted passed"
        assert (out.images or 0) == media.images, (out.images, media.images)
        assert media.images <= MAX_IMAGES
    if "reasoning" in GROUPS[group]:
        assert call_type in ("completion", "acompletion"), "an endpoint reasoning cannot meter passed"
    _check_governed_request(out.data, group)
    if not fail:
        # 3. Headers are litellm-kv's own; reasoning is hidden where the group's policy says so.
        assert all(name.startswith("x-litellm-kv-") for name in out.headers or {}), out.headers
        if "reasoning" in GROUPS[group]:
            assert out.response["choices"][0]["message"]["reasoning_content"] is None

