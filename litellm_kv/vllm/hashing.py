"""vLLM prefix-cache block hashes, reproduced byte for byte (vllm-contract.md §1-4).

A block's hash is ``H(serialise((parent_hash, tuple(block_tokens), extra_keys)))`` where the
parent of block 0 is ``NONE_HASH = H(serialise(seed))``. Serialisation is stdlib pickle
(protocol 5) or canonical CBOR; ``H`` is SHA-256 (32 B) or XXH3-128 (16 B). Only full blocks
are hashed and every hash covers the whole prefix through chaining.

This module is on the request path, so :class:`BlockHasher` memoises the chain: hashing a
conversation that grew by one turn only hashes the new blocks (see ``memo_tokens``).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NewType, cast, get_args

import cbor2
import xxhash

from litellm_kv.retire import free_some

try:  # built by `pip install -e .` (setup.py) where a C compiler and OpenSSL's headers exist
    from litellm_kv.vllm._chain import sha256_pickle_chain as _NATIVE_CHAIN
except ImportError:  # pragma: no cover - depends on the build
    _NATIVE_CHAIN = None

NATIVE_HASHING: Final = _NATIVE_CHAIN is not None
"""Whether the compiled sha256 chain is in use (else every block is hashed in Python)."""

HashAlgo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
HASH_ALGOS: Final[tuple[str, ...]] = get_args(HashAlgo)

BlockHash = NewType("BlockHash", bytes)
"""A raw block digest as vLLM keeps it (32 B for sha256*, 16 B for xxhash*)."""

WireHash = NewType("WireHash", int)
"""The 64-bit form KV events carry by default: the digest's last 8 bytes, big-endian."""

# vLLM's fixed seed for cryptographic algorithms when PYTHONHASHSEED is unset.
DEFAULT_NONE_HASH_SEED: Final = "vllm-none-hash"

_WIRE_MASK: Final = (1 << 64) - 1
_Q_IS_8_BYTES: Final = array("Q").itemsize == 8  # true on every 64-bit CPython; else the slow path
_PICKLE_PROTOCOL: Final = 5  # pickle.HIGHEST_PROTOCOL on CPython 3.8-3.13, which vLLM uses

# Extra-key tags. The pickled bytes depend on object identity (pickle memoises a str it has
# already written by id), and vLLM writes the same literal "mm" object for every item of a
# block, so these constants must be single objects too.
_TAG_LORA: Final = "lora"
_TAG_MM: Final = "mm"
_TAG_SALT: Final = "cache_salt"

ExtraKeys = tuple[tuple[Any, ...], ...] | None


class InexactHashError(ValueError):
    """The engine's hashes cannot be predicted with this configuration.

    Raised by :meth:`BlockHasher.block_hashes` for ``xxhash``/``xxhash_cbor`` engines started
    without ``PYTHONHASHSEED``: vLLM then seeds NONE_HASH from ``os.urandom`` per process, so
    no outside party can compute its chain. Fix: start the engines with a shared
    ``PYTHONHASHSEED`` (and pass it as ``hash_seed``), or use ``sha256``.
    """


@dataclass(slots=True, frozen=True)
class MMFeature:
    """One multimodal item of a prompt: its vLLM identifier and placeholder token range."""

    identifier: str  # mm_hash, the client's uuid, or "<lora_name>:<mm_hash>" (contract §2)
    offset: int  # first placeholder token
    length: int  # number of placeholder tokens


def serialiser(algo: str) -> Callable[[object], bytes]:
    """The byte serialisation vLLM applies before digesting, for ``algo``."""
    _check_algo(algo)
    if algo.endswith("_cbor"):
        return _cbor_dumps
    return _pickle_dumps


def hash_object(algo: str, obj: object) -> bytes:
    """``vllm.utils.hashing.get_hash_fn_by_name(algo)(obj)`` for the object shapes vLLM hashes."""
    return _digest_fn(algo)(serialiser(algo)(obj))


