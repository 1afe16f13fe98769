"""Unit tests of litellm_kv.vllm.hashing: the shared vLLM 0.33.0 vectors, the serialised bytes,
the maximum-hit rule, the wire form and the prefix memo. (Differential tests against the
installed vLLM are in test_hashing_vs_vllm.py.)"""

from __future__ import annotations

import gc
import hashlib
import json
import pickle
import random
from array import array
from pathlib import Path
from typing import Any

import pytest

from litellm_kv.vllm.hashing import (
    DEFAULT_NONE_HASH_SEED,
    HASH_ALGOS,
    NATIVE_HASHING,
    BlockHasher,
    InexactHashError,
    MMFeature,
    hash_object,
    max_hit_blocks,
    predicted_hit_tokens,
    resolve_none_hash_seed,
    serialiser,
    wire_from_event_hash,
)

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
NONE_HASH_ENTRIES = json.loads((VECTORS / "none_hash.json").read_text())["entries"]
TOKEN_CASES = json.loads((VECTORS / "token_block_hashes.json").read_text())["cases"]


@pytest.mark.parametrize("entry", NONE_HASH_ENTRIES, ids=lambda e: f"{e['algo']}-{e['PYTHONHASHSEED']}")
def test_none_hash_vectors(entry: dict[str, Any]) -> None:
    h = BlockHasher(entry["algo"], 16, entry["PYTHONHASHSEED"])
    if "none_hash_hex" not in entry:
        assert not h.exact_possible
        assert resolve_none_hash_seed(entry["algo"], None) is None
        return
    assert h.exact_possible
    seed = resolve_none_hash_seed(entry["algo"], entry["PYTHONHASHSEED"])
    assert seed == entry["resolved_seed_str"]
    assert serialiser(entry["algo"])(seed).hex() == entry["serialized_seed_hex"]
    assert h.none_hash.hex() == entry["none_hash_hex"]
    assert len(h.none_hash) == entry["none_hash_len"]


@pytest.mark.parametrize("case", TOKEN_CASES, ids=lambda c: f"{c['algo']}-{c['seq']}")
def test_token_block_hash_vectors(case: dict[str, Any]) -> None:
    h = BlockHasher(case["algo"], case["block_size"], case["PYTHONHASHSEED"])
    assert h.none_hash.hex() == case["none_hash_hex"]
    got = h.block_hashes(case["token_ids"])
    assert [x.hex() for x in got] == case["block_hashes_hex"]
    assert [str(BlockHasher.to_wire(x)) for x in got] == case["wire_u64"]
    assert h.wire_hashes(case["token_ids"]) == [int(x) for x in case["wire_u64"]]
    if "block0_serialized_hex" in case:
        # stdlib pickle (protocol 5) and cbor2 canonical give the engine's exact bytes.
        dumps = serialiser(case["algo"])
        toks = case["token_ids"]
        assert dumps((h.none_hash, tuple(toks[:16]), None)).hex() == case["block0_serialized_hex"]
        if case["algo"] == "sha256":  # block 1's bytes carry block 0's hash as parent
            assert dumps((got[0], tuple(toks[16:32]), None)).hex() == case["block1_serialized_hex"]
    for row in case["prefix_table"]:
        n = row["len"]
        assert len(h.block_hashes(case["token_ids"][:n])) == row["num_full_blocks"]
        assert (
            predicted_hit_tokens(row["num_full_blocks"], n, case["block_size"]) == row["max_hit_tokens_if_all_cached"]
        )


