#!/usr/bin/env bash
# The main job: set up (idempotent), then real vLLM CPU replicas behind a real LiteLLM proxy, the same
# open-loop workload routed by LiteLLM simple-shuffle, LiteLLM least-busy and litellm-kv: TTFT tables and a plot.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m tools.demo "$@"
