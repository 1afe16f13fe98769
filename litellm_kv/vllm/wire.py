"""vLLM's KV-event wire protocol (vllm-contract.md §5.3), spoken by both consumers of the events:
the embedded subscriber (:mod:`litellm_kv.vllm.subscriber`) and the indexer's streams
(:mod:`litellm_kv.services.indexer.stream`).

* A **live message** is 3 frames ``(topic, seq, payload)``: ``seq`` is 8 bytes big-endian and
  starts at 0 per engine process; ``payload`` is one msgpack event batch.
* A **replay**: a DEALER sends ``[b"", start_seq]`` to the engine's ROUTER, which answers
  ``[b"", topic, seq, payload]`` for every buffered batch from ``start_seq`` on, then the end
  marker (seq ``ff..ff``).

What each consumer does with a gap, a timeout or a malformed frame is its own policy; this module
only says what the frames are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

SEQ_BYTES = 8
END_SEQ = b"\xff" * SEQ_BYTES
"""The seq of the replay's end marker."""

_WILDCARDS = ("tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:")


class WireError(ValueError):
    """Frames that do not follow the layout (their count or the seq's width)."""


@dataclass(frozen=True, slots=True)
class EventMessage:
    """One batch as it travels: live from the PUB or replayed from the ROUTER."""

    topic: bytes
    seq: int
    payload: bytes


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big")


def decode_seq(frame: bytes) -> int:
    if len(frame) != SEQ_BYTES:
        raise WireError(f"seq frame of {len(frame)} bytes, expected {SEQ_BYTES}")
    return int.from_bytes(frame, "big")


def parse_event_message(frames: Sequence[bytes]) -> EventMessage:
    """A live message from the PUB. Raises :class:`WireError`."""
    if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
        raise WireError(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    topic, seq, payload = frames
    return EventMessage(topic, decode_seq(seq), payload)


def replay_request(start: int) -> list[bytes]:
    """What a DEALER sends to ask for the buffered batches from ``start`` on."""
    return [b"", encode_seq(start)]


def parse_replay_reply(frames: Sequence[bytes]) -> EventMessage | None:
    """One ROUTER reply as a DEALER receives it; None for the end marker. Raises :class:`WireError`."""
    if len(frames) != 4 or frames[0] != b"" or len(frames[2]) != SEQ_BYTES:
        raise WireError(f"replay reply with {len(frames)} frames")
    if frames[2] == END_SEQ:
        return None
    return EventMessage(frames[1], decode_seq(frames[2]), frames[3])


def connectable(endpoint: str, api_base: str) -> str:
    """A publisher's bind address (``tcp://*:5557``) as a subscriber can connect to it."""
    for wildcard in _WILDCARDS:
        if endpoint.startswith(wildcard):
            host = urlsplit(api_base).hostname or "127.0.0.1"
            return f"tcp://{host}:{endpoint[len(wildcard):]}"
    return endpoint


@dataclass(slots=True)
class Replay:
    """What a replay request returned."""

    batches: list[tuple[int, bytes]]
    """``(seq, payload)`` in the order the engine sent them."""
    complete: bool
    """True when the end marker arrived; False when the engine went quiet for ``timeout_s``
    (``batches`` then holds what came before)."""


async def request_replay(
    ctx: zmq.asyncio.Context,
    endpoint: str,
    start: int,
    *,
    timeout_s: float,
    on_malformed: Callable[[str], None] | None = None,
) -> Replay:
    """Ask the engine's ROUTER at ``endpoint`` for its buffered batches from ``start`` on.

    Waits at most ``timeout_s`` for each reply frame, so a long replay is not cut short while
    the engine is still sending. Malformed replies are skipped (and passed to ``on_malformed``).
    Raises :class:`zmq.ZMQError` when the socket cannot be used.
    """
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    out: list[tuple[int, bytes]] = []
    timeout_ms = int(timeout_s * 1000)
    try:
        sock.connect(endpoint)
        await sock.send_multipart(replay_request(start))
        while True:
            if not await sock.poll(timeout_ms):
                return Replay(out, complete=False)
            frames = await sock.recv_multipart()
            try:
                msg = parse_replay_reply(frames)
            except WireError as exc:
                if on_malformed is not None:
                    on_malformed(str(exc))
                continue
            if msg is None:
                return Replay(out, complete=True)
            out.append((msg.seq, msg.payload))
    finally:
        sock.close(0)
