"""The save-time gate in front of LiteLLM's management routes, as an ASGI app around a recording app (the
proxy's own routes behind it are exercised on the real database in ``test_litellm_db.py``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from litellm_kv.integration.metadata_gate import MAX_BODY_BYTES, MetadataGate, check_body, gated_route


class Recorder:
    """Stands for LiteLLM's app: records the body it receives and answers 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def call(gate: MetadataGate, method: str, path: str, body: bytes, chunk: int = 0) -> tuple[int, Any]:
    parts = [body[i:i + chunk] for i in range(0, len(body), chunk)] if chunk else [body]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    asyncio.run(gate(scope, receive, send))
    status = sent[0]["status"]
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return status, json.loads(payload) if payload else None


def gate_of() -> tuple[MetadataGate, Recorder]:
    app = Recorder()
    return MetadataGate(app, lambda: "litellm_kv"), app


BAD = {"litellm_kv": {"reasoning": {"max_budget": "lots"}}}
GOOD = {"litellm_kv": {"reasoning": {"max_budget": 64}}, "owner": "x"}


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/key/generate", {"key_alias": "a", "metadata": BAD}),
    ("POST", "/key/update", {"key": "sk-1", "metadata": BAD}),
    ("POST", "/key/regenerate", {"key": "sk-1", "metadata": BAD}),
    ("POST", "/key/sk-1/regenerate", {"metadata": BAD}),
    ("POST", "/key/service-account/generate", {"metadata": BAD}),
    ("POST", "/team/key/bulk_update", {"team_id": "t", "all_keys_in_team": True, "update_fields": {"metadata": BAD}}),
    ("POST", "/user/new", {"metadata": BAD}),
    ("POST", "/team/new", {"team_alias": "t", "metadata": BAD}),
    ("POST", "/team/update/", {"team_id": "t", "metadata": BAD}),
    ("PATCH", "/team/t-1", {"metadata": BAD}),
])
def test_every_metadata_writing_route_is_checked(method: str, path: str, body: dict[str, Any]) -> None:
    gate, app = gate_of()
    status, answer = call(gate, method, path, json.dumps(body).encode())
    assert status == 400 and app.bodies == []
    assert answer["error"]["param"] == "metadata.litellm_kv.reasoning.max_budget"
    ok = json.dumps({**body, "metadata": GOOD} if "metadata" in body else {**body, "update_fields": {"metadata": GOOD}})
    status, _ = call(gate, method, path, ok.encode(), chunk=7)
    assert status == 200 and app.bodies == [ok.encode()]  # passed on unchanged, chunked bodies reassembled


def test_owner_is_named_by_alias_never_by_key() -> None:
    gate, _ = gate_of()
    _, answer = call(gate, "POST", "/key/update", json.dumps({"key": "sk-secret", "metadata": BAD}).encode())
    assert answer["error"]["message"].startswith("litellm-kv limits not saved: key: metadata.litellm_kv")
    assert "sk-secret" not in json.dumps(answer)
    _, answer = call(gate, "POST", "/team/new", json.dumps({"team_alias": "research", "metadata": BAD}).encode())
    assert "team 'research': metadata.litellm_kv.reasoning.max_budget" in answer["error"]["message"]


@pytest.mark.parametrize("body", [b"", b"not json", b"[1]", b'{"metadata": null}', b'{"metadata": {"other": 1}}',
                                  b'{"metadata": "a string"}'])
def test_what_litellm_kv_does_not_read_passes_through(body: bytes) -> None:
    gate, app = gate_of()
    status, _ = call(gate, "POST", "/key/generate", body)
    assert status == 200 and app.bodies == [body]


def test_other_routes_are_not_read() -> None:
    gate, app = gate_of()
    body = json.dumps({"model": "m", "metadata": BAD}).encode()
    assert call(gate, "POST", "/v1/chat/completions", body)[0] == 200
    assert call(gate, "GET", "/key/generate", body)[0] == 200
    assert app.bodies == [body, body]
    assert gated_route("POST", "/team/member_add") is None and gated_route("PATCH", "/team/a/b") is None


def test_an_oversized_write_is_refused_not_let_through() -> None:
    gate, app = gate_of()
    body = json.dumps({"metadata": {"pad": "x" * MAX_BODY_BYTES}}).encode()
    status, answer = call(gate, "POST", "/key/update", body, chunk=65536)
    assert status == 413 and app.bodies == [] and answer["error"]["code"] == "413"


def test_check_body_reads_the_one_line_string_the_team_editor_stores() -> None:
    route = gated_route("POST", "/team/update")
    assert route is not None
    bad = json.dumps({"team_id": "t", "metadata": {"litellm_kv": '{"vision": {"over_limit": "shrink"}}'}}).encode()
    assert [e.path for e in check_body(route, bad, "litellm_kv")] == ["metadata.litellm_kv.vision.over_limit"]
