"""A stream's usage chunk, seen at the moment LiteLLM records it: the one point where a stream's measured tokens
and litellm-kv's breakdown can still reach LiteLLM's price and its spend-log row.

LiteLLM 1.110.2 strips the usage chunk before any hook sees it, then, once the stream ends, prices the call
from the chunks its stream wrapper recorded and builds the spend-log row (``_ProxyDBLogger``) before the
success callbacks after it run. So a stream is settled when its usage chunk is appended to the wrapper's
``chunks`` list: :func:`watch` replaces that list (shared by the router's wrapper and the provider's one) with
a :class:`UsageWatch` that calls each feature's listener first. One watch per stream, whatever the number of
listeners: a second wrap would hide the first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from litellm_kv.integration import litellm_data

log = logging.getLogger("litellm_kv")

#: Called with the usage object (writable: what LiteLLM prices) and the chunk that carries it.
UsageListener = Callable[[Any, Any], None]


class UsageWatch(list):  # type: ignore[type-arg]
    """The stream wrapper's recorded chunks: calls every listener with the usage chunk as it is recorded."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.listeners: list[UsageListener] = []

    def append(self, item: Any) -> None:
        usage = getattr(item, "usage", None)
        if usage is not None and int(litellm_data.field(usage, "prompt_tokens") or 0):
            for listener in self.listeners:
                try:
                    listener(usage, item)
                except Exception:  # never break the stream over billing
                    log.exception("litellm-kv: could not write measured tokens into a stream's usage")
        super().append(item)


def _unwrap(stream: Any) -> Any:
    # The proxy hands a boundary object that delegates to LiteLLM's CustomStreamWrapper (``_source``).
    for _ in range(4):
        try:  # its own attribute, not a delegated one
            stream = object.__getattribute__(stream, "_source")
        except AttributeError:
            break
    return stream


def watch(stream: Any, listener: UsageListener) -> Mapping[str, Any] | None:
    """Call ``listener`` when ``stream``'s usage chunk is recorded. Returns the call's logging details
    (``model_call_details``: where LiteLLM's spend-log row reads the request metadata from), or ``None``
    when the stream is not one of LiteLLM's wrappers (then nothing is watched)."""
    stream = _unwrap(stream)
    chunks = getattr(stream, "chunks", None)
    if not isinstance(chunks, list):
        return None
    if isinstance(chunks, UsageWatch):
        watched = chunks
    else:
        watched = UsageWatch(chunks)
        for holder in [stream, *_inner_wrappers(stream, chunks)]:
            holder.chunks = watched
    watched.listeners.append(listener)
    details = getattr(getattr(stream, "logging_obj", None), "model_call_details", None)
    return details if isinstance(details, Mapping) else {}


def _inner_wrappers(stream: Any, chunks: list[Any]) -> list[Any]:
    """LiteLLM's router wraps the provider's stream wrapper and shares its ``chunks`` list; the inner
    wrapper (the one that records the usage chunk) is only reachable through the generator's frame."""
    frame = getattr(getattr(stream, "__dict__", {}).get("_async_generator"), "ag_frame", None)
    if frame is None:
        return []
    found = []
    for value in frame.f_locals.values():
        if value is not stream and getattr(value, "__dict__", {}).get("chunks") is chunks:
            found.append(value)
    return found
