"""engine_metrics: the router's figures from a vLLM /metrics body (the real engines' bodies are read in
test_engine_exactness and test_routing_e2e; this pins the parsing rules on crafted bodies)."""

from __future__ import annotations

import re

from litellm_kv.engine import engine_metrics

BODY = """\
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.75
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 7.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1.5e+03
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 2000.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} NaN
process_start_time_seconds 1.7e9
x_vllm:num_requests_running 50.0
vllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0",note="a \\"quoted\\" \\\\ value",\
num_gpu_blocks="512",prefix_caching_hash_algo="sha256"} 1.0
vllm:cache_config_info{block_size="64",engine="1"} 1.0
"""


def test_reads_the_wanted_samples_and_nothing_else() -> None:
    m = engine_metrics(BODY)
    assert m.waiting == 7  # both DP ranks; the *_by_reason lookalike is not counted
    assert m.running == 3  # the first line of the body counts; 'x_vllm:...' does not
    assert m.kv_usage == 0.5
    assert m.prefix_cache_hits == 1500.0
    assert m.prefix_cache_queries is not None and m.prefix_cache_queries != m.prefix_cache_queries  # NaN kept
    assert m.process_start_time == 1.7e9
    assert (m.block_size, m.hash_algo, m.prefix_caching, m.num_gpu_blocks) == (32, "sha256", True, 512)
    assert m.cache_config["note"] == 'a "quoted" \\ value'  # the first rank's labels, unescaped


def test_crlf_bodies_and_absent_samples() -> None:
    m = engine_metrics(BODY.replace("\n", "\r\n"))
    assert (m.waiting, m.running, m.block_size) == (7, 3, 32)
    empty = engine_metrics("# nothing here\nother_metric 1.0\n")
    assert (empty.waiting, empty.running, empty.kv_usage, empty.block_size) == (None, None, None, None)
    assert engine_metrics("") == empty


def test_agrees_with_a_line_by_line_parse() -> None:
    """The one-pass scan against a plain per-line parse of the same body, sample by sample."""
    sample = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(\S+)")
    waiting = 0
    for line in BODY.replace("\\\n", "").splitlines():
        hit = sample.match(line)
        if hit and hit.group(1) == "vllm:num_requests_waiting":
            waiting += int(float(hit.group(2)))
    assert engine_metrics(BODY).waiting == waiting