def test_max_hit_rule() -> None:
    assert [max_hit_blocks(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 0, 0, 1, 1, 2]
    assert max_hit_blocks(142, 32) == 4  # 128 cached tokens, measured on a real engine
    assert predicted_hit_tokens(10, 142, 32) == 128
    assert predicted_hit_tokens(2, 142, 32) == 64


def test_pickle_layout_of_extra_keys() -> None:
    """The contract's byte layout (§1): ints by width, negative offsets as BININT, and the
    repeated "mm" tag memoised (BINGET) while equal identifiers are written twice."""
    key = (b"\x00" * 32, (1, 300, 70000, 2**40), (("mm", "id", -11), ("mm", "id2", 3)))
    body = serialiser("sha256")(key)
    assert body[:2] == b"\x80\x05" and body[2] == 0x95 and body.endswith(b".")
    assert b"K\x01" in body and b"M\x2c\x01" in body and b"J\x70\x11\x01\x00" in body
    assert b"J\xf5\xff\xff\xff" in body  # -11
    assert body.count(b"\x8c\x02mm") == 1 and b"h" in body


def test_to_wire_and_event_hash_forms() -> None:
    digest32 = bytes(range(32))
    digest16 = bytes(range(16))
    assert BlockHasher.to_wire(digest32) == int.from_bytes(digest32, "big") & (2**64 - 1)
    assert BlockHasher.to_wire(digest16) == int.from_bytes(digest16[8:], "big")
    assert wire_from_event_hash(digest32) == BlockHasher.to_wire(digest32)
    assert wire_from_event_hash(bytearray(digest16)) == BlockHasher.to_wire(digest16)
    assert wire_from_event_hash(2**64 - 1) == 2**64 - 1
    with pytest.raises(TypeError):
        wire_from_event_hash(True)
    with pytest.raises(TypeError):
        wire_from_event_hash("ab")  # type: ignore[arg-type]


def test_inexact_configuration_is_reported() -> None:
    for algo in ("xxhash", "xxhash_cbor"):
        h = BlockHasher(algo, 16, None)
        assert not h.exact_possible
        with pytest.raises(InexactHashError, match="PYTHONHASHSEED"):
            h.block_hashes(list(range(32)))
        assert BlockHasher(algo, 16, "0").exact_possible
    assert BlockHasher("sha256", 16, None).exact_possible
    assert resolve_none_hash_seed("sha256_cbor", None) == DEFAULT_NONE_HASH_SEED
    assert BlockHasher("sha256", 16, 42).none_hash == BlockHasher("sha256", 16, "42").none_hash


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="builtin"):
        BlockHasher("builtin", 16)
    with pytest.raises(ValueError):
        BlockHasher("sha256", 0)
    with pytest.raises(ValueError):
        BlockHasher("sha256", 64, hash_block_size=24)


def test_extra_keys_change_exactly_the_blocks_vllm_says() -> None:
    toks = list(range(1000, 1100))
    h = BlockHasher("sha256", 16)
    plain = h.block_hashes(toks)
    salted = h.block_hashes(toks, cache_salt="t")
    assert all(a != b for a, b in zip(plain, salted, strict=True))  # block 0 differs, the rest chain
    image = h.block_hashes(toks, mm=[MMFeature("img", 40, 10)])
    assert image[:2] == plain[:2] and image[2] != plain[2]
    lora = h.block_hashes(toks, lora=("a", "/p1"))
    assert lora[0] != plain[0] and lora != h.block_hashes(toks, lora=("a", "/p2"))
    # Items may be given in any order; vLLM sees them sorted by offset.
    two = [MMFeature("b", 50, 5), MMFeature("a", 3, 20)]
    assert h.block_hashes(toks, mm=two) == h.block_hashes(toks, mm=sorted(two, key=lambda f: f.offset))


def test_hash_block_size_picks_last_fine_hash() -> None:
    toks = list(range(256))
    fine = BlockHasher("sha256", 16).block_hashes(toks)
    coarse = BlockHasher("sha256", 64, hash_block_size=16).block_hashes(toks)
    assert coarse == fine[3::4]
    assert hash_object("sha256", (BlockHasher("sha256", 16).none_hash, tuple(toks[:16]), None)) == fine[0]


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_memo_gives_identical_results_and_stays_bounded(algo: str) -> None:
    rng = random.Random(1)
    conversations = [[rng.randrange(50000) for _ in range(400)] for _ in range(6)]
    ref = BlockHasher(algo, 16, "0", memo_tokens=0)
    h = BlockHasher(algo, 16, "0", memo_tokens=64 * 16)
    for _ in range(3):
        for conv in conversations:
            for turn in range(40, 401, 90):  # a growing conversation
                assert h.block_hashes(conv[:turn]) == ref.block_hashes(conv[:turn])
            assert h.memo_size() <= 64
    assert ref.memo_size() == 0
    h.clear_memo()
    assert h.memo_size() == 0


