"""A local OpenAI-compatible upstream for tests where no real engine can serve the case.

It stands in for providers (OpenAI, Anthropic-style prompt caches) and for vision/reasoning
models that cannot run on this machine. It records every request it receives
(``GET /_requests``), models a per-deployment prompt cache over whitespace "tokens"
(``cached_tokens`` = longest previously seen prefix, rounded down to ``--cache-block`` tokens,
only for prompts of at least ``--min-cache-tokens``), and can answer with reasoning content.

Run: ``python -m tests.support.fake_upstream --port P --name dep-a [--reasoning-words N]``.
Control: ``POST /_fail {"status": 500}`` makes it fail until ``POST /_fail {"status": 0}``;
``POST /_reset`` clears requests and cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def prompt_tokens(body: dict[str, Any]) -> list[str]:
    """Whitespace tokens of the rendered conversation (role markers count as tokens)."""
    out: list[str] = []
    for tool in body.get("tools") or []:
        out.extend(json.dumps(tool, sort_keys=True).split())
    for m in body.get("messages") or []:
        out.append(f"<{m.get('role')}>")
        content = m.get("content")
        if isinstance(content, str):
            out.extend(content.split())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    out.extend(str(part.get("text", "")).split())
                elif isinstance(part, dict):
                    out.append(f"<{part.get('type')}>")
    if body.get("prompt"):
        out.extend(str(body["prompt"]).split())
    return out


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.requests: list[dict[str, Any]] = []
        self.cache: set[tuple[str, ...]] = set()
        self.fail_status = 0
        self.stray: list[dict[str, Any]] = []

    def cached(self, toks: list[str]) -> int:
        blk = self.args.cache_block
        if len(toks) < self.args.min_cache_tokens:
            return 0
        hit = 0
        for end in range(blk, len(toks) + 1, blk):
            if tuple(toks[:end]) in self.cache:
                hit = end
            else:
                break
        for end in range(blk, len(toks) + 1, blk):
            self.cache.add(tuple(toks[:end]))
        return hit


def build_app(args: argparse.Namespace) -> Starlette:
    st = State(args)

    async def chat(request: Request) -> Response:
        body = await request.json()
        st.requests.append({"path": "/v1/chat/completions", "body": body, "headers": dict(request.headers),
                            "ts": time.time()})
        if st.fail_status:
            return JSONResponse({"error": {"message": f"{args.name} failing on purpose"}}, st.fail_status)
        if args.delay_ms:
            await asyncio.sleep(args.delay_ms / 1000)
        toks = prompt_tokens(body)
        cached = st.cached(toks)
        n_reason = args.reasoning_words
        template_kwargs = body.get("chat_template_kwargs") or {}
        if template_kwargs.get("enable_thinking") is False or template_kwargs.get("thinking") is False:
            n_reason = 0  # like a Qwen3/DeepSeek-V3.1 template with thinking switched off
        budget = body.get("thinking_token_budget")
        if isinstance(budget, int) and budget >= 0:
            n_reason = min(n_reason, budget)
        reasoning = " ".join(f"think{i}" for i in range(n_reason)) if n_reason else None
        content = f"answer from {args.name}"
        # ``n`` sequences, each thinking as above (as vLLM applies thinking_token_budget per sequence).
        n_seq = body.get("n") if isinstance(body.get("n"), int) and body["n"] > 0 else 1
        completion = (len(content.split()) + (n_reason if args.count_reasoning_in_completion else 0)) * n_seq
        usage: dict[str, Any] = {
            "prompt_tokens": len(toks),
            "completion_tokens": completion,
            "total_tokens": len(toks) + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if args.report_reasoning_tokens and n_reason:
            usage["completion_tokens_details"] = {"reasoning_tokens": n_reason * n_seq}
        n_images = sum(1 for t in toks if t == "<image_url>")
        if args.image_tokens_each and n_images:
            mm_tokens = args.image_tokens_each * n_images
            # vLLM 0.32 reports {"image": n}; --mm-tokens-format int keeps the older bare count.
            usage["prompt_tokens_details"]["multimodal_tokens"] = (
                {"image": mm_tokens} if args.mm_tokens_format == "dict" else mm_tokens
            )
        if args.image_prompt_tokens and n_images:
            # Like a vision engine: each image occupies that many prompt tokens instead of one.
            extra = (args.image_prompt_tokens - 1) * n_images
            usage["prompt_tokens"] += extra
            usage["total_tokens"] += extra
        rid = f"chatcmpl-{args.name}-{len(st.requests)}"
        headers = {"x-fake-deployment": args.name}
        if body.get("stream"):
            record = st.requests[-1]
            record["stream"] = "started"

            async def gen() -> Any:
                sent = 0
                try:
                    async for chunk in _chunks():
                        if args.chunk_delay_ms:
                            await asyncio.sleep(args.chunk_delay_ms / 1000)
                        yield chunk
                        sent += 1
                    record["stream"] = "done"
                finally:
                    record["chunks_sent"] = sent
                    if record["stream"] != "done":
                        record["stream"] = "cut"  # the client (the proxy) went away part-way

            async def _chunks() -> Any:
                base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": body.get("model", "fake")}
                for k in range(n_seq):
                    if reasoning:
                        for w in reasoning.split():
                            yield "data: " + json.dumps({**base, "choices": [
                                {"index": k, "delta": {"reasoning_content": w + " "}, "finish_reason": None}]}) + "\n\n"
                    for w in content.split():
                        yield "data: " + json.dumps({**base, "choices": [
                            {"index": k, "delta": {"content": w + " "}, "finish_reason": None}]}) + "\n\n"
                    yield "data: " + json.dumps({**base, "choices": [
                        {"index": k, "delta": {}, "finish_reason": "stop"}]}) + "\n\n"
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield "data: " + json.dumps({**base, "choices": [], "usage": usage}) + "\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(gen(), media_type="text/event-stream", headers=headers)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        return JSONResponse({
            "id": rid, "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "fake"),
            "choices": [{"index": k, "message": dict(message), "finish_reason": "stop"} for k in range(n_seq)],
            "usage": usage,
        }, headers=headers)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": args.served_model, "object": "model"}]})

    async def requests_(request: Request) -> Response:
        return JSONResponse(st.requests)

    async def reset(request: Request) -> Response:
        st.requests.clear()
        st.cache.clear()
        return JSONResponse({"ok": True})

    async def fail(request: Request) -> Response:
        st.fail_status = int((await request.json()).get("status", 0))
        return JSONResponse({"ok": True})

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "name": args.name})

    async def stray(request: Request) -> Response:
        # Any other path: recorded (GET /_stray) so a test can tell that nothing reached this upstream, then 404.
        st.stray.append({"path": request.url.path, "method": request.method,
                         "body": (await request.body()).decode("utf-8", "replace")})
        return JSONResponse({"error": {"message": f"{args.name} serves no {request.url.path}"}}, 404)

    async def strays(request: Request) -> Response:
        return JSONResponse(st.stray)

    return Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models),
        Route("/health", health),
        Route("/_requests", requests_),
        Route("/_reset", reset, methods=["POST"]),
        Route("/_fail", fail, methods=["POST"]),
        Route("/_stray", strays),
        Route("/{path:path}", stray, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
    ])


def start_fake_upstream(name: str, *args: str, timeout: float = 30.0) -> tuple[Any, str]:
    """Start one fake deployment as its own process on a free port; returns (process, base URL)."""
    from tools.harness.procs import PYTHON, ROOT, ManagedProcess, free_port

    port = free_port()
    proc = ManagedProcess(f"fake-{name}", [PYTHON, "-m", "tests.support.fake_upstream", "--port", str(port),
                                           "--name", name, *args], cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(url + "/health", timeout)
    except Exception:
        proc.stop()
        raise
    return proc, url


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--served-model", default="fake-model")
    ap.add_argument("--cache-block", type=int, default=16)
    ap.add_argument("--min-cache-tokens", type=int, default=0)
    ap.add_argument("--reasoning-words", type=int, default=0)
    ap.add_argument("--report-reasoning-tokens", action="store_true")
    ap.add_argument("--count-reasoning-in-completion", action="store_true")
    ap.add_argument("--image-tokens-each", type=int, default=0)
    ap.add_argument("--mm-tokens-format", choices=["int", "dict"], default="int")
    ap.add_argument("--image-prompt-tokens", type=int, default=0,
                    help="prompt tokens each image occupies (0: one whitespace token, the default)")
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--chunk-delay-ms", type=float, default=0.0,
                    help="pause before each streamed chunk (a client can go away part-way)")
    args = ap.parse_args()
    uvicorn.run(build_app(args), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