def resolve_none_hash_seed(algo: str, hash_seed: str | None) -> str | None:
    """The seed vLLM derives NONE_HASH from, or None when vLLM uses a random one.

    ``hash_seed`` is the engine's ``PYTHONHASHSEED`` (None = unset). It wins when set, as a
    string; otherwise sha256* use the fixed default and xxhash* draw 32 random bytes.
    """
    _check_algo(algo)
    if hash_seed is not None:
        return hash_seed
    if algo.startswith("xxhash"):
        return None
    return DEFAULT_NONE_HASH_SEED


def max_hit_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """Most blocks a prompt can hit: vLLM recomputes the last token for logits (§4), so at most
    ⌊(L−1)/bs⌋. An empty prompt or a block size that is not positive can hit nothing (and must not
    divide by zero or count negative blocks)."""
    if num_prompt_tokens <= 1 or block_size <= 0:
        return 0
    return (num_prompt_tokens - 1) // block_size


def predicted_hit_tokens(leading_matched_blocks: int, num_prompt_tokens: int, block_size: int) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` vLLM will report for a prompt of
    ``num_prompt_tokens`` whose first ``leading_matched_blocks`` blocks are cached (§4)."""
    return min(leading_matched_blocks, max_hit_blocks(num_prompt_tokens, block_size)) * block_size


def wire_from_event_hash(value: int | bytes | bytearray | memoryview) -> int:
    """Normalise a hash from a KV event (int by default, raw digest bytes when the engine runs
    with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``) to the 64-bit wire form."""
    if isinstance(value, bytes | bytearray | memoryview):
        return BlockHasher.to_wire(bytes(value))
    if isinstance(value, int) and not isinstance(value, bool):
        return value & _WIRE_MASK
    raise TypeError(f"block hash must be int or bytes, got {type(value).__name__}")


class BlockHasher:
    """Computes the block-hash chain a vLLM engine assigns to a prompt.

    Args:
        algo: the engine's ``--prefix-caching-hash-algo`` (vLLM's default is ``sha256``).
        block_size: the KV-cache block size the hashes are wanted for (the group's
            ``block_size`` in ``BlockStored``; never assume 16: vLLM-CPU defaults to 128).
        hash_seed: the engine's ``PYTHONHASHSEED``; None means unset.
        hash_block_size: vLLM's hashing granularity (``--prefix-match-unit``); it must divide
            ``block_size``. A ``block_size`` block's hash is then the fine hash at the block's
            last fine index (``BlockHashListWithBlockSize``). Defaults to ``block_size``.
        memo_tokens: bound of the prefix memo, in tokens of remembered blocks (0 disables
            it). The default, 2**19 tokens (16 conversations of 32K tokens); its memory per token
            is measured in docs/hashing.md.
        none_hash: NONE_HASH itself, when known by other means; overrides ``hash_seed``.
        native: hash ``sha256`` blocks without extra keys with the compiled chain
            (``litellm_kv/vllm/_chain.c``) when it is built (:data:`NATIVE_HASHING`); False forces the
            pure-Python path. Both give the same hashes.

    Not safe to share between threads (the memo is unsynchronised); one per event loop is
    the intended use.
    """

    __slots__ = (
        "_digest",
        "_dumps",
        "_memo_limit",
        "_memo_new",
        "_memo_new_size",
        "_memo_old",
        "_native",
        "_ratio",
        "_retiring",
        "algo",
        "block_size",
        "exact_possible",
        "hash_block_size",
        "hash_seed",
        "none_hash",
    )

    def __init__(
        self,
        algo: str = "sha256",
        block_size: int = 16,
        hash_seed: str | int | None = None,
        *,
        hash_block_size: int | None = None,
        memo_tokens: int = 1 << 19,
        none_hash: bytes | None = None,
        native: bool = True,
    ) -> None:
        _check_algo(algo)
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        fine = block_size if hash_block_size is None else hash_block_size
        if fine <= 0 or block_size % fine:
            raise ValueError(f"hash_block_size {fine} must divide block_size {block_size}")
        if memo_tokens < 0:
            raise ValueError("memo_tokens must be >= 0")
        self.algo: str = algo
        self.block_size: int = block_size
        self.hash_block_size: int = fine
        self._ratio = block_size // fine
        self.hash_seed: str | None = None if hash_seed is None else str(hash_seed)
        self._dumps = serialiser(algo)
        self._digest = _digest_fn(algo)
        self._native = _NATIVE_CHAIN if native and algo == "sha256" else None
        seed = resolve_none_hash_seed(algo, self.hash_seed)
        if none_hash is not None:
            self.none_hash: bytes = bytes(none_hash)
            self.exact_possible: bool = True
        elif seed is None:
            # What the engine does (a random per-process seed); ours cannot equal theirs.
            self.none_hash = self._digest(self._dumps(os.urandom(32).hex()))
            self.exact_possible = False
        else:
            self.none_hash = self._digest(self._dumps(seed))
            self.exact_possible = True
        # Prefix memo: (parent hash, block tokens, LoRA key, mm items) as one bytes key -> the block's hash.
        # Two generations give an approximate LRU with O(1) upkeep: when the young generation
        # holds half the bound it becomes the old one and the previous old one is dropped, so at
        # most memo_tokens / hash_block_size blocks are held in all (plus a dropped generation
        # while it is freed, a slice per call: see litellm_kv.retire).
        self._memo_limit = memo_tokens // fine // 2
        self._memo_new: dict[bytes, bytes] = {}
        self._memo_old: dict[bytes, bytes] = {}
        self._memo_new_size = 0
        self._retiring: list[dict[bytes, bytes]] = []

    def __repr__(self) -> str:
        return (
            f"BlockHasher(algo={self.algo!r}, block_size={self.block_size}, "
            f"hash_seed={self.hash_seed!r}, hash_block_size={self.hash_block_size})"
        )

    @staticmethod
    def to_wire(block_hash: bytes) -> int:
        """The hash as KV events carry it by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``):
        ``int.from_bytes(digest, "big") & (2**64 - 1)``, i.e. the last 8 bytes big-endian."""
        return int.from_bytes(block_hash[-8:], "big")

    def block_hashes(
        self,
        token_ids: Sequence[int],
        lora: tuple[str, str] | None = None,
        mm: Sequence[MMFeature] = (),
        cache_salt: str | None = None,
    ) -> list[bytes]:
        """Hashes of every full ``block_size`` block of ``token_ids``, as the engine computes
        them for a request with this LoRA (``(lora_name, lora_path)`` exactly as the server
        resolved it), these multimodal items and this ``cache_salt``.

        Token ids must be Python ints (pickle encodes numpy integers differently).
        Raises :class:`InexactHashError` when ``exact_possible`` is False.
        """
        if not self.exact_possible:
            raise InexactHashError(
                f"{self.algo} without PYTHONHASHSEED: vLLM seeds NONE_HASH randomly per process; "
                "set PYTHONHASHSEED on the engines and pass it as hash_seed, or use sha256"
            )
        fine = self._fine_hashes(token_ids, lora, sorted(mm, key=_mm_offset) if mm else (), cache_salt)
        ratio = self._ratio
        if ratio == 1:
            return fine
        return fine[ratio - 1 :: ratio]

    def wire_hashes(
        self,
        token_ids: Sequence[int],
        lora: tuple[str, str] | None = None,
        mm: Sequence[MMFeature] = (),
        cache_salt: str | None = None,
    ) -> list[int]:
        """:meth:`block_hashes` in the 64-bit wire form the index stores."""
        hashes = self.block_hashes(token_ids, lora, mm, cache_salt)
        if not hashes or not _Q_IS_8_BYTES:
            return [int.from_bytes(h[-8:], "big") for h in hashes]
        # Each digest's last 8 bytes, big-endian, in C: the digests side by side as 64-bit words, the
        # last word of each digest picked out (one int.from_bytes per hash is slow on long prompts).
        words = len(hashes[0]) // 8
        arr = array("Q", b"".join(hashes))
        if sys.byteorder == "little":
            arr.byteswap()
        return arr[words - 1 :: words].tolist()

    def memo_size(self) -> int:
        """Blocks currently held by the prefix memo (at most ``memo_tokens / hash_block_size``;
        a block shared by both generations is counted twice)."""
        return len(self._memo_new) + len(self._memo_old)

    def clear_memo(self) -> None:
        self._memo_new = {}
        self._memo_old = {}
        self._memo_new_size = 0
        self._retiring = []

    # -- internals -------------------------------------------------------------------------

    def _rotate(self, memo_old: dict[bytes, bytes]) -> None:
        """The young generation is full: it becomes the old one; the old one is freed a slice per call."""
        if memo_old:
            self._retiring.append(memo_old)

    def _fine_hashes(
        self,
        token_ids: Sequence[int],
        lora: tuple[str, str] | None,
        mm: Sequence[MMFeature],
        cache_salt: str | None,
    ) -> list[bytes]:
        step = self.hash_block_size
        if not isinstance(token_ids, list):
            token_ids = list(token_ids)
        # The LoRA key is the same on every block: built once per call (the memo key carries its
        # pickled bytes; identity inside one block's key is what pickle sees).
        lora_keys: tuple[tuple[Any, ...], ...] = ((_TAG_LORA, lora[0], lora[1]),) if lora is not None else ()
        plain_keys: ExtraKeys = lora_keys or None
        # Blocks before this token may carry per-block keys (mm items, the salt on block 0).
        keyed_until = max((f.offset + f.length for f in mm), default=0)
        if cache_salt:
            keyed_until = max(keyed_until, 1)
        mm_idx = 0
        dumps = self._dumps
        digest = self._digest
        limit = self._memo_limit
        n_full = len(token_ids) // step * step
        # The native chain does sha256 over pickle for blocks without extra keys (no LoRA, after any
        # mm items or salt): every block from the first memo miss on, in one call.
        native = self._native if plain_keys is None else None
        packed = _pack_tokens(token_ids) if limit > 0 or native is not None else None
        if packed is None:
            native = None
        memo_on = packed is not None and limit > 0
        # Memo keys are bytes: parent hash + the block's tokens as fixed-width uint32 + the LoRA key + the
        # block's mm items (_mm_memo_tag).
        # Bytes keys and values are not tracked by the garbage collector, so the memo never adds to
        # a collection's walk (a memo of tuples did: they stayed young, and tracked, until a gen-0
        # collection met them, by then so many that the pause set the decision's p99; docs/hashing.md).
        tag = b"" if not lora_keys else b"\x00" + _pickle_dumps(lora_keys)
        width = 4 * step
        seen = True
        memo_new = self._memo_new
        memo_old = self._memo_old
        size = self._memo_new_size
        out: list[bytes] = []
        append = out.append
        parent = self.none_hash
        for start in range(0, n_full, step):
            end = start + step
            extra: ExtraKeys = plain_keys
            mm_tag = b""
            keyed = start < keyed_until
            if keyed:  # per-block keys (mm items, the salt on block 0)
                mm_keys, mm_idx = _mm_keys(mm, start, end, mm_idx) if mm else ((), mm_idx)
                salt_keys = ((_TAG_SALT, cache_salt),) if cache_salt and start == 0 else ()
                extra = (lora_keys + mm_keys + salt_keys) or None
                if salt_keys or not memo_on:  # the salted block is hashed directly, never memoised
                    parent = digest(dumps((parent, tuple(token_ids[start:end]), extra)))
                    append(parent)
                    continue
                # A block an image overlaps is memoised under its items' values too (a resent image
                # conversation then rehashes none of its image blocks).
                mm_tag = _mm_memo_tag(mm_keys)
            key = b""
            child = None
            if memo_on:
                key = parent + packed[start * 4 : start * 4 + width] + tag + mm_tag  # type: ignore[index]
                if seen:
                    child = memo_new.get(key)
                    if child is not None:
                        parent = child
                        append(child)
                        continue
                    child = memo_old.get(key)  # found: promoted to the young generation below
                    # Once a block misses, its hash is new, so the blocks after it miss too: only insert.
                    seen = child is not None
            if child is None and native is not None and not keyed:
                rest = native(parent, packed[start * 4 : n_full * 4], step)  # type: ignore[index]
                if rest is not None:
                    if memo_on:
                        for j, child in enumerate(rest):
                            at = start * 4 + j * width
                            memo_new[parent + packed[at : at + width] + tag] = child  # type: ignore[index]
                            parent = child
                            size += 1
                            if size >= limit:
                                self._rotate(memo_old)
                                memo_old, memo_new, size = memo_new, {}, 0
                    out.extend(rest)
                    break
                native = None  # a token the native encoder does not take (>= 2**31): Python from here
            if child is None:
                child = digest(dumps((parent, tuple(token_ids[start:end]), extra)))
            if memo_on:
                memo_new[key] = child
                size += 1
                if size >= limit:
                    self._rotate(memo_old)
                    memo_old, memo_new, size = memo_new, {}, 0
            parent = child
            append(child)
        if memo_on:
            self._memo_new = memo_new
            self._memo_old = memo_old
            self._memo_new_size = size
            if self._retiring:
                free_some(self._retiring, len(out) + 64)  # a dropped generation, a slice per call
        return out


def _pack_tokens(token_ids: list[int]) -> bytes | None:
    """The tokens as native uint32s (the memo's key material and the native chain's input); None when one
    does not fit (the call is then hashed in Python without the memo, so odd input can never alias another
    prompt's key)."""
    try:
        return array("I", token_ids).tobytes()
    except (OverflowError, TypeError):
        return None


def _mm_offset(feature: MMFeature) -> int:
    return feature.offset


def _mm_keys(mm: Sequence[MMFeature], start: int, end: int, idx: int) -> tuple[tuple[tuple[Any, ...], ...], int]:
    """``("mm", identifier, offset - start)`` for the items overlapping ``[start, end)``,
    and the index to resume from for the next block. Mirrors vLLM's walk: items are sorted
    by offset and the walk stops at the first item that extends past the block."""
    keys: list[tuple[Any, ...]] = []
    seen: set[int] = set()
    while idx < len(mm):
        feature = mm[idx]
        if end <= feature.offset:
            break  # this block has not reached the item
        if start >= feature.offset + feature.length:
            idx += 1  # the block is past this item
            continue
        ident = feature.identifier
        if id(ident) in seen:
            # vLLM's identifiers are distinct objects; a repeated one would be memoised
            # by pickle (a BINGET) and change the bytes, so write a copy.
            ident = _fresh_str(ident)
        seen.add(id(ident))
        keys.append((_TAG_MM, ident, feature.offset - start))
        if end >= feature.offset + feature.length:
            idx += 1  # the item ends here; the next one may start in this block too
        else:
            break
    return tuple(keys), idx


def _mm_memo_tag(mm_keys: tuple[tuple[Any, ...], ...]) -> bytes:
    """A block's mm items as memo-key bytes: ``\\x01``, then per item the identifier's UTF-8 bytes,
    length-prefixed, and its offset; empty for a block no item overlaps (its hash is the plain one).
    The hash depends on these values only (the identifiers are written as distinct objects)."""
    if not mm_keys:
        return b""
    parts = [b"\x01"]
    for _tag, ident, offset in mm_keys:
        raw = ident.encode("utf-8", "surrogatepass")
        parts += (len(raw).to_bytes(4, "little"), raw, offset.to_bytes(8, "little", signed=True))
    return b"".join(parts)


def _fresh_str(value: str) -> str:
    # Slicing with concatenation yields a new object for strings of 2+ characters; shorter
    # ones are interned singletons in CPython either way.
    return (value + " ")[:-1]


def _pickle_dumps(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)


def _cbor_dumps(obj: object) -> bytes:
    return cast(bytes, cbor2.dumps(obj, canonical=True))


def _digest_fn(algo: str) -> Callable[[bytes], bytes]:
    if algo.startswith("sha256"):
        return _sha256
    return cast(Callable[[bytes], bytes], xxhash.xxh3_128_digest)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _check_algo(algo: str) -> None:
    if algo not in HASH_ALGOS:
        raise ValueError(f"unknown prefix-caching hash algorithm {algo!r}; vLLM has {', '.join(HASH_ALGOS)}")
