"""The proxy refuses to load litellm-kv over a LiteLLM release it is not tested with, naming both versions.

The other release is a real ``litellm-<version>.dist-info`` placed ahead of the installed one on the path
(what ``importlib.metadata`` and pip read), not a patched function: the check runs as it would in a proxy
whose environment holds another LiteLLM.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from litellm_kv.errors import IncompatibleLiteLLM
from litellm_kv.integration.litellm_version import (
    ALLOW_UNTESTED_ENV,
    TESTED_LITELLM,
    check_litellm_version,
    installed_litellm,
)
from tools.harness.procs import ROOT
from tools.harness.proxy import start_proxy


def _other_litellm(tmp: Path, version: str) -> Path:
    """A directory that, first on sys.path, makes ``litellm`` read as installed at ``version``."""
    dist = tmp / f"litellm-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: litellm\nVersion: {version}\n")
    return tmp


def test_the_installed_litellm_is_the_tested_one() -> None:
    assert installed_litellm() in TESTED_LITELLM
    check_litellm_version()


@pytest.mark.parametrize("version", ["1.110.3", "1.111.0", "1.109.9", "2.0.0", "1.110.2.post1"])
def test_other_versions_are_refused_naming_both(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(IncompatibleLiteLLM) as exc:
        check_litellm_version(version)
    msg = str(exc.value)
    assert f"LiteLLM {version}" in msg and "1.110.2" in msg and ALLOW_UNTESTED_ENV in msg


def test_the_override_starts_with_a_warning(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="litellm_kv"):
        check_litellm_version("1.111.0")
    assert "LiteLLM 1.111.0" in caplog.text and "starting anyway" in caplog.text


def test_importing_the_callback_over_another_litellm_fails_with_the_versions(tmp_path: Path) -> None:
    fake = _other_litellm(tmp_path, "1.999.0")
    # LiteLLM's import would otherwise try to download its price list (no internet here).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)]), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop(ALLOW_UNTESTED_ENV, None)
    run = subprocess.run([sys.executable, "-c", "import litellm_kv.integration.callback"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "IncompatibleLiteLLM" in run.stderr and "LiteLLM 1.999.0" in run.stderr, run.stderr[-2000:]
    # The tested one imports.
    env["PYTHONPATH"] = str(ROOT)
    ok = subprocess.run([sys.executable, "-c", "import litellm_kv.integration.callback"], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]


@pytest.mark.proxy
def test_a_proxy_over_another_litellm_does_not_start(tmp_path: Path) -> None:
    fake = _other_litellm(tmp_path, "1.999.0")
    cfg = {
        "model_list": [{"model_name": "m", "litellm_params": {"model": "hosted_vllm/x", "api_base": "http://127.0.0.1:9"}}],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
    }
    # The proxy exits on the error (RuntimeError); on a loaded machine it may still be exiting at the deadline.
    with pytest.raises((RuntimeError, TimeoutError)) as exc:
        start_proxy(cfg, name="other-litellm", timeout=150,
                    env={"PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)]), "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert "tested with LiteLLM 1.110.2 only, and this environment has LiteLLM 1.999.0" in str(exc.value)
