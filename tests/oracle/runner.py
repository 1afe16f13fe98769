"""Run :mod:`tests.oracle.vllm_oracle` in the engine venv from a test in the proxy venv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = REPO / ".venv-engine" / "bin" / "python"
ORACLE = Path(__file__).with_name("vllm_oracle.py")


def run_vllm_oracle(spec: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
    """Send ``spec`` to the oracle and return its answer.

    A missing engine venv fails the test instead of skipping it: these tests are the proof
    that the hashing is exact, and CI installs the venv (``scripts`` / README).
    """
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} is missing: install the vLLM engine venv (see README) to run the oracle")
    proc = subprocess.run(
        [str(ENGINE_PYTHON), str(ORACLE)],
        input=json.dumps(spec).encode(),
        capture_output=True,
        timeout=timeout_s,
        cwd=REPO,
        env={
            # A clean environment: an inherited PYTHONHASHSEED would change NONE_HASH.
            "PATH": "/usr/bin:/bin",
            "HOME": os.environ.get("HOME", "/tmp"),
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_LOGGING_LEVEL": "ERROR",
        },
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"vLLM oracle failed (rc {proc.returncode}):\n{proc.stderr.decode(errors='replace')[-4000:]}")
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer
