"""Decoding of vLLM KV-cache event batches (vllm-contract.md §5).

The publisher sends ``KVEventBatch`` as msgpack: an array ``[ts, [event, ...], dp_rank]``
whose events are maps tagged by ``"type"`` (vLLM >= 0.11) or, from older engines, positional
arrays ``["BlockStored", block_hashes, parent_block_hash, ...]``. Both are accepted; map keys
this module does not know are ignored, so newer engines keep working.

Block hashes arrive as 64-bit ints (the default) or as raw digests (msgpack ``bin``, when the
engine runs with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``). Events keep them as sent in
``block_hashes`` and also carry ``wire_block_hashes``, the 64-bit form the index uses.

Every malformed payload raises :class:`EventDecodeError` and nothing else, so a subscriber
can count and skip bad frames with one ``except``. With ``keep_valid=True`` the events are decoded
one by one: one that fails becomes a :class:`MalformedEvent` in its place and the others are kept,
and only a batch whose envelope (timestamp, event array) cannot be read raises.

Two decoders, one result. The fast one reads the encoding today's engines send (an array batch of
map events of the three known types) with typed ``msgspec`` structs, as vLLM defines its events,
checked in C. Anything it does not take (old positional events, unknown event types, a malformed
value) goes to the general decoder (:func:`decode_event_batch_general`: ``msgpack`` to Python
objects, then the checks below), which gives the answer for those payloads. Whenever the general
decoder decodes a payload, the fast one (:func:`decode_event_batch_typed`) returns the same events or
defers to it
(tests/vllm/test_events.py compares them on the vectors and on fuzzed payloads). The one difference:
the values of keys this module does not know are skipped unread by the fast decoder, so a payload
whose unknown key or value is not valid msgpack text (a map with integer keys, bad UTF-8) is decoded
instead of refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, TypeAlias

import msgpack
import msgspec

from litellm_kv.index.base import BlockOp, tier_of_medium

_U64_MAX: Final = (1 << 64) - 1
_INT_TYPES: Final = frozenset({int})

RawHash: TypeAlias = "int | bytes"


class EventDecodeError(ValueError):
    """A KV-event payload is not a valid ``KVEventBatch``; the message says what is wrong."""


@dataclass(slots=True)
class BlockStored:
    """Blocks that became cached on a replica (one event per request, group and step)."""

    block_hashes: tuple[RawHash, ...]
    parent_block_hash: RawHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None  # deprecated in vLLM: lora_int_id
    medium: str | None = None  # "GPU", "CPU", "STORAGE"; None from old engines = GPU
    lora_name: str | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None  # untagged, one per block
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None  # vLLM >= 0.33 (EAGLE)
    wire_block_hashes: tuple[int, ...] = ()
    wire_parent_block_hash: int | None = None


@dataclass(slots=True)
class BlockRemoved:
    """Blocks evicted from a replica (usually one hash per event)."""

    block_hashes: tuple[RawHash, ...]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None
    wire_block_hashes: tuple[int, ...] = ()


@dataclass(slots=True)
class AllBlocksCleared:
    """The replica dropped its whole prefix cache (``reset_prefix_cache``)."""


@dataclass(slots=True)
class UnknownEvent:
    """An event type this decoder does not know (a newer engine); kept, never indexed."""

    type: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class MalformedEvent:
    """An event of the batch that could not be decoded (``decode_event_batch(..., keep_valid=True)``).

    ``may_remove``: it was not recognisably a ``BlockStored``, so it may have removed blocks (or cleared
    them all). Skipping a lost store only under-predicts; a lost removal would over-predict for as long as
    the index lives, so a consumer purges the replica at this event's position instead.
    """

    type: str | None  # its type tag, when that much could be read
    error: str

    @property
    def may_remove(self) -> bool:
        return self.type != "BlockStored"


KVEvent: TypeAlias = "BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent | MalformedEvent"


@dataclass(slots=True)
class EventBatch:
    """One published batch: the engine-step time, its events and the engine's DP rank."""

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


