"""Added cost of image requests on the routing decision (litellm_kv.vllm.multimodal), against text.

    .venv/bin/python benchmarks/bench_multimodal.py [--quick]

A prompt of 200 text tokens followed by N images (N = 1, 4, 16), each a 640×480 image (391
Qwen2.5-VL visual tokens) whose encoded bytes are 100 KB. Per request, as the proxy would pay it
on a resent conversation (the hasher's prefix memo warm):

* identifier: ``image_identifier`` (SHA-256 of each image's bytes);
* expansion: ``expand_images`` on the rendered ids (one placeholder per image);
* hashing: ``wire_hashes`` of the expanded prompt with the images' extra keys (block size 16);
* baseline: ``wire_hashes`` of a text prompt of the same expanded length (memo warm, the fast path);
* cold: hashing and baseline again with a new hasher (a conversation never seen: image blocks go
  through Python, text through the compiled chain).

Added cost per image = (identifier + expansion + hashing − baseline) / N, warm and cold. A request
with ``mm_processor_kwargs`` also pays ``engine_identifier`` per image (BLAKE3 in pure Python, and
SHA-256 for engines run with ``--mm-hasher-algorithm sha256``), timed last. Each figure is the median
of ``--repeats`` runs of ``--loops`` requests; the spread is the min–max of the runs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable

from litellm_kv.governance.vision import visual_tokens
from litellm_kv.vllm.hashing import BlockHasher
from litellm_kv.vllm.multimodal import (
    ImageItem,
    engine_identifier,
    expand_images,
    image_block_hashes,
    image_identifier,
)

BLOCK = 16
PAD = 151655  # Qwen2.5-VL's <|image_pad|>
TEXT_TOKENS = 200
IMAGE_BYTES = 100_000
SIZE = (640, 480)


def timed(fn: Callable[[], object], loops: int, repeats: int) -> tuple[float, float, float]:
    """Median, min and max over ``repeats`` runs of the mean µs per call of ``loops`` calls."""
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        runs.append((time.perf_counter() - t0) / loops * 1e6)
    return statistics.median(runs), min(runs), max(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    loops = 20 if args.quick else 200
    rng = random.Random(7)
    per_image = visual_tokens("qwen2_5_vl", *SIZE)
    print(f"block {BLOCK}, {TEXT_TOKENS} text tokens + N images of {SIZE[0]}x{SIZE[1]} "
          f"({per_image} visual tokens, {IMAGE_BYTES} B each); µs per request, median [min-max] of "
          f"{args.repeats} runs x {loops}")
    print(f"{'N':>3} {'tokens':>7} {'identifier':>22} {'expansion':>20} {'hashing':>22} {'text baseline':>22}"
          f" {'added/image':>12} {'cold hashing':>22} {'cold baseline':>22} {'cold added/image':>16}")
    for n in (1, 4, 16):
        payloads = [os.urandom(IMAGE_BYTES) for _ in range(n)]
        text = [rng.randrange(1000, 150000) for _ in range(TEXT_TOKENS)]
        rendered = [*text]
        for _ in range(n):
            rendered += [151652, PAD, 151653]  # <|vision_start|><|image_pad|><|vision_end|>
        rendered += [151645, 198]
        idents = [image_identifier(p) for p in payloads]
        items = [ImageItem(i, per_image) for i in idents]
        prompt = expand_images(rendered, PAD, items)
        plain = [rng.randrange(1000, 150000) for _ in range(len(prompt.token_ids))]
        hasher = BlockHasher("sha256", BLOCK)
        image_block_hashes(hasher, prompt)  # memo warm, as for a resent conversation
        hasher.wire_hashes(plain)
        ident = timed(lambda: [image_identifier(p) for p in payloads], loops, args.repeats)  # noqa: B023
        expand = timed(lambda: expand_images(rendered, PAD, items), loops, args.repeats)  # noqa: B023
        hashing = timed(lambda: image_block_hashes(hasher, prompt), loops, args.repeats)  # noqa: B023
        base = timed(lambda: hasher.wire_hashes(plain), loops, args.repeats)  # noqa: B023
        cold = timed(lambda: image_block_hashes(BlockHasher("sha256", BLOCK), prompt), loops, args.repeats)  # noqa: B023
        cold_base = timed(lambda: BlockHasher("sha256", BLOCK).wire_hashes(plain), loops, args.repeats)  # noqa: B023
        added = (ident[0] + expand[0] + hashing[0] - base[0]) / n
        cold_added = (ident[0] + expand[0] + cold[0] - cold_base[0]) / n

        def cell(t: tuple[float, float, float]) -> str:
            return f"{t[0]:8.1f} [{t[1]:.1f}-{t[2]:.1f}]"

        print(f"{n:>3} {len(prompt.token_ids):>7} {cell(ident):>22} {cell(expand):>20} {cell(hashing):>22} "
              f"{cell(base):>22} {added:>12.1f} {cell(cold):>22} {cell(cold_base):>22} {cold_added:>16.1f}")
    uuid = image_identifier(b"x")
    model = "/models/Qwen2.5-VL-7B-Instruct"
    fresh = iter(range(10**9))
    for algo in ("blake3", "sha256"):
        t = timed(lambda: engine_identifier(uuid, model, {"max_pixels": next(fresh)}, algo), loops, args.repeats)  # noqa: B023
        again = timed(lambda: engine_identifier(uuid, model, {"max_pixels": 50_000}, algo), loops, args.repeats)  # noqa: B023
        print(f"engine_identifier with mm_processor_kwargs, {algo}: new {t[0]:.1f} µs per image "
              f"[{t[1]:.1f}-{t[2]:.1f}], seen before {again[0]:.1f} [{again[1]:.1f}-{again[2]:.1f}]")


if __name__ == "__main__":
    main()
