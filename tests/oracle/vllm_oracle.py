"""Differential-test oracle: answers hashing and KV-event questions with vLLM's own code.

Run under the engine venv (``.venv-engine/bin/python tests/oracle/vllm_oracle.py``); it reads
one JSON spec on stdin and writes one JSON answer on stdout, so a test module pays the vLLM
import (seconds) once for many cases. Nothing here re-implements vLLM: every hash, wire value
and event payload comes from vLLM functions (``get_hash_fn_by_name``, ``init_none_hash``,
``get_request_block_hasher``, ``resolve_block_hashes``, ``BlockPool``, the ``kv_events``
structs) and the msgspec encoder the ZMQ publisher uses.

Spec::

    {"hash_cases": [{"id", "algo", "seed": null | "42", "block_size", "hash_block_size"?,
                     "token_ids", "lora": [name, path] | null, "mm": [[identifier, offset,
                     length], ...], "cache_salt": str | null, "int_hashes"?: bool,
                     "events"?: {"evict": int, "reset": bool, "dp_rank": int | null}}],
     "encode_cases": [{"id", "ts", "dp_rank", "positional"?: bool, "events": [{"type", ...}]}]}

Bytes travel as ``{"hex": "..."}``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import msgspec


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"hex"}:
        return bytes.fromhex(value["hex"])
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _to_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    return value


def hash_case(case: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.distributed.kv_events import KVEventBatch
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.request import Request

    _set_env("PYTHONHASHSEED", case.get("seed"))
    _set_env("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1" if case.get("int_hashes", True) else "0")
    hash_fn = get_hash_fn_by_name(case["algo"])
    kv_cache_utils.init_none_hash(hash_fn)
    block_size = case["block_size"]
    hash_block_size = case.get("hash_block_size") or block_size
    lora = case.get("lora")
    mm = [
        MultiModalFeatureSpec(
            data=None,
            modality="image",
            identifier=ident,
            mm_position=PlaceholderRange(offset=offset, length=length),
        )
        for ident, offset, length in case.get("mm") or []
    ]
    request = Request(
        request_id=str(case["id"]),
        prompt_token_ids=list(case["token_ids"]),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        mm_features=mm or None,
        lora_request=LoRARequest(lora[0], 1, lora[1]) if lora else None,
        cache_salt=case.get("cache_salt"),
        block_hasher=kv_cache_utils.get_request_block_hasher(hash_block_size, hash_fn),
    )
    view = kv_cache_utils.resolve_block_hashes(request.block_hashes, hash_block_size, block_size)
    hashes = [view[i] for i in range(len(view))]
    out: dict[str, Any] = {
        "id": case["id"],
        "none_hash_hex": kv_cache_utils.NONE_HASH.hex(),
        "block_hashes_hex": [h.hex() for h in hashes],
        "wire": [_to_json(kv_cache_utils.maybe_convert_block_hash(h)) for h in hashes],
        "extra_keys": [],
    }
    ev = case.get("events")
    if ev is not None and hashes:
        # The block pool emits the events the engine publishes for this request.
        n = len(hashes)
        pool = BlockPool(n + 2, True, hash_block_size, enable_kv_cache_events=True)
        blocks = pool.get_new_blocks(n)
        pool.cache_full_blocks(request, blocks, 0, n, block_size, 0)
        # Freed in reverse so the last block is evicted first, as the engine frees them.
        pool.free_blocks(reversed(blocks))
        if ev.get("evict"):
            taken = pool.get_new_blocks(min(n, ev["evict"]) + 1)  # +1: the spare free block first
            pool.free_blocks(taken)
        if ev.get("reset") and not pool.reset_prefix_cache():
            raise RuntimeError("reset_prefix_cache refused")
        batch = KVEventBatch(ts=1.5, events=pool.take_events(), data_parallel_rank=ev.get("dp_rank"))
        out["payload_hex"] = msgspec.msgpack.Encoder().encode(batch).hex()
    return out


def _positional_structs() -> dict[str, type]:
    """The event structs as older vLLM declared them (``array_like=True, tag=True``)."""

    class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):  # type: ignore[call-arg]
        pass

    class BlockStored(OldEvent):
        block_hashes: list[Any]
        parent_block_hash: Any
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None = None
        lora_name: str | None = None

    class BlockRemoved(OldEvent):
        block_hashes: list[Any]
        medium: str | None = None

    class AllBlocksCleared(OldEvent):
        pass

    return {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


def encode_case(case: dict[str, Any]) -> dict[str, Any]:
    from vllm.distributed import kv_events

    structs: dict[str, type]
    if case.get("positional"):
        structs = _positional_structs()
    else:
        structs = {
            "BlockStored": kv_events.BlockStored,
            "BlockRemoved": kv_events.BlockRemoved,
            "AllBlocksCleared": kv_events.AllBlocksCleared,
        }
    events = []
    for spec in case["events"]:
        fields = {k: _from_json(v) for k, v in spec.items() if k != "type"}
        if "extra_keys" in fields and fields["extra_keys"] is not None:
            fields["extra_keys"] = [None if k is None else tuple(k) for k in fields["extra_keys"]]
        events.append(structs[spec["type"]](**fields))
    batch = kv_events.KVEventBatch(ts=case["ts"], events=events, data_parallel_rank=case.get("dp_rank"))
    return {"id": case["id"], "payload_hex": msgspec.msgpack.Encoder().encode(batch).hex()}


def main() -> None:
    spec = json.load(sys.stdin)
    import vllm

    answer = {
        "vllm_version": vllm.__version__,
        "hash_results": [hash_case(c) for c in spec.get("hash_cases", [])],
        "encode_results": [encode_case(c) for c in spec.get("encode_cases", [])],
    }
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
