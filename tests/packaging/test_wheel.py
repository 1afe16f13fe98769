"""The package as a user gets it: a wheel and an sdist built from the checkout (``python -m build``), the
wheel installed into a fresh venv with nothing but what it declares (pip reaches the package registry and
reuses its cache), then used from outside the checkout.

* The core install runs ``litellm-kv --help`` and ``litellm-kv indexer --help``, and ``litellm-kv indexer``
  says which extra it lacks instead of failing on an import.
* With the ``proxy`` extra (LiteLLM 1.110.2 and its proxy server's requirements): the callback imports, a
  real ``litellm-kv indexer`` from the venv serves ``/health`` over a real Redis, and a real ``litellm``
  proxy from the venv loads the callback and answers ``/litellm-kv/health``.

Slow (minutes: it installs LiteLLM and the proxy's requirements), so marked ``package``: ``scripts/test.sh``
runs it on its own after the main run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tools.harness.procs import ROOT, ManagedProcess, free_port
from tools.harness.proxy import MASTER_KEY, start_proxy
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.package, pytest.mark.slow]

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], check=True,
                   capture_output=True, timeout=600)
    return out


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with only pip (no system site-packages), outside the checkout."""
    where = tmp_path_factory.mktemp("venv") / "v"
    venv.create(where, with_pip=True, clear=True)
    return where


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob(f"litellm_kv-{VERSION}-*.whl")
    return wheel


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without anything that would put the checkout on the venv's path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    # LiteLLM's import otherwise tries to download its price list (no internet here).
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env.update(extra)
    return env


def _run(venv_dir: Path, *argv: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    exe = venv_dir / "bin" / argv[0]
    run = subprocess.run([str(exe), *argv[1:]], env=_env(), cwd=venv_dir, capture_output=True, text=True,
                         timeout=timeout)
    if check and run.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return run


def test_the_wheel_holds_the_package_and_its_metadata(dist: Path) -> None:
    with zipfile.ZipFile(_wheel(dist)) as whl:
        names = whl.namelist()
        meta = whl.read(f"litellm_kv-{VERSION}.dist-info/METADATA").decode()
    assert all(n.startswith(("litellm_kv/", f"litellm_kv-{VERSION}.dist-info/")) for n in names), \
        sorted(n for n in names if not n.startswith("litellm_kv"))
    assert "litellm_kv/index/lua/" in "".join(names) and "litellm_kv/routing/affinity/lua/" in "".join(names)
    assert "litellm_kv/services/indexer/lua/lease.lua" in names
    assert not [n for n in names if "docsgen" in n or n.startswith(("tools/", "tests/", "docs/"))]
    assert f"litellm_kv-{VERSION}.dist-info/licenses/LICENSE" in names
    assert "License-Expression: Apache-2.0" in meta and "Requires-Python: >=3.11" in meta
    for dep in ("tiktoken", "jinja2", "pyzmq"):
        assert f"Requires-Dist: {dep}" in meta
    assert "Requires-Dist: uvicorn<1,>=0.29; extra == \"indexer\"" in meta
    assert "Requires-Dist: litellm==1.110.2; extra == \"proxy\"" in meta
    assert "Requires-Dist: matplotlib<4,>=3.8; extra == \"bench\"" in meta


def test_the_sdist_builds_the_native_chain_and_carries_the_licence(dist: Path) -> None:
    (sdist,) = dist.glob(f"litellm_kv-{VERSION}.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = {"LICENSE", "setup.py", "pyproject.toml", "litellm_kv/vllm/_chain.c", "litellm_kv/index/lua/lookup.lua"}
    assert wanted <= names, sorted(wanted - names)


@pytest.fixture(scope="module")
def core_venv(dist: Path, fresh: Path) -> Path:
    _run(fresh, "python", "-m", "pip", "install", "--quiet", str(_wheel(dist)))
    return fresh


def test_the_core_install_runs_the_command(core_venv: Path) -> None:
    where = _run(core_venv, "python", "-c", "import litellm_kv; print(litellm_kv.__file__)").stdout
    assert where.startswith(str(core_venv)), where  # the installed package, not the checkout
    assert "indexer" in _run(core_venv, "litellm-kv", "--help").stdout
    assert "--config" in _run(core_venv, "litellm-kv", "indexer", "--help").stdout
    missing = _run(core_venv, "litellm-kv", "indexer", "--config", "/nonexistent.yaml", check=False)
    assert missing.returncode == 2 and "with its `indexer` extra" in missing.stderr, missing.stderr


@pytest.fixture(scope="module")
def proxy_venv(core_venv: Path, dist: Path) -> Path:
    _run(core_venv, "python", "-m", "pip", "install", "--quiet", f"{_wheel(dist)}[proxy]")
    return core_venv


def test_the_proxy_extra_loads_the_callback(proxy_venv: Path) -> None:
    code = ("from litellm.integrations.custom_logger import CustomLogger\n"
            "from litellm_kv.integration.callback import proxy_handler\n"
            "assert isinstance(proxy_handler, CustomLogger), type(proxy_handler)\n"
            "import litellm_kv; print(litellm_kv.__file__)")
    assert _run(proxy_venv, "python", "-c", code).stdout.startswith(str(proxy_venv))


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(name="wheel-redis")
    try:
        yield server
    finally:
        server.stop()


def test_the_installed_indexer_serves_health(proxy_venv: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "indexer.yaml"
    cfg.write_text(yaml.safe_dump({"redis_url": "os.environ/WHEEL_TEST_REDIS_URL", "port": port,
                                   "model_groups": {}}))
    proc = ManagedProcess("wheel-indexer", [str(proxy_venv / "bin" / "litellm-kv"), "indexer", "--config", str(cfg)],
                          env=_env(WHEEL_TEST_REDIS_URL=redis_server.url), cwd=tmp_path)
    try:
        proc.wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200, 90,
                        "indexer /health")
    finally:
        proc.stop()


def test_the_installed_proxy_loads_the_callback(proxy_venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIRTUAL_ENV", str(proxy_venv))  # start_proxy runs this venv's `litellm`
    cfg = {
        "model_list": [{"model_name": "m", "litellm_params": {"model": "hosted_vllm/x", "api_base": "http://127.0.0.1:9"}}],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {"m": {"routing": "kv"}}},
    }
    proxy = start_proxy(cfg, name="wheel-proxy", timeout=180,
                        env={"PYTHONPATH": "", "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        r = httpx.get(f"{proxy.url}/litellm-kv/health", headers={"Authorization": f"Bearer {MASTER_KEY}"}, timeout=10)
        assert r.status_code == 200, r.text
        assert "m" in r.json()["routing"]["groups"]
    finally:
        proxy.stop()