def test_dropped_memo_generation_is_freed_a_slice_per_call() -> None:
    """A dropped generation is not freed at once (a multi-millisecond pause at the proxy's default size)
    but a slice per call, at least as fast as new entries come, so memory stays bounded."""
    rng = random.Random(2)
    h = BlockHasher("sha256", 16, "0", memo_tokens=2 * 512 * 16)  # generations of 512 blocks
    retired_peak = 0
    for _ in range(200):
        h.block_hashes([rng.randrange(50000) for _ in range(16 * 20)])  # 20 new blocks a call
        retired_peak = max(retired_peak, sum(len(g) for g in h._retiring))
        assert len(h._retiring) <= 1  # freed before the next generation is dropped
    assert 0 < retired_peak <= 512
    for _ in range(10):  # (20 + 64) entries freed per call
        h.block_hashes([rng.randrange(50000) for _ in range(16 * 20)])
    assert h.memo_size() <= 1024


def test_memo_hits_skip_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    h = BlockHasher("sha256", 16, native=False)
    toks = list(range(4000))
    h.block_hashes(toks[:2000])
    calls = 0
    digest = h._digest

    def counting(data: bytes) -> bytes:
        nonlocal calls
        calls += 1
        return digest(data)

    h._digest = counting
    h.block_hashes(toks)
    assert calls == 4000 // 16 - 2000 // 16  # only the new blocks were hashed


def test_shared_prefix_fanout() -> None:
    h = BlockHasher("sha256", 16)
    ref = BlockHasher("sha256", 16, memo_tokens=0)
    system = list(range(64))
    for user in range(20):  # 20 continuations of one parent block
        toks = system + [100000 + user] * 32
        assert h.block_hashes(toks) == ref.block_hashes(toks)
    for user in range(20):
        toks = system + [100000 + user] * 32
        assert h.block_hashes(toks) == ref.block_hashes(toks)


def test_memo_keeps_lora_salt_and_mm_apart() -> None:
    """The memo's key holds the LoRA key and a block's mm items; the salted block is never memoised: the
    same tokens under another adapter, salt, image or image offset must not get another variant's hash."""
    rng = random.Random(3)
    toks = [rng.randrange(150000) for _ in range(16 * 12)]
    h = BlockHasher("sha256", 16)
    ref = BlockHasher("sha256", 16, memo_tokens=0)
    image = [MMFeature("img-a", 20, 40)]
    variants: list[dict[str, Any]] = [
        {},
        {"lora": ("a", "/adapters/a")},
        {"lora": ("b", "/adapters/a")},
        {"lora": ("a", "/adapters/b")},
        {"cache_salt": "tenant-1"},
        {"cache_salt": "tenant-1", "lora": ("a", "/adapters/a")},
        {"mm": image},
        {"mm": image, "cache_salt": "tenant-2"},
        {"mm": [MMFeature("img-b", 20, 40)]},
        {"mm": [MMFeature("img-a", 21, 40)]},
        {"mm": [MMFeature("img-a", 20, 40), MMFeature("img-a", 60, 30)]},
        {"mm": [MMFeature("img-a", 20, 40)], "lora": ("a", "/adapters/a")},
    ]
    for _ in range(2):  # the second round is served by the memo where it may be
        chains = []
        for kw in variants:
            got = h.block_hashes(toks, **kw)
            assert got == ref.block_hashes(toks, **kw)
            chains.append(got)
        assert len({c[-1] for c in chains}) == len(variants)


def test_memo_adds_nothing_for_the_garbage_collector() -> None:
    """The memo's keys and values are bytes, which the collector does not track: hashing never leaves
    tracked objects behind (a memo of tuples left ~3 per block, young until a collection met them, and
    those collections were the decision's 5-7 ms p99)."""
    rng = random.Random(4)
    h = BlockHasher("sha256", 16)
    h.block_hashes([rng.randrange(150000) for _ in range(16 * 8)])
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(20):
        h.block_hashes([rng.randrange(150000) for _ in range(16 * 64)])
    assert h.memo_size() == 20 * 64 + 8
    assert len(gc.get_objects()) - before < 50
    assert not gc.is_tracked(h._memo_new)


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_wire_hashes_are_the_digests_last_8_bytes_big_endian(algo: str) -> None:
    rng = random.Random(5)
    h = BlockHasher(algo, 16, "0")
    toks = [rng.randrange(150000) for _ in range(16 * 40 + 7)]
    want = [int.from_bytes(d[-8:], "big") for d in h.block_hashes(toks)]
    assert h.wire_hashes(toks) == want and len(want) == 40
    assert h.wire_hashes(toks[:15]) == []


