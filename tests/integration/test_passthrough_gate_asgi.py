"""The pass-through gate as an ASGI app around a recording app: which paths it reads, which names it finds, and
that it fails closed. ``Groups`` stands in for LiteLLM's router (the real one is asked in
``test_passthrough_gate.py``, through a real proxy)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import pytest

from litellm_kv.integration import passthrough_gate as gate_mod
from litellm_kv.integration.passthrough_gate import (
    FALLBACK_PREFIXES,
    MAX_BODY_BYTES,
    MAX_SEGMENTS,
    PassThroughGate,
    TooManySegments,
    named_models,
    pass_through_of,
    provider_prefixes,
)
from tests.integration.test_metadata_gate import Recorder


class Groups:
    """A stand-in for GroupNames: ``qwen`` is governed and served at http://engine:8000."""

    governed: ClassVar[dict[str, list[str]]] = {"qwen": ["reasoning"]}

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked: list[str] = []

    def groups_reached(self, name: str) -> list[str]:
        if self.fail:
            raise RuntimeError("router unavailable")
        self.asked.append(name)
        return ["qwen"] if name in ("qwen", "Org/qwen") else []

    def groups_served_at(self, url: str) -> list[str]:
        return ["qwen"] if url.startswith("http://engine:8000") else []

    async def prepare(self, names: Any, team_id: str | None = None, *, urls: Any = ()) -> None:
        return None


def call(gate: PassThroughGate, path: str, body: bytes = b"", query: str = "",
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "query_string": query.encode(),
             "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()]}
    asyncio.run(gate(scope, receive, send))
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], json.loads(payload) if payload else None


@pytest.fixture
def no_router(monkeypatch: pytest.MonkeyPatch) -> None:
    # Outside a proxy: no router model is known, no endpoint is configured.
    monkeypatch.setattr(gate_mod, "router_knows", lambda model: False)
    monkeypatch.setattr(gate_mod, "configured_endpoints", lambda: [])
    monkeypatch.delenv("VLLM_API_BASE", raising=False)
    monkeypatch.delenv("LITELLM_BUILTIN_PASS_THROUGH_ROUTES_FIRST", raising=False)


def test_litellm_s_own_prefix_list_is_read_and_matches_the_copy() -> None:
    assert set(provider_prefixes()) == set(FALLBACK_PREFIXES)


@pytest.mark.usefixtures("no_router")
def test_which_paths_are_pass_through_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    prefixes = provider_prefixes()
    assert pass_through_of("/vllm/v1/chat/completions", prefixes, []) is not None
    assert pass_through_of("/v1/chat/completions", prefixes, []) is None
    assert pass_through_of("/vllmx/v1/chat/completions", prefixes, []) is None
    # The proxy's own chat route under /openai/ runs the hooks ...
    assert pass_through_of("/openai/deployments/qwen/chat/completions", prefixes, []) is None
    assert pass_through_of("/openai/v1/chat/completions", prefixes, []) is not None
    # ... unless LiteLLM is told to put its pass-through routes first.
    monkeypatch.setenv("LITELLM_BUILTIN_PASS_THROUGH_ROUTES_FIRST", "true")
    assert pass_through_of("/openai/deployments/qwen/chat/completions", prefixes, []) is not None
    configured = [("/mine", "http://engine:8000/v1/chat/completions")]
    route = pass_through_of("/mine/sub", prefixes, configured)
    assert route is not None and route.targets == ("http://engine:8000/v1/chat/completions",)
    assert pass_through_of("/minefield", prefixes, configured) is None
    monkeypatch.setenv("VLLM_API_BASE", "http://engine:8000")
    route = pass_through_of("/vllm/v1/completions", prefixes, [])
    assert route is not None and route.targets == ("http://engine:8000",)


