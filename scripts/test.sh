#!/usr/bin/env bash
# Set up everything (idempotent) and run the whole test suite plus lint and type checks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff"; .venv/bin/ruff check --no-cache litellm_kv tests tools benchmarks
echo "[test] mypy"; .venv/bin/mypy
echo "[test] pytest"
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi
exit "$rc"
