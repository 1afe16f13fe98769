"""Build a tiny LoRA adapter (PEFT layout) for the tiny test model, so a real vLLM engine serves a
real adapter in tests: rank 8 on every layer's q_proj and v_proj, seeded random weights.

Run with the engine venv (torch and safetensors are there)::

    .venv-engine/bin/python tools/engine/build_lora.py --model .artifacts/tiny-model --out .artifacts/tiny-lora

The adapter's weights do not matter to routing; what matters is that the engine loads it, serves it
under its own name and hashes its requests' blocks with the adapter's name and path (vllm-contract.md §2).
The sizes are read from the model's ``config.json``; a marker file skips rebuilds of the same version.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

VERSION = "tiny-lora-v1"
MARKER = ".litellm-kv-lora-version"
RANK = 8
SEED = 1234


def build(model: Path, out: Path, force: bool = False) -> Path:
    marker = out / MARKER
    if not force and marker.exists() and marker.read_text().strip() == f"{VERSION} {model.resolve()}":
        return out
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((model / "config.json").read_text())
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // int(cfg["num_attention_heads"]))
    q_out = int(cfg["num_attention_heads"]) * head_dim
    kv_out = int(cfg["num_key_value_heads"]) * head_dim
    gen = torch.Generator().manual_seed(SEED)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(int(cfg["num_hidden_layers"])):
        for proj, width in (("q_proj", q_out), ("v_proj", kv_out)):
            base = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{base}.lora_A.weight"] = torch.randn(RANK, hidden, generator=gen) * 0.02
            tensors[f"{base}.lora_B.weight"] = torch.randn(width, RANK, generator=gen) * 0.02
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "adapter_model.safetensors"))
    (tmp / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model.resolve()),
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }, indent=2))
    (tmp / MARKER).write_text(f"{VERSION} {model.resolve()}\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="the tiny model's directory")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    print(build(args.model, args.out, args.force))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