def test_every_name_a_request_may_be_routed_by_is_found() -> None:
    body = json.dumps({"model": "from-body", "messages": []}).encode()
    names, body_model = named_models("/vllm/v1/x/models/Org/qwen:generateContent", "/vllm/", "model=from-query",
                                     {"x-litellm-model": "from-header"}, body, "application/json")
    assert body_model == "from-body" and names[:3] == ["from-body", "from-query", "from-header"]
    assert {"v1", "Org", "Org/qwen:generateContent", "Org/qwen", "qwen"} <= set(names)
    names, body_model = named_models("/vllm/v1/completions", "/vllm/", "", {}, b"model=from-form&x=1",
                                     "application/x-www-form-urlencoded")
    assert body_model == "from-form"
    names, body_model = named_models("/vllm/v1/audio", "/vllm/", "model=q", {}, b"--b\r\nmodel",
                                     "multipart/form-data; b=b")
    assert body_model is None and "q" in names
    names, _ = named_models("/vllm/" + "/".join(f"s{i}" for i in range(MAX_SEGMENTS)), "/vllm/", "", {},
                            b"[" * 100_000, "")  # a body too deep for the JSON reader is no error
    assert f"s{MAX_SEGMENTS - 1}" in names  # every segment is read: LiteLLM's Azure relay tries each
    with pytest.raises(TooManySegments):
        named_models("/vllm/" + "/".join(f"s{i}" for i in range(MAX_SEGMENTS + 1)), "/vllm/", "", {}, b"", "")


@pytest.mark.usefixtures("no_router")
@pytest.mark.parametrize(("path", "body", "query"), [
    ("/vllm/v1/chat/completions", b'{"model": "qwen"}', ""),
    ("/vllm/v1/chat/completions", b"{}", "model=qwen"),
    ("/azure/openai/deployments/qwen/chat/completions", b"{}", ""),
    ("/bedrock/model/Org/qwen/converse", b"{}", ""),
])
def test_a_governed_model_is_refused_and_nothing_is_forwarded(path: str, body: bytes, query: str) -> None:
    app = Recorder()
    status, out = call(PassThroughGate(app, Groups), path, body, query)
    assert status == 400 and out["error"]["param"] == "governance.passthrough"
    assert app.bodies == []


@pytest.mark.usefixtures("no_router")
def test_what_reaches_no_governed_engine_is_replayed_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Recorder()
    body = b'{"model": "other", "messages": [{"role": "user", "content": "hi"}]}'
    assert call(PassThroughGate(app, Groups), "/vllm/v1/chat/completions", body)[0] == 200
    assert app.bodies == [body]
    # The route's own target is the governed engine: refused when no router model is named ...
    monkeypatch.setenv("VLLM_API_BASE", "http://engine:8000")
    assert call(PassThroughGate(app, Groups), "/vllm/v1/chat/completions", body)[0] == 400
    # ... not when the router relays the request to the body's model's deployment instead ...
    monkeypatch.setattr(gate_mod, "router_knows", lambda model: model == "other")
    assert call(PassThroughGate(app, Groups), "/vllm/v1/chat/completions", body)[0] == 200
    # ... which a header or the query does not make LiteLLM do: the target is still checked then.
    status, out = call(PassThroughGate(app, Groups), "/vllm/v1/chat/completions", b"{}", "model=other",
                       {"x-litellm-model": "other"})
    assert status == 400 and "target" in out["error"]["message"] and "engine:8000" not in out["error"]["message"]


@pytest.mark.usefixtures("no_router")
def test_without_governed_groups_nothing_is_read() -> None:
    class Ungoverned(Groups):
        governed: ClassVar[dict[str, list[str]]] = {}

    app = Recorder()
    names = Ungoverned()
    assert call(PassThroughGate(app, lambda: names), "/vllm/v1/chat/completions", b'{"model": "qwen"}')[0] == 200
    assert names.asked == []


@pytest.mark.usefixtures("no_router")
def test_it_fails_closed() -> None:
    app = Recorder()
    status, out = call(PassThroughGate(app, lambda: Groups(fail=True)), "/vllm/v1/chat/completions",
                       b'{"model": "qwen"}')
    assert status == 500 and out["error"]["param"] == "governance.internal_error"
    status, out = call(PassThroughGate(app, Groups), "/vllm/v1/chat/completions", b" " * (MAX_BODY_BYTES + 1))
    assert status == 413
    status, out = call(PassThroughGate(app, Groups), "/azure/" + "x/" * MAX_SEGMENTS + "qwen/chat", b"{}")
    assert status == 400 and out["error"]["param"] == "governance.passthrough"
    assert app.bodies == []
