"""Throughput model of one simulated replica: how long prefill and decode take.

Defaults describe Llama-3.1-8B in BF16 on one H100 SXM 80 GB, from public figures:
989 dense BF16 TFLOPS and 3.35 TB/s HBM (NVIDIA H100 datasheet), 8.0 B parameters,
32 layers, hidden 4096, 8 KV heads × 128 dims (Llama 3.1 model card: 128 KiB of KV per token
in BF16). Utilisation factors (40 % of peak FLOPs in prefill, 70 % of peak bandwidth in decode)
are assumptions in the range vLLM reaches on such a GPU; all fields are configurable.

* Prefill of ``new`` tokens after ``cached`` hit tokens costs the linear FLOPs
  (2·params·new) plus attention (4·layers·hidden·new·(cached + new/2)), divided by the
  effective FLOP rate, plus one decode step per chunk of ``chunk_tokens`` (chunked prefill
  shares every step with the running decodes).
* A decode step reads the weights once and the KV of every running sequence; the inter-token
  latency of a sequence is that step time plus, on average, the prefill chunk time × the
  fraction of time the replica spends prefilling.
* Capacity: KV blocks that fit in memory after weights (``gpu_memory_utilization`` × HBM −
  weights), ``max_num_seqs`` running sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

from litellm_kv.config import doc


@dataclass(slots=True)
class ThroughputModel:
    params_b: float = doc("Model parameters, billions.", default=8.0)
    layers: int = doc("Transformer layers.", default=32)
    hidden: int = doc("Hidden size.", default=4096)
    kv_bytes_per_token: int = doc("KV-cache bytes per token (all layers, K and V).", default=131072)
    weight_bytes_per_param: float = doc("Bytes per weight (2 for BF16).", default=2.0)
    peak_tflops: float = doc("Dense peak TFLOPS of the GPU in the model's dtype.", default=989.0)
    mfu: float = doc("Fraction of peak FLOPs reached in prefill.", default=0.4)
    hbm_tbps: float = doc("HBM bandwidth, TB/s.", default=3.35)
    mbu: float = doc("Fraction of peak bandwidth reached in decode.", default=0.7)
    hbm_gb: float = doc("GPU memory, GB.", default=80.0)
    gpu_memory_utilization: float = doc("vLLM --gpu-memory-utilization.", default=0.9)
    chunk_tokens: int = doc("vLLM --max-num-batched-tokens (chunked prefill budget).", default=2048)
    max_num_seqs: int = doc("vLLM --max-num-seqs.", default=256)
    capacity_blocks: int = doc("KV blocks per replica; 0 derives it from memory.", default=0)

    def blocks(self, block_size: int) -> int:
        if self.capacity_blocks:
            return self.capacity_blocks
        weights = self.params_b * 1e9 * self.weight_bytes_per_param
        kv = self.hbm_gb * 1e9 * self.gpu_memory_utilization - weights
        return max(1, int(kv // (self.kv_bytes_per_token * block_size)))

    def decode_step_s(self, running: int, context_tokens: float) -> float:
        if running <= 0:
            return 0.0
        bytes_read = self.params_b * 1e9 * self.weight_bytes_per_param + context_tokens * self.kv_bytes_per_token
        return bytes_read / (self.hbm_tbps * 1e12 * self.mbu)

    def prefill_s(self, new: int, cached: int, running: int, context_tokens: float) -> float:
        flops = 2.0 * self.params_b * 1e9 * new + 4.0 * self.layers * self.hidden * new * (cached + new / 2)
        compute = flops / (self.peak_tflops * 1e12 * self.mfu)
        chunks = max(1, -(-new // self.chunk_tokens))
        return compute + chunks * self.decode_step_s(running, context_tokens)

    def chunk_s(self) -> float:
        return self.prefill_s(self.chunk_tokens, 0, 0, 0.0)
