"""KV-event decoding: the shared 0.33.0 vectors, payloads encoded by vLLM 0.32.0's own structs
and msgspec (map and old positional encodings), and a fuzz test of the error contract. The typed (fast)
decoder must take what today's engines send and agree with the general one wherever that one decodes."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from litellm_kv.index.base import BlockOp, Tier
from litellm_kv.vllm.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    MalformedEvent,
    UnknownEvent,
    decode_event_batch,
    decode_event_batch_general,
    decode_event_batch_typed,
    to_block_ops,
)
from litellm_kv.vllm.hashing import BlockHasher
from tests.oracle.runner import run_vllm_oracle

VECTOR_DIR = Path(__file__).resolve().parents[1] / "vectors"
VECTORS = json.loads((VECTOR_DIR / "kv_events_msgpack.json").read_text())
VECTOR_PAYLOADS = {e["name"]: bytes.fromhex(e["payload_hex"]) for e in VECTORS["events"]}


def _vector_batch(name: str) -> bytes:
    return VECTOR_PAYLOADS[name]


# -- shared vectors (vLLM 0.33.0) ---------------------------------------------------------


def test_vector_batch_all_event_kinds() -> None:
    batch = decode_event_batch(_vector_batch("KVEventBatch_dp0_all"))
    assert batch.ts == 1767225600.125 and batch.data_parallel_rank == 0
    first, second, lora, removed, cleared = batch.events
    assert isinstance(first, BlockStored)
    assert first.block_hashes == (3262291359910021016, 7142137847444424233)
    assert first.parent_block_hash is None and first.block_size == 16
    assert first.token_ids == tuple(range(32))
    assert first.extra_keys == (None, None)
    assert first.group_idx == 0 and first.kv_cache_spec_kind == "full_attention" and first.medium == "GPU"
    assert isinstance(second, BlockStored) and second.parent_block_hash == 7142137847444424233
    assert second.wire_parent_block_hash == 7142137847444424233
    assert isinstance(lora, BlockStored) and lora.lora_name == "sql-lora" and lora.lora_id == 1
    ident = "2f1c9a7e0b3d4c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6"
    assert lora.extra_keys == (("sql-lora", (ident, 5), "tenant-A-salt"), ("sql-lora", (ident, -11)))
    assert isinstance(removed, BlockRemoved)
    assert removed.block_hashes == (6313051659716227200, 7874022828126205079)
    assert isinstance(cleared, AllBlocksCleared)


def test_vector_hashes_match_our_block_hasher() -> None:
    cases = json.loads((VECTOR_DIR / "token_block_hashes.json").read_text())["cases"]
    case = next(c for c in cases if c["algo"] == "sha256" and c["seq"] == "range0_99")
    ours = BlockHasher("sha256", 16).wire_hashes(case["token_ids"])
    batch = decode_event_batch(_vector_batch("KVEventBatch_dp0_all"))
    stored = [e for e in batch.events if isinstance(e, BlockStored) and e.lora_name is None]
    assert [h for e in stored for h in e.wire_block_hashes] == ours


def test_vector_dp_rank_none_and_raw_bytes_hashes() -> None:
    assert decode_event_batch(_vector_batch("KVEventBatch_dp_None")).data_parallel_rank is None
    batch = decode_event_batch(_vector_batch("KVEventBatch_dp1_raw_bytes_hashes"))
    assert batch.data_parallel_rank == 1
    (stored,) = batch.events
    assert isinstance(stored, BlockStored)
    raw = bytes.fromhex("fe8fa5dda3210d0ca2031e37cbe3b001186773cd1c710beb2d45fcb51d434798")
    assert stored.block_hashes == (raw,)
    assert stored.wire_block_hashes == (3262291359910021016,)
    assert to_block_ops(stored) == [BlockOp((3262291359910021016,), Tier.GPU, 1)]


@pytest.mark.parametrize("name", ["KVEventBatch_dp0_all", "KVEventBatch_dp_None", "KVEventBatch_dp1_raw_bytes_hashes"])
def test_typed_decoder_takes_the_vector_batches_and_agrees(name: str) -> None:
    payload = _vector_batch(name)
    typed = decode_event_batch_typed(payload)
    assert typed is not None and typed == decode_event_batch_general(payload)


def test_single_event_payload_is_not_a_batch() -> None:
    with pytest.raises(EventDecodeError):
        decode_event_batch(_vector_batch("BlockStored_first2_plain"))


# -- to_block_ops -------------------------------------------------------------------------


def test_to_block_ops_tiers_and_signs() -> None:
    stored = BlockStored((1, 2), None, (), 16, medium="CPU", wire_block_hashes=(1, 2))
    removed = BlockRemoved((2,), medium=None, wire_block_hashes=(2,))
    assert to_block_ops(stored) == [BlockOp((1, 2), Tier.CPU, 1)]
    assert to_block_ops(removed) == [BlockOp((2,), Tier.GPU, -1)]
    assert to_block_ops(AllBlocksCleared()) == []
    assert to_block_ops(UnknownEvent("BlockPromoted")) == []
    stored.group_idx = 1
    assert to_block_ops(stored, group_idx=0) == []
    assert to_block_ops(stored, group_idx=1) == [BlockOp((1, 2), Tier.CPU, 1)]


# -- payloads encoded by vLLM's own structs -------------------------------------------------


def _rand_hash(rng: random.Random) -> Any:
    kind = rng.randrange(6)
    if kind == 0:
        return {"hex": rng.randbytes(32).hex()}
    if kind == 1:
        return {"hex": rng.randbytes(16).hex()}
    # Every msgpack int width: fixint, uint8, uint16, uint32, uint64.
    return rng.choice(
        (rng.randrange(128), rng.randrange(256), rng.randrange(65536), rng.getrandbits(32), rng.getrandbits(64))
    )


def _random_events(rng: random.Random, positional: bool) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for _ in range(rng.randrange(1, 6)):
        kind = rng.choice(("BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"))
        if kind == "AllBlocksCleared":
            events.append({"type": kind})
            continue
        n = rng.randrange(1, 5)
        hashes = [_rand_hash(rng) for _ in range(n)]
        medium = rng.choice(("GPU", "CPU", "STORAGE", None))
        if kind == "BlockRemoved":
            ev: dict[str, Any] = {"type": kind, "block_hashes": hashes, "medium": medium}
            if not positional:
                ev |= {
                    "group_idx": rng.choice((None, 0, 1)),
                    "locality": rng.choice((None, "LOCAL")),
                    "ownership": None,
                }
            events.append(ev)
            continue
        bs = rng.choice((16, 32, 128))
        lora = rng.choice((None, "sql-lora"))
        ev = {
            "type": kind,
            "block_hashes": hashes,
            "parent_block_hash": rng.choice((None, _rand_hash(rng))),
            "token_ids": [rng.randrange(200000) for _ in range(n * bs)],
            "block_size": bs,
            "lora_id": 1 if lora else None,
            "medium": medium,
            "lora_name": lora,
        }
        if not positional:
            ev |= {
                "extra_keys": rng.choice(
                    (None, [None] * n, [[lora or "x", ["f" * 64, rng.randrange(-40, 16)], "salt"]] * n)
                ),
                "group_idx": rng.choice((None, 0, 2)),
                "kv_cache_spec_kind": rng.choice((None, "full_attention", "sliding_window")),
                "kv_cache_spec_sliding_window": rng.choice((None, 4096)),
                "locality": rng.choice((None, "REMOTE")),
                "ownership": rng.choice((None, "lmcache")),
                "session_id": rng.choice((None, "sess-1")),
            }
        events.append(ev)
    return events


def _encode_cases() -> list[dict[str, Any]]:
    rng = random.Random(7)
    cases = []
    for i in range(60):
        positional = i % 3 == 0
        cases.append(
            {
                "id": i,
                "ts": rng.random() * 2e9,
                "dp_rank": rng.choice((None, 0, 3)),
                "positional": positional,
                "events": _random_events(rng, positional),
            }
        )
    return cases


ENCODE_CASES = _encode_cases()


@pytest.fixture(scope="module")
def encoded() -> dict[int, bytes]:
    answer = run_vllm_oracle({"encode_cases": ENCODE_CASES})
    return {r["id"]: bytes.fromhex(r["payload_hex"]) for r in answer["encode_results"]}


def _plain(value: Any) -> Any:
    """Spec value as the decoder returns it (bytes from hex, arrays as tuples)."""
    if isinstance(value, dict) and set(value) == {"hex"}:
        return bytes.fromhex(value["hex"])
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    return value


def _wire(value: Any) -> int:
    return BlockHasher.to_wire(value) if isinstance(value, bytes) else value


@pytest.mark.parametrize("case", ENCODE_CASES, ids=lambda c: f"{c['id']}-{'positional' if c['positional'] else 'map'}")
def test_decode_vllm_encoded_batches(case: dict[str, Any], encoded: dict[int, bytes]) -> None:
    batch = decode_event_batch(encoded[case["id"]])
    assert batch.ts == case["ts"]
    assert batch.data_parallel_rank == case["dp_rank"]
    assert len(batch.events) == len(case["events"])
    for spec, event in zip(case["events"], batch.events, strict=True):
        assert type(event).__name__ == spec["type"]
        for name, value in spec.items():
            if name != "type":
                assert getattr(event, name) == _plain(value), name
        if isinstance(event, BlockStored | BlockRemoved):
            assert event.wire_block_hashes == tuple(_wire(_plain(h)) for h in spec["block_hashes"])
            ops = to_block_ops(event)
            assert ops[0].hashes == event.wire_block_hashes
            assert ops[0].delta == (1 if isinstance(event, BlockStored) else -1)
        if isinstance(event, BlockStored) and event.parent_block_hash is not None:
            assert event.wire_parent_block_hash == _wire(event.parent_block_hash)
    # Today's map encoding is read by the typed structs (the fast path), to the same events.
    typed = decode_event_batch_typed(encoded[case["id"]])
    assert (typed is None) == case["positional"]
    assert typed is None or typed == decode_event_batch_general(encoded[case["id"]]) == batch


# -- forward compatibility ------------------------------------------------------------------


def test_unknown_keys_and_event_types_are_tolerated() -> None:
    stored = {
        "type": "BlockStored",
        "block_hashes": [5],
        "parent_block_hash": None,
        "token_ids": [1, 2],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "some_future_field": {"nested": [1, 2]},
        "lookahead_token_ids": [[7]],
    }
    payload = msgpack.packb([1.0, [stored, {"type": "BlockPromoted", "x": 1}, ["AllBlocksCleared"]], 2])
    batch = decode_event_batch(payload)
    s, unknown, cleared = batch.events
    assert isinstance(s, BlockStored) and s.wire_block_hashes == (5,) and s.lookahead_token_ids == ((7,),)
    assert isinstance(unknown, UnknownEvent) and unknown.type == "BlockPromoted"
    assert isinstance(cleared, AllBlocksCleared)
    # A batch without the rank (oldest engines) and an integer timestamp.
    assert decode_event_batch(msgpack.packb([3, []])).data_parallel_rank is None


@pytest.mark.parametrize(
    "obj",
    [
        [1.0, [{"type": "BlockStored", "block_hashes": [-1], "token_ids": [], "block_size": 16}], 0],
        [1.0, [{"type": "BlockStored", "block_hashes": [b"short"], "token_ids": [], "block_size": 16}], 0],
        [1.0, [{"type": "BlockStored", "block_hashes": [True], "token_ids": [], "block_size": 16}], 0],
        [1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": ["a"], "block_size": 16}], 0],
        [1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": 0}], 0],
        [1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": []}], 0],
        [1.0, [{"type": "BlockRemoved", "block_hashes": 5}], 0],
        [1.0, [{"type": "BlockRemoved", "block_hashes": [5], "medium": 3}], 0],
        [1.0, [{"type": 3}], 0],
        [1.0, [7], 0],
        [1.0, [], "0"],
        ["1.0", [], 0],
        [1.0, {}, 0],
        [1.0],
        [1.0, [], 0, 0],
        "batch",
    ],
)
def test_malformed_batches_raise_event_decode_error(obj: Any) -> None:
    with pytest.raises(EventDecodeError):
        decode_event_batch(msgpack.packb(obj))


# -- one bad event does not cost the batch -------------------------------------------------------


def test_keep_valid_decodes_a_batch_mixing_valid_and_malformed_events() -> None:
    good = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [],
            "block_size": 16}
    payload = msgpack.packb([3.5, [
        good,
        {"type": "BlockStored", "block_hashes": "nope", "block_size": 16},
        {"type": "BlockRemoved", "block_hashes": [-1]},
        [7],
        {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"},
    ], 0])
    with pytest.raises(EventDecodeError):  # the strict form still refuses the whole batch
        decode_event_batch(payload)
    batch = decode_event_batch(payload, keep_valid=True)
    assert batch.ts == 3.5 and len(batch.events) == 5
    kept, bad_store, bad_removal, untyped, removal = batch.events
    assert isinstance(kept, BlockStored) and kept.wire_block_hashes == (1, 2)
    assert isinstance(removal, BlockRemoved) and removal.wire_block_hashes == (2,)
    # A lost store only under-predicts; anything else may have removed blocks (the consumer purges).
    assert isinstance(bad_store, MalformedEvent) and not bad_store.may_remove and "block_hashes" in bad_store.error
    assert isinstance(bad_removal, MalformedEvent) and bad_removal.may_remove
    assert isinstance(untyped, MalformedEvent) and untyped.type is None and untyped.may_remove


@pytest.mark.parametrize("payload", [b"\xc1 not msgpack", msgpack.packb(["1.0", [], 0]), msgpack.packb([1.0, {}, 0])])
def test_keep_valid_still_refuses_a_batch_whose_envelope_is_unreadable(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_event_batch(payload, keep_valid=True)


# -- fuzz: nothing but EventDecodeError escapes -------------------------------------------------

_msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.binary(max_size=40)
    | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type", "block_hashes"]),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.sampled_from(
                ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "medium", "extra_keys", "x"]
            ),
            children,
            max_size=6,
        )
    ),
    max_leaves=30,
)


def _decode_or_error(payload: bytes) -> None:
    try:
        decode_event_batch(payload)
    except EventDecodeError as exc:
        # The catch-all inside the decoder is a safety net; the explicit checks should
        # already name what is wrong.
        assert not str(exc).startswith("malformed batch:"), exc
    # Where the general decoder decodes, the typed one gives the same events or defers (repr: NaN != NaN).
    try:
        general = repr(decode_event_batch_general(payload))
    except EventDecodeError:
        general = None
    typed = decode_event_batch_typed(payload)
    if general is not None and typed is not None:
        assert repr(typed) == general
    with contextlib.suppress(EventDecodeError):  # only the envelope may fail; nothing else escapes
        decode_event_batch(payload, keep_valid=True)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(payload: bytes) -> None:
    _decode_or_error(payload)


@settings(max_examples=400, deadline=None)
@given(_msgpack_values)
def test_fuzz_structured_values(obj: Any) -> None:
    _decode_or_error(msgpack.packb(obj))
    _decode_or_error(msgpack.packb([1.0, [obj], 0]))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(VECTOR_PAYLOADS)), st.data())
def test_fuzz_mutated_vectors(name: str, data: st.DataObject) -> None:
    payload = bytearray(VECTOR_PAYLOADS[name])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(payload) - 1))
        payload[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    _decode_or_error(bytes(payload[:cut]))
    _decode_or_error(bytes(payload))