def decode_event_batch(payload: bytes, *, keep_valid: bool = False) -> EventBatch:
    """Decode one ``KVEventBatch`` msgpack payload (the third ZMQ frame).

    ``keep_valid``: an event that does not decode becomes a :class:`MalformedEvent` in its place instead
    of failing the batch (the consumers' mode: one bad event must not cost the batch's other events).

    Raises:
        EventDecodeError: for anything that is not a well-formed batch (with ``keep_valid``: a batch
        whose envelope cannot be read).
    """
    batch = decode_event_batch_typed(payload)
    return batch if batch is not None else decode_event_batch_general(payload, keep_valid=keep_valid)


def decode_event_batch_typed(payload: bytes) -> EventBatch | None:
    """The fast decoder alone: the batch, or None for a payload its typed structs do not take (then
    :func:`decode_event_batch_general` decides what it is)."""
    try:
        wire = _FAST.decode(payload)
        return EventBatch(wire.ts, [_FAST_EVENT[type(e)](e) for e in wire.events], wire.data_parallel_rank)
    except Exception:  # anything the typed structs do not take: the general decoder judges it (and names the error)
        return None


def decode_event_batch_general(payload: bytes, *, keep_valid: bool = False) -> EventBatch:
    """:func:`decode_event_batch` for every encoding this module knows: ``msgpack`` to Python objects, then
    checked field by field. :func:`decode_event_batch` uses it for what its typed structs do not take."""
    try:
        obj = msgpack.unpackb(payload, raw=False, use_list=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises a zoo of types (ValueError, TypeError, ...)
        raise EventDecodeError(f"not msgpack: {type(exc).__name__}: {exc}") from exc
    try:
        return _batch(obj, _event_or_malformed if keep_valid else _event)
    except EventDecodeError:
        raise
    except Exception as exc:  # a gap in the checks below must still surface as this type
        raise EventDecodeError(f"malformed batch: {exc!r}") from exc


def to_block_ops(event: KVEvent, group_idx: int | None = None) -> list[BlockOp]:
    """Index mutations for one event: ``BlockStored`` -> +1 per hash on its medium's tier,
    ``BlockRemoved`` -> -1. ``AllBlocksCleared`` yields nothing: the caller must purge the
    replica (:meth:`KVIndex.purge_replica`). With ``group_idx`` set, events of other KV-cache
    groups (hybrid models: sliding-window or Mamba groups) are skipped."""
    if isinstance(event, BlockStored):
        delta = 1
    elif isinstance(event, BlockRemoved):
        delta = -1
    else:
        return []
    if group_idx is not None and event.group_idx is not None and event.group_idx != group_idx:
        return []
    if not event.wire_block_hashes:
        return []
    return [BlockOp(hashes=event.wire_block_hashes, tier=tier_of_medium(event.medium), delta=delta)]


# -- decoding ------------------------------------------------------------------------------

_STORED_FIELDS: Final = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
)
_REMOVED_FIELDS: Final = ("block_hashes", "medium", "group_idx", "locality", "ownership")


def _batch(obj: object, event: Callable[[object], KVEvent]) -> EventBatch:
    if isinstance(obj, tuple):
        if not 2 <= len(obj) <= 3:
            raise EventDecodeError(f"batch array must have 2 or 3 elements, got {len(obj)}")
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) == 3 else None
    elif isinstance(obj, Mapping):
        ts, events, rank = obj.get("ts"), obj.get("events"), obj.get("data_parallel_rank")
    else:
        raise EventDecodeError(f"batch must be an array, got {type(obj).__name__}")
    if type(ts) is not float and type(ts) is not int:
        raise EventDecodeError(f"batch ts must be a number, got {type(ts).__name__}")
    if not isinstance(events, tuple):
        raise EventDecodeError(f"batch events must be an array, got {type(events).__name__}")
    return EventBatch(float(ts), [event(e) for e in events], _opt_int(rank, "data_parallel_rank"))


def _event_or_malformed(obj: object) -> KVEvent:
    try:
        return _event(obj)
    except Exception as exc:  # EventDecodeError, or a gap in the checks: either way this event only
        return MalformedEvent(_type_tag(obj), str(exc) if isinstance(exc, EventDecodeError) else repr(exc))


