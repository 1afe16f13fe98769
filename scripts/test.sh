#!/usr/bin/env bash
# Set up everything (idempotent) and run the whole test suite plus lint and type checks.
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite includes the tests on a real vision-language engine (tests/vllm/test_vl_engine.py): its venv is
# built here, not for the demo (~3 min and 6.3 GB the first time; LITELLM_KV_VL_ENGINE=0 leaves it out and
# those tests then skip, saying why; with it, the default, pytest sees it too and a missing venv fails them).
export LITELLM_KV_VL_ENGINE="${LITELLM_KV_VL_ENGINE:-1}"
bash scripts/setup.sh
echo "[test] ruff"; .venv/bin/ruff check --no-cache litellm_kv tests tools benchmarks
echo "[test] mypy"; .venv/bin/mypy
echo "[test] pytest"
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider -m "not package" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi
# The wheel built, installed into a fresh venv and run (minutes: it installs LiteLLM's proxy requirements).
echo "[test] package (tests/packaging)"
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider -m package tests/packaging
prc=$?
set -e
if [ "$prc" -eq 5 ]; then echo "the package tests collected nothing: failing"; exit 1; fi
[ "$rc" -ne 0 ] && exit "$rc"
exit "$prc"
