#!/usr/bin/env bash
# The main job: set up (idempotent), then real vLLM CPU replicas behind a real LiteLLM proxy with
# litellm-kv, the same workload with litellm-kv and with LiteLLM's default routing, and a table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m tools.demo "$@"
