"""What pip installs is what the code imports.

* Every third-party module ``litellm_kv`` imports (function-level imports included) comes from a
  distribution that ``pyproject.toml`` declares, in ``dependencies`` or in the extra of the feature that
  needs it, and every declared dependency is imported.
* ``requirements/core.txt`` and ``requirements/proxy.txt`` (what ``scripts/setup.sh`` and the Dockerfile
  install) are the same lists as the package's.
* The Python floor, the LiteLLM pin and the licence are stated once and agree wherever they are repeated.

The wheel built from this metadata is installed into a clean venv by ``tests/packaging/test_wheel.py``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

from litellm_kv.integration.litellm_version import TESTED_LITELLM

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]

# Packages imported only by one feature, and the extra that declares them.
EXTRA_OF = {"fastapi": "indexer", "uvicorn": "indexer", "pydantic": "indexer", "matplotlib": "bench",
            "litellm": "proxy"}
# The integration layer runs inside the LiteLLM proxy: its FastAPI comes with the `proxy` extra.
PROXY_SIDE = ("litellm_kv/integration/",)


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement line."""
    head = re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", head).lower()


def _requirements(path: Path) -> list[str]:
    return [line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()]


def _imports() -> dict[str, set[str]]:
    """Top-level third-party module -> files of litellm_kv that import it."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "litellm_kv").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "litellm_kv":
                    found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


def _distribution(module: str) -> str:
    dists = importlib.metadata.packages_distributions().get(module)
    assert dists, f"no installed distribution provides the module {module!r}"
    return _name(dists[0])


def test_every_import_is_declared_where_its_feature_is_installed() -> None:
    core = {_name(r) for r in PROJECT["dependencies"]}
    extras = {extra: {_name(r) for r in reqs} for extra, reqs in PROJECT["optional-dependencies"].items()}
    problems = []
    for module, files in sorted(_imports().items()):
        dist = _distribution(module)
        extra = EXTRA_OF.get(module)
        if extra is None:
            if dist not in core:
                problems.append(f"{module} ({dist}) imported by {sorted(files)} is not in `dependencies`")
            continue
        if dist in core:
            problems.append(f"{module} ({dist}) is both core and the `{extra}` extra's")
        if dist not in extras[extra]:
            problems.append(f"{module} ({dist}) is not in the `{extra}` extra")
        proxy_side = {f for f in files if f.startswith(PROXY_SIDE)}
        if proxy_side and dist not in extras["proxy"]:
            problems.append(f"{module} ({dist}) imported by {sorted(proxy_side)} is not in the `proxy` extra")
    assert not problems, "\n".join(problems)


def test_every_declared_dependency_is_imported() -> None:
    imported = {_distribution(m) for m in _imports()}
    declared = {_name(r) for r in PROJECT["dependencies"]}
    declared |= {_name(r) for extra in ("indexer", "bench") for r in PROJECT["optional-dependencies"][extra]}
    assert declared - imported == set()


def test_every_requirement_has_a_range() -> None:
    for req in PROJECT["dependencies"] + [r for rs in PROJECT["optional-dependencies"].values() for r in rs]:
        assert re.search(r"(==|>=.*<)", req), f"{req}: give a lower and an upper bound (or a pin)"


def test_requirement_files_are_the_package_s_lists() -> None:
    extras = PROJECT["optional-dependencies"]
    assert _requirements(ROOT / "requirements" / "core.txt") == PROJECT["dependencies"] + extras["indexer"]
    assert _requirements(ROOT / "requirements" / "proxy.txt") == extras["proxy"]


def test_the_litellm_pin_is_the_tested_version_and_the_installed_one() -> None:
    pins = [r for r in PROJECT["optional-dependencies"]["proxy"] if _name(r) == "litellm"]
    assert pins == [f"litellm=={TESTED_LITELLM[-1]}"]
    assert importlib.metadata.version("litellm") in TESTED_LITELLM


def test_the_python_floor_agrees_everywhere() -> None:
    floor = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"])
    assert floor, PROJECT["requires-python"]
    minor = int(floor.group(1))
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py3{minor}"
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"3.{minor}"
    assert f"sys.version_info < (3, {minor})" in (ROOT / "litellm_kv" / "__init__.py").read_text()
    assert f"Programming Language :: Python :: 3.{minor}" in PROJECT["classifiers"]
    assert re.search(rf"FROM python:3\.{minor}-slim AS proxy", (ROOT / "Dockerfile").read_text())
    for page in ("README.md", "docs/quickstart.md", "docs/install.md"):
        text = (ROOT / page).read_text()
        claimed = {int(m) for m in re.findall(r"Python ≥ ?3\.(\d+)", text)}
        assert claimed == {minor}, f"{page} claims Python ≥ 3.{sorted(claimed)}"


def test_the_licence_is_the_declared_one() -> None:
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md", "docs/install.md"])
def test_install_pages_make_no_claim_about_an_index(page: str) -> None:
    """No package index carries litellm-kv: `pip install litellm-kv` (a name, not a path) cannot work."""
    text = (ROOT / page).read_text()
    # A name among pip's arguments (up to the end of the command: a backtick, a comment, a table cell).
    assert not re.search(r"pip install [^\n`#|,()]*(?<![\w./'\"\[-])litellm-kv(?![\w./-])", text), page


def test_repository_tools_stay_out_of_the_package() -> None:
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["litellm_kv*"]
    assert not list((ROOT / "litellm_kv").rglob("docsgen*"))


def test_the_image_build_copies_what_the_package_metadata_reads() -> None:
    """`pip install .` in the Dockerfile reads the readme and the licence files: they must be in the image."""
    copied = re.search(r"^COPY pyproject\.toml ([^\n]+) \./$", (ROOT / "Dockerfile").read_text(), re.M)
    assert copied, "the Dockerfile no longer copies the package's metadata files"
    assert {PROJECT["readme"], *PROJECT["license-files"], "setup.py"} <= set(copied.group(1).split())
