"""The harness the demo, the benchmarks and the tests share: real vLLM CPU replicas, a real LiteLLM proxy
process, a real Redis server, and the demo's workload. Repository tooling, not part of the package."""