def _type_tag(obj: object) -> str | None:
    kind = obj.get("type") if isinstance(obj, Mapping) else obj[0] if isinstance(obj, tuple) and obj else None
    return kind if isinstance(kind, str) else None


def _event(obj: object) -> KVEvent:
    if isinstance(obj, Mapping):
        kind = obj.get("type")
        fields: Mapping[str, Any] = obj
    elif isinstance(obj, tuple) and obj:
        # Positional (array_like) encoding of older engines: the tag, then fields in order.
        kind = obj[0]
        names = _POSITIONAL.get(kind) if isinstance(kind, str) else None
        fields = dict(zip(names, obj[1:], strict=False)) if names else {}
    else:
        raise EventDecodeError(f"event must be a map or array, got {type(obj).__name__}")
    if not isinstance(kind, str):
        raise EventDecodeError(f"event type tag must be a string, got {type(kind).__name__}")
    builder = _BUILDERS.get(kind)
    if builder is None:
        return UnknownEvent(kind, dict(fields) if isinstance(obj, Mapping) else {"values": obj[1:]})
    return builder(fields)


def _stored(f: Mapping[str, Any]) -> BlockStored:
    raw, wire = _hashes(f.get("block_hashes"))
    parent = f.get("parent_block_hash")
    wire_parent = None if parent is None else _wire(parent)
    tokens = f.get("token_ids", ())
    if not isinstance(tokens, tuple) or not set(map(type, tokens)) <= _INT_TYPES:
        raise EventDecodeError("token_ids must be an array of ints")
    block_size = f.get("block_size")
    if type(block_size) is not int or block_size <= 0:
        raise EventDecodeError(f"block_size must be a positive int, got {block_size!r}")
    extra = f.get("extra_keys")
    if extra is not None and (
        not isinstance(extra, tuple) or not all(k is None or isinstance(k, tuple) for k in extra)
    ):
        raise EventDecodeError("extra_keys must be an array of arrays or nils")
    lookahead = f.get("lookahead_token_ids")
    if lookahead is not None and (
        not isinstance(lookahead, tuple)
        or not all(isinstance(t, tuple) and set(map(type, t)) <= _INT_TYPES for t in lookahead)
    ):
        raise EventDecodeError("lookahead_token_ids must be an array of int arrays")
    return BlockStored(
        raw,
        parent,
        tokens,
        block_size,
        _opt_int(f.get("lora_id"), "lora_id"),
        _opt_str(f.get("medium"), "medium"),
        _opt_str(f.get("lora_name"), "lora_name"),
        extra,
        _opt_int(f.get("group_idx"), "group_idx"),
        _opt_str(f.get("kv_cache_spec_kind"), "kv_cache_spec_kind"),
        _opt_int(f.get("kv_cache_spec_sliding_window"), "kv_cache_spec_sliding_window"),
        _opt_str(f.get("locality"), "locality"),
        _opt_str(f.get("ownership"), "ownership"),
        _opt_str(f.get("session_id"), "session_id"),
        lookahead,
        wire,
        wire_parent,
    )


def _removed(f: Mapping[str, Any]) -> BlockRemoved:
    raw, wire = _hashes(f.get("block_hashes"))
    return BlockRemoved(
        raw,
        _opt_str(f.get("medium"), "medium"),
        _opt_int(f.get("group_idx"), "group_idx"),
        _opt_str(f.get("locality"), "locality"),
        _opt_str(f.get("ownership"), "ownership"),
        wire,
    )


def _cleared(f: Mapping[str, Any]) -> AllBlocksCleared:
    return AllBlocksCleared()


_BUILDERS: Final[dict[str, Callable[[Mapping[str, Any]], KVEvent]]] = {
    "BlockStored": _stored,
    "BlockRemoved": _removed,
    "AllBlocksCleared": _cleared,
}
_POSITIONAL: Final[dict[str, tuple[str, ...]]] = {
    "BlockStored": _STORED_FIELDS,
    "BlockRemoved": _REMOVED_FIELDS,
    "AllBlocksCleared": (),
}