def test_native_chain_is_built_here() -> None:
    """scripts/setup.sh builds litellm_kv/vllm/_chain.c (it installs gcc and OpenSSL's headers if missing);
    a failed build would silently cost ~0.6 ms per cold 8K-token decision, so the suite says so."""
    assert NATIVE_HASHING


@pytest.mark.parametrize("step", [1, 2, 3, 4, 5, 16, 32, 64])
def test_native_chain_equals_pickle_and_hashlib(step: int) -> None:
    """Every pickle integer width (BININT1/BININT2/BININT edges) and the 1-3 token TUPLEn forms."""
    from litellm_kv.vllm._chain import sha256_pickle_chain

    rng = random.Random(step)
    edges = [0, 1, 255, 256, 65535, 65536, 2**31 - 1]
    toks = [rng.choice(edges) if rng.random() < 0.5 else rng.randrange(2**31) for _ in range(step * 9 + step // 2)]
    parent = hashlib.sha256(b"parent").digest()
    want, p = [], parent
    for i in range(0, len(toks) // step * step, step):
        p = hashlib.sha256(pickle.dumps((p, tuple(toks[i : i + step]), None), protocol=5)).digest()
        want.append(p)
    assert sha256_pickle_chain(parent, array("I", toks).tobytes(), step) == want


def test_native_chain_refuses_what_it_cannot_encode() -> None:
    from litellm_kv.vllm._chain import sha256_pickle_chain

    parent = bytes(32)
    assert sha256_pickle_chain(parent, array("I", [2**31] * 16).tobytes(), 16) is None  # pickle: LONG1
    for bad in ((bytes(31), b"", 16), (parent, b"abc", 16), (parent, b"", 0), (parent, b"", 5000)):
        with pytest.raises(ValueError):
            sha256_pickle_chain(*bad)
    # Through BlockHasher such tokens fall back to Python from the first block that has one.
    toks = list(range(64)) + [2**31 + 5] * 16 + list(range(32))
    assert BlockHasher("sha256", 16).block_hashes(toks) == BlockHasher("sha256", 16, native=False).block_hashes(toks)


def test_native_and_python_paths_agree_with_memo_salt_lora_and_mm() -> None:
    rng = random.Random(9)
    image = [MMFeature("img", 40, 50)]
    native = BlockHasher("sha256", 16)
    python = BlockHasher("sha256", 16, native=False, memo_tokens=0)
    base = [rng.randrange(150000) for _ in range(16 * 30)]
    for turn in range(6):  # a growing conversation: memo hits, then native misses
        toks = base + [rng.randrange(150000) for _ in range(16 * turn + 5)]
        for kw in ({}, {"cache_salt": "t"}, {"mm": image}, {"lora": ("a", "/p")}):
            assert native.block_hashes(toks, **kw) == python.block_hashes(toks, **kw)  # type: ignore[arg-type]
        base = toks


def test_image_blocks_are_memoised_and_salted_block_is_not() -> None:
    """A resent image conversation rehashes none of its image blocks: every block an item overlaps is
    held by the memo (and served from it, equal to the unmemoised chain); the salted block 0 is not."""
    rng = random.Random(11)
    toks = [rng.randrange(150000) for _ in range(16 * 10)]
    image = [MMFeature("img", 5, 100), MMFeature("img", 120, 20)]
    h = BlockHasher("sha256", 16)
    ref = BlockHasher("sha256", 16, memo_tokens=0)
    first = h.block_hashes(toks, mm=image)
    assert h.memo_size() == 10
    assert h.block_hashes(toks, mm=image) == first == ref.block_hashes(toks, mm=image)
    assert h.memo_size() == 10
    h.clear_memo()
    assert h.block_hashes(toks, mm=image, cache_salt="s") == ref.block_hashes(toks, mm=image, cache_salt="s")
    assert h.memo_size() == 9
