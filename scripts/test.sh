#!/usr/bin/env bash
# Set up everything (idempotent) and run the whole test suite plus lint and type checks.
set -euo pipefail
cd "$(dirname "$0")/.."
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
