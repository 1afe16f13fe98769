"""The KV-event frames and the one replay client both consumers use.

A real engine cannot be made to stall mid-replay or answer garbage, so the ROUTER here is a local
socket speaking vLLM's replay protocol (vllm-contract.md §5.3); tests/vllm/test_engine_exactness.py
and tests/services/test_indexer_engines.py replay from real engines.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import zmq
import zmq.asyncio

from litellm_kv.vllm.wire import (
    END_SEQ,
    EventMessage,
    WireError,
    encode_seq,
    parse_event_message,
    parse_replay_reply,
    request_replay,
)
from tools.harness.procs import free_port


def test_live_message_layout() -> None:
    assert parse_event_message([b"t", encode_seq(7), b"p"]) == EventMessage(b"t", 7, b"p")
    with pytest.raises(WireError):
        parse_event_message([b"t", encode_seq(7)])
    with pytest.raises(WireError):
        parse_event_message([b"t", b"\x07", b"p"])


def test_replay_reply_layout() -> None:
    assert parse_replay_reply([b"", b"t", encode_seq(3), b"p"]) == EventMessage(b"t", 3, b"p")
    assert parse_replay_reply([b"", b"", END_SEQ, b""]) is None
    with pytest.raises(WireError):
        parse_replay_reply([b"x", b"t", encode_seq(3), b"p"])


async def _router(sock: zmq.asyncio.Socket, replies: list[list[bytes]], end: bool) -> None:
    ident, _empty, _start = await sock.recv_multipart()
    for frames in replies:
        await sock.send_multipart([ident, *frames])
    if end:
        await sock.send_multipart([ident, b"", b"", END_SEQ, b""])
    await asyncio.sleep(3600)


@pytest.mark.parametrize("end", [True, False])
async def test_replay_returns_the_batches_and_skips_malformed_replies(end: bool) -> None:
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    router.bind(endpoint)
    replies = [[b"", b"t", encode_seq(4), b"a"], [b"", b"t", b"\x05"], [b"", b"t", encode_seq(5), b"b"]]
    task = asyncio.get_running_loop().create_task(_router(router, replies, end))
    malformed: list[str] = []
    try:
        replay = await request_replay(ctx, endpoint, 4, timeout_s=0.5, on_malformed=malformed.append)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        router.close(0)
        ctx.term()
    # Without the end marker the batches that came are still returned, marked incomplete.
    assert replay.batches == [(4, b"a"), (5, b"b")]
    assert replay.complete is end
    assert len(malformed) == 1