def _hashes(value: object) -> tuple[tuple[RawHash, ...], tuple[int, ...]]:
    if not isinstance(value, tuple):
        raise EventDecodeError(f"block_hashes must be an array, got {type(value).__name__}")
    if set(map(type, value)) <= _INT_TYPES:
        # The default int form is already the wire form; msgpack cannot exceed 2**64 - 1.
        if value and min(value) < 0:
            raise EventDecodeError("block hash must be an unsigned 64-bit int")
        return value, value
    return value, tuple(_wire(h) for h in value)


def _wire(h: object) -> int:
    if type(h) is int:
        if not 0 <= h <= _U64_MAX:
            raise EventDecodeError("block hash must be an unsigned 64-bit int")
        return h
    if type(h) is bytes:
        if len(h) < 8:
            raise EventDecodeError(f"raw block hash too short ({len(h)} bytes)")
        return int.from_bytes(h[-8:], "big")
    raise EventDecodeError(f"block hash must be int or bytes, got {type(h).__name__}")


def _opt_int(value: object, name: str) -> int | None:
    if value is None or type(value) is int:
        return value
    raise EventDecodeError(f"{name} must be an int or nil, got {type(value).__name__}")


def _opt_str(value: object, name: str) -> str | None:
    if value is None or type(value) is str:
        return value
    raise EventDecodeError(f"{name} must be a string or nil, got {type(value).__name__}")


# -- the fast decoder: typed structs for what today's engines send ----------------------------------

_WireHash: TypeAlias = Annotated[int, msgspec.Meta(ge=0)] | Annotated[bytes, msgspec.Meta(min_length=8)]


class _FastStored(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    block_hashes: tuple[_WireHash, ...]
    block_size: Annotated[int, msgspec.Meta(gt=0)]
    parent_block_hash: _WireHash | None = None
    token_ids: tuple[int, ...] = ()
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: msgspec.Raw = msgspec.Raw()  # untagged tuples of anything: read by msgpack, as the general path does
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None


class _FastRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type", gc=False):
    block_hashes: tuple[_WireHash, ...]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class _FastCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", gc=False):
    pass


class _FastBatch(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    ts: float
    events: list[_FastStored | _FastRemoved | _FastCleared]
    data_parallel_rank: int | None = None


_FAST: Final = msgspec.msgpack.Decoder(_FastBatch)
_NILS: Final[dict[bytes, tuple[None, ...]]] = {msgpack.packb([None] * n): (None,) * n for n in range(1, 65)}


def _fast_wire(raw: tuple[int | bytes, ...]) -> tuple[int, ...]:
    return raw if set(map(type, raw)) <= _INT_TYPES else tuple(map(_wire, raw))  # type: ignore[return-value]


def _fast_stored(w: _FastStored) -> BlockStored:
    extra = None
    if len(w.extra_keys):
        raw_extra = bytes(w.extra_keys)
        extra = _NILS.get(raw_extra)  # the usual value: one nil per block
        if extra is None:
            extra = msgpack.unpackb(raw_extra, raw=False, use_list=False, strict_map_key=True)
        if extra is not None and (
            not isinstance(extra, tuple) or not all(k is None or isinstance(k, tuple) for k in extra)
        ):
            raise ValueError("extra_keys")  # the general decoder names the error
    parent = w.parent_block_hash
    return BlockStored(
        w.block_hashes, parent, w.token_ids, w.block_size, w.lora_id, w.medium, w.lora_name, extra,
        w.group_idx, w.kv_cache_spec_kind, w.kv_cache_spec_sliding_window, w.locality, w.ownership,
        w.session_id, w.lookahead_token_ids, _fast_wire(w.block_hashes), None if parent is None else _wire(parent),
    )


def _fast_removed(w: _FastRemoved) -> BlockRemoved:
    return BlockRemoved(
        w.block_hashes, w.medium, w.group_idx, w.locality, w.ownership, _fast_wire(w.block_hashes)
    )


def _fast_cleared(w: _FastCleared) -> AllBlocksCleared:
    return AllBlocksCleared()


_FAST_EVENT: Final[dict[type, Callable[[Any], KVEvent]]] = {
    _FastStored: _fast_stored,
    _FastRemoved: _fast_removed,
    _FastCleared: _fast_cleared,
}
