"""The documentation agrees with the code.

* The generated references (docs/configuration.md, docs/metrics.md) are what
  ``python -m tools.docsgen`` produces from the code now.
* Every metric the code registers appears in docs/, and no page of docs/, README.md, the Grafana
  dashboard or the deployment files name a metric the code does not register.
* Every configuration option the code reads (documented dataclass fields, policy fields,
  environment variables) appears in docs/configuration.md, with a description.
* Relative links in README.md and docs/*.md resolve.
* The key-metadata examples pass the code's own policy parser.

No fakes: these read the real modules and files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tools import docsgen

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DASHBOARDS = (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")
# A metric-like name not followed by "*" (prose wildcards such as litellm_kv_indexer_*).
METRIC_RE = re.compile(r"\blitellm_kv_[a-z0-9_]+\b(?!\*)")
# Identifiers with the prefix that are not metrics (request metadata keys, marker files).
NOT_METRICS = {"litellm_kv_route", "litellm_kv_call_id", "litellm_kv_call", "litellm_kv_vision", "litellm_kv_reasoning",
               "litellm_kv_headers", "litellm_kv_model_version"}
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def metrics() -> list[docsgen.MetricInfo]:
    return docsgen.metrics()


def _all_docs() -> str:
    return "\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))


def test_generated_references_are_up_to_date() -> None:
    stale = docsgen.outdated()
    assert not stale, f"{stale} out of date: run `.venv/bin/python -m tools.docsgen` and commit"


def test_every_registered_metric_is_documented(metrics: list[docsgen.MetricInfo]) -> None:
    assert len(metrics) > 20, "import_all found suspiciously few metrics"
    text = _all_docs()
    missing = [m.name for m in metrics if m.name not in text]
    assert not missing, f"metrics registered in code but absent from docs/: {missing}"


def _known_series(metrics: list[docsgen.MetricInfo]) -> set[str]:
    names = set()
    for m in metrics:
        names.add(m.name)
        base = m.name.removesuffix("_total")
        names.add(base)
        if m.kind == "histogram":
            names.update({base + "_bucket", base + "_sum", base + "_count"})
    return names


def test_docs_and_dashboards_name_only_real_metrics(metrics: list[docsgen.MetricInfo]) -> None:
    known = _known_series(metrics)
    deploy = [p for p in (ROOT / "deploy").rglob("*") if p.suffix in (".yml", ".yaml")]
    sources = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md", *DASHBOARDS, *deploy]
    assert any(p.suffix == ".json" for p in sources), "no Grafana dashboard found"
    unknown = {f"{p.name}: {name}" for p in sources for name in METRIC_RE.findall(p.read_text())
               if name not in known and name not in NOT_METRICS}
    assert not unknown, f"docs/dashboards name metrics the code does not register: {sorted(unknown)}"


def test_every_option_the_code_reads_is_in_the_configuration_reference() -> None:
    text = (DOCS / "configuration.md").read_text()
    missing = [name for name in docsgen.options_in_code() if name not in text]
    assert not missing, f"options read by the code but absent from docs/configuration.md: {missing}"
    assert "**undocumented**" not in text, "an environment variable lacks a description in docsgen.ENV_DOCS"
    assert "Other sections" not in text.split(docsgen.BEGIN, 1)[1], (
        "a documented config dataclass has no place in docsgen.PLACEMENTS"
    )


def test_every_config_section_of_the_package_is_found() -> None:
    """The scan finds the sections the brief lists (guards the discovery itself)."""
    docsgen.import_all()
    found = {f"{c.__module__}.{c.__qualname__}" for c in docsgen.config_classes()}
    for name in ("litellm_kv.config.Settings", "litellm_kv.config.ModelGroupSettings",
                 "litellm_kv.routing.options.KVRoutingSettings", "litellm_kv.routing.cost.CostSettings",
                 "litellm_kv.routing.load.LoadSettings", "litellm_kv.routing.siblings.SiblingSettings"):
        assert name in found
    assert set(docsgen.policy_fields()) == set(docsgen.POLICY_MODULES)


def test_deployment_options_listed_exist_in_code() -> None:
    """The hand-kept model_info list names keys the code really reads (no stale entries)."""
    source = "\n".join(p.read_text() for p in docsgen.source_files() if p.name != "docsgen.py")
    for key in docsgen.DEPLOYMENT_OPTIONS:
        leaf = key.rsplit(".", 1)[1]
        assert f'"{leaf}"' in source, f"{key}: not read anywhere in litellm_kv/"


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK_RE.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = [t for t in _links(page) if not (page.parent / t.split("#", 1)[0]).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


@pytest.mark.parametrize("example", sorted((ROOT / "config" / "key-metadata").glob("*.json")), ids=lambda p: p.name)
def test_key_metadata_examples_pass_the_policy_parser(example: Path) -> None:
    from litellm_kv.governance import reasoning, vision_policy
    from litellm_kv.governance.policy import config_layer, metadata_layer

    metadata: dict[str, Any] = json.loads(example.read_text())
    features = set(metadata["litellm_kv"])
    assert features <= {"reasoning", "vision"}, features
    for feature, module in (("reasoning", reasoning), ("vision", vision_policy)):
        if feature not in features:
            continue
        key = metadata_layer(metadata, feature, where=f"key '{example.stem}'")
        cfg = config_layer({}, group="g", feature=feature)
        policy = module.resolve_policy(key, None, cfg, key_scope="key:x", team_scope=None)
        assert policy is not None
        # Every field of the example was understood (none silently ignored).
        assert set(metadata["litellm_kv"][feature]) <= set(module.POLICY_FIELDS)
