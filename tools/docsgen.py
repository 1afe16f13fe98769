"""Generated reference pages: ``docs/configuration.md``, ``docs/metrics.md`` and the JSON Schema of key
and team metadata, ``docs/key-metadata.schema.json``.

The configuration reference is built from the code, never written by hand: every dataclass in
the package whose fields carry ``metadata["doc"]`` (see :func:`litellm_kv.config.doc`) is a
configuration section, the policy fields of the reasoning and vision features, the environment
variables the code reads, the per-deployment ``model_info`` keys and the command line. The
metrics reference lists every metric registered through :mod:`litellm_kv.observability` once
all modules are imported.

Each page keeps its hand-written prose; only the part between :data:`BEGIN` and :data:`END` is
replaced. Run ``python -m tools.docsgen`` to rewrite both pages, ``--check`` to fail when
they are out of date (what ``tests/repo/test_docs.py`` does).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import pkgutil
import re
import sys
import types
import typing
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "litellm_kv"
BEGIN = "<!-- BEGIN GENERATED (python -m tools.docsgen) -->"
END = "<!-- END GENERATED -->"

# Where each known configuration dataclass lives: (document, dotted path in that document).
# A documented dataclass missing here still appears (under "Other sections"), so a new
# feature section is never silently left out; add it here to give it its place.
PLACEMENTS: dict[str, tuple[str, str]] = {
    "litellm_kv.config.Settings": ("proxy", "litellm_kv"),
    "litellm_kv.config.RedisRoutingSettings": ("proxy", "litellm_kv.redis_routing"),
    "litellm_kv.config.ModelGroupSettings": ("proxy", "litellm_kv.model_groups.<group>"),
    "litellm_kv.config.BudgetSettings": ("proxy", "litellm_kv.budgets"),
    "litellm_kv.config.RedisSettings": ("proxy", "litellm_kv.redis"),
    "litellm_kv.config.RedisSentinelSettings": ("proxy", "litellm_kv.redis.sentinel"),
    "litellm_kv.routing.options.KVRoutingSettings": ("proxy", "litellm_kv.model_groups.<group>.kv"),
    "litellm_kv.routing.cost.CostSettings": ("proxy", "litellm_kv.model_groups.<group>.kv.cost"),
    "litellm_kv.routing.load.LoadSettings": ("proxy", "litellm_kv.model_groups.<group>.kv.load"),
    "litellm_kv.routing.siblings.SiblingSettings": ("proxy", "litellm_kv.model_groups.<group>.kv.siblings"),
    "litellm_kv.routing.ttft.TtftSettings": ("proxy", "litellm_kv.model_groups.<group>.kv.ttft"),
    "litellm_kv.routing.affinity.options.AffinitySettings": ("proxy", "litellm_kv.model_groups.<group>.affinity"),
    "litellm_kv.governance.reasoning.GroupReasoningSettings": ("proxy", "litellm_kv.model_groups.<group>.reasoning"),
    "litellm_kv.governance.vision_policy.GroupVisionSettings": ("proxy", "litellm_kv.model_groups.<group>.vision"),
    "litellm_kv.governance.vision_policy.FetchSettings": ("proxy", "litellm_kv.model_groups.<group>.vision.fetch"),
    # The indexer file has no top-level key; its errors name options "indexer.<path>", as here.
    "litellm_kv.services.indexer.config.IndexerSettings": ("indexer", "indexer"),
    "litellm_kv.services.indexer.config.IndexerGroupSettings": ("indexer", "indexer.model_groups.<group>"),
    "litellm_kv.services.indexer.config.IndexerReplicaSettings": ("indexer", "indexer.model_groups.<group>.replicas[]"),
    "litellm_kv.simulator.model.ThroughputModel": ("bench", "bench.model"),
}

DOCUMENTS: dict[str, tuple[str, str]] = {
    "proxy": (
        "The `litellm_kv:` section of the LiteLLM config.yaml",
        "Read by the proxy callback (`litellm_kv.integration.callback.proxy_handler`) from the file given to "
        "`litellm --config`, or from the file named by `LITELLM_KV_CONFIG`. Unknown keys and wrongly typed "
        "values stop the proxy with an error naming the option's path. Annotated example: "
        "[config/litellm.yaml](../config/litellm.yaml).",
    ),
    "indexer": (
        "`litellm-kv indexer --config FILE`",
        "The indexer's own YAML file (shared mode). Annotated example: [config/indexer.yaml](../config/indexer.yaml).",
    ),
    "bench": (
        "`litellm-kv bench replay`: the simulated engine",
        "Throughput model of each simulated replica (see docs/benchmarks.md).",
    ),
    "other": ("Other sections", "Documented dataclasses not yet placed in a document (add them to PLACEMENTS)."),
}

# Policy fields are read from key metadata, team metadata and the group's config section alike,
# by name (not through a dataclass), so their documentation lives here. A policy field without an
# entry makes the generator fail.
POLICY_MODULES: dict[str, str] = {
    "litellm_kv.governance.reasoning": "litellm_kv.model_groups.<group>.reasoning",
    "litellm_kv.governance.vision_policy": "litellm_kv.model_groups.<group>.vision",
}
_REASONING = "litellm_kv.governance.reasoning"
_VISION = "litellm_kv.governance.vision_policy"
POLICY_DOCS: dict[tuple[str, str], tuple[str, str]] = {
    # (module, field): (default, meaning)
    (_REASONING, "allowed"): ("true", "May the caller think at all. Strictest wins: false anywhere → off."),
    (_REASONING, "default_budget"): (
        "unset", "Thinking budget (tokens) applied when the caller asks for none; the most specific layer wins."),
    (_REASONING, "max_budget"): ("unset", "Most thinking tokens one request may use (smallest wins)."),
    (_REASONING, "over_max"): (
        "`clamp`", "A request asking for more than max_budget: `clamp` (lowered, response header says so) or "
        "`reject` (HTTP 400). `reject` anywhere wins."),
    (_REASONING, "tokens_per_day"): (
        "unset", "Reasoning tokens per UTC day. Key metadata bounds the key, team metadata the whole team, "
        "the config each key of the group. Spent → HTTP 429 with Retry-After."),
    (_REASONING, "tokens_per_week"): ("unset", "As tokens_per_day, per week starting Monday 00:00 UTC."),
    (_REASONING, "tokens_per_month"): ("unset", "As tokens_per_day, per calendar month (UTC)."),
    (_REASONING, "show_reasoning"): (
        "true", "May the caller see `reasoning_content`; false removes it from responses and stream chunks."),
    (_VISION, "max_images_per_request"): ("unset", "Most images in one request."),
    (_VISION, "max_visual_tokens_per_request"): (
        "unset", "Most visual tokens (all images of the request, counted with the group's family)."),
    (_VISION, "max_pixels_per_image"): (
        "unset", "Largest width × height of one image after the engine's own resizing."),
    (_VISION, "tokens_per_day"): (
        "unset", "Visual tokens per UTC day (key, team or per key of the group, as for reasoning). "
        "Spent → HTTP 429 with Retry-After."),
    (_VISION, "tokens_per_week"): ("unset", "Visual tokens per week (from Monday, UTC)."),
    (_VISION, "tokens_per_month"): ("unset", "Visual tokens per calendar month (UTC)."),
    (_VISION, "over_limit"): (
        "`reject`", "Over a per-request limit: `reject` (HTTP 400 naming the limit, the value and where it was "
        "set) or `downscale` (vLLM deployments get `mm_processor_kwargs.max_pixels`). `reject` anywhere wins."),
}

# Environment variables the code reads (found by scanning the sources, see env_vars_in_code).
ENV_DOCS: dict[str, str] = {
    "LITELLM_KV_CONFIG": "Path of a YAML file holding the litellm-kv settings (a LiteLLM config with a "
    "`litellm_kv:` key, or the bare section). Default: the config file the proxy was started with.",
    "LITELLM_KV_REDIS_URL": "Redis URL used when `litellm_kv.redis_url` is not set.",
    "LITELLM_KV_SALT_SECRET": "Secret for the per-tenant `cache_salt` HMAC (`kv.tenant_isolation`). The name "
    "of the variable is itself configurable (`litellm_kv.salt_secret_env`). Required while a group has "
    "isolation on: unset, empty or a shipped placeholder stops the proxy from starting. Keep it stable: "
    "changing it changes every salt and so empties every tenant's reusable cache.",
    "LITELLM_KV_INDEXER_TOKEN": "Bearer token of the indexer's HTTP API (`indexer.api_token_env` names the "
    "variable). Required when the indexer binds an address other than loopback; `docker-compose.yml` has no "
    "default for it.",
    "LITELLM_KV_DOCTOR_KEY": "`litellm-kv doctor`: the virtual key to check when `--key` is not given (keeps "
    "the key out of the command line and shell history).",
    "LITELLM_MASTER_KEY": "LiteLLM's master key; `litellm-kv doctor` reads key and team info with it when "
    "`--admin-key` is not given.",
    "LITELLM_BUILTIN_PASS_THROUGH_ROUTES_FIRST": "LiteLLM's own: `true` puts its pass-through routes ahead of its "
    "other routes. The pass-through gate then also checks `/openai/deployments/{model}/chat/completions` and the "
    "`/openai/v1/responses` routes, which that order hands to the `/openai/` pass-through (docs/security.md).",
    "CONFIG_FILE_PATH": "LiteLLM's own variable for its config file; read when the proxy module does not "
    "expose the path it was started with.",
    "LITELLM_KV_ALLOW_UNTESTED_LITELLM": "Set to 1 to load the callback over a LiteLLM release litellm-kv is not "
    "tested with (a warning instead of the start-up error naming the tested version; docs/install.md). "
    "Unsupported.",
    "TIKTOKEN_CACHE_DIR": "Where tiktoken finds its encodings. When unset, the affinity token meter points it "
    "at the files shipped inside the litellm wheel (works offline).",
}

# Per-deployment keys read from a deployment's model_info (LiteLLM model_list entries).
DEPLOYMENT_OPTIONS: dict[str, str] = {
    "model_info.id": "Deployment id (LiteLLM's). litellm-kv reports decisions, pins and metrics by it; set it "
    "explicitly so ids survive config reloads.",
    "model_info.litellm_kv.kv_events_endpoint": "KV-event endpoint of this replica for embedded mode "
    "(default: discovered from the replica's `GET /kv_event_sources`).",
    "model_info.litellm_kv.replay_endpoint": "Replay endpoint of this replica (default: discovered).",
    "model_info.litellm_kv.topic": "KV-event topic (default: discovered).",
    "model_info.litellm_kv.bind": "Bind the subscriber socket (engine publisher given a concrete tcp://host:port).",
    "model_info.affinity_ttl_seconds": "Pin TTL of this deployment (overrides `affinity.ttl_seconds`).",
    "model_info.affinity_max_in_flight": "Load cap of this deployment (overrides `affinity.max_in_flight`).",
}

_ENV_PATTERNS = (
    re.compile(r"""os\.environ\.get\(\s*["']([A-Z][A-Z0-9_]+)["']"""),
    re.compile(r"""os\.getenv\(\s*["']([A-Z][A-Z0-9_]+)["']"""),
    re.compile(r"""os\.environ\[\s*["']([A-Z][A-Z0-9_]+)["']\s*\]"""),
    re.compile(r"""["']([A-Z][A-Z0-9_]+)["']\s+(?:not\s+)?in\s+os\.environ"""),
    re.compile(r"""^[A-Z_]*ENV\s*=\s*["']([A-Z][A-Z0-9_]+)["']""", re.M),
    re.compile(r"""_env\b[^=\n]*=\s*doc\([^)]*?default=["']([A-Z][A-Z0-9_]+)["']""", re.S),
)


# -- discovery ------------------------------------------------------------------------------------
def import_all() -> list[str]:
    """Import every module of the package (so every metric and section is declared)."""
    # LiteLLM fetches its price map over the network at import unless told to use its local copy.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm_kv

    names = []
    for info in pkgutil.walk_packages(litellm_kv.__path__, "litellm_kv."):
        importlib.import_module(info.name)
        names.append(info.name)
    return names


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def config_classes() -> list[type]:
    """Every dataclass defined in the package with at least one documented field."""
    found: dict[str, type] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "litellm_kv" or name.startswith("litellm_kv.")):
            continue
        for obj in vars(module).values():
            if (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == name
                    and any("doc" in f.metadata for f in dataclasses.fields(obj))):
                found[_qualname(obj)] = obj
    return [found[k] for k in sorted(found)]


@dataclass(frozen=True, slots=True)
class Section:
    document: str
    path: str
    cls: type


def sections() -> list[Section]:
    out = []
    for cls in config_classes():
        document, path = PLACEMENTS.get(_qualname(cls), ("other", _qualname(cls)))
        out.append(Section(document, path, cls))
    order = {k: i for i, k in enumerate(PLACEMENTS)}
    return sorted(out, key=lambda s: (list(DOCUMENTS).index(s.document), order.get(_qualname(s.cls), 1 << 30),
                                      s.path))


def policy_fields() -> dict[str, tuple[str, ...]]:
    """Module -> its POLICY_FIELDS, for every imported package module that defines some."""
    out = {}
    for name, module in sorted(sys.modules.items()):
        fields = getattr(module, "POLICY_FIELDS", None) if name.startswith("litellm_kv.") else None
        # Only the module that defines the tuple, not those importing it.
        if isinstance(fields, tuple) and re.search(r"^POLICY_FIELDS\b[^=\n]*=", _source(module), re.M):
            out[name] = fields
    return out


def _source(module: types.ModuleType) -> str:
    path = getattr(module, "__file__", None)
    return Path(path).read_text() if path else ""


def source_files() -> Iterator[Path]:
    yield from sorted(PACKAGE_DIR.rglob("*.py"))


def env_vars_in_code() -> dict[str, list[str]]:
    """Environment variable -> modules reading it (from the package sources)."""
    out: dict[str, list[str]] = {}
    for path in source_files():
        if path.name == "docsgen.py":
            continue
        text = path.read_text()
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for pattern in _ENV_PATTERNS:
            for name in pattern.findall(text):
                if name.startswith("LITELLM_LOCAL_"):
                    continue
                mods = out.setdefault(name, [])
                if module not in mods:
                    mods.append(module)
    return dict(sorted(out.items()))


# -- rendering helpers ----------------------------------------------------------------------------
def _type_text(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin in (list, tuple):
        return f"list[{_type_text(args[0]) if args else 'any'}]"
    if origin is dict:
        return f"map[{_type_text(args[0])} → {_type_text(args[1])}]" if args else "map"
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return f"section `{tp.__name__}`"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def _value_text(value: Any) -> str:
    if value is None:
        return "null"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "(section defaults)"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e4:
        return f"{int(value):_}".replace("_", " ") + ".0"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1e4:
        return f"{value:_}".replace("_", " ")
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "…"


def _default_text(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{_value_text(f.default)}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{_value_text(f.default_factory())}`"
    return "**required**"


def _cell(text: str) -> str:
    # reST literals (``x``) in docstrings become Markdown code; pipes would end the table cell.
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


def _anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", path.lower()).replace(" ", "-")


# -- configuration.md -----------------------------------------------------------------------------
def render_configuration() -> str:
    """The generated part of docs/configuration.md."""
    import_all()
    secs = sections()
    policies = policy_fields()
    missing = [f"{m}.{f}" for m, fields in policies.items() for f in fields if (m, f) not in POLICY_DOCS]
    if missing:
        raise RuntimeError(f"policy fields without documentation in docsgen.POLICY_DOCS: {missing}")
    unplaced = [m for m in policies if m not in POLICY_MODULES]
    if unplaced:
        raise RuntimeError(f"modules with POLICY_FIELDS missing from docsgen.POLICY_MODULES: {unplaced}")
    by_path = {s.cls: s.path for s in secs}
    lines: list[str] = []
    for document, (title, intro) in DOCUMENTS.items():
        in_doc = [s for s in secs if s.document == document]
        if not in_doc:
            continue
        lines += [f"## {title}", "", intro, ""]
        for s in in_doc:
            lines += _render_section(s, by_path)
            for module, path in POLICY_MODULES.items():
                if path == s.path and module in policies:
                    lines += _render_policy(module, policies[module])
    lines += _render_deployment_options()
    lines += _render_env()
    lines += _render_cli()
    return "\n".join(lines).rstrip() + "\n"


def _render_section(s: Section, by_path: dict[type, str]) -> list[str]:
    cls = s.cls
    doc = _cell((cls.__doc__ or "").strip().split("\n\n")[0])
    hints = typing.get_type_hints(cls)
    lines = [f"### `{s.path}`", "", f"{doc} (`{_qualname(cls)}`)", "",
             "| option | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if "doc" not in f.metadata:
            continue
        tp = hints.get(f.name, Any)
        type_text = _type_text(tp)
        nested = _nested_dataclass(tp)
        # A raw mapping parsed later by a feature's own dataclass links to it by path.
        target = by_path.get(nested) if nested is not None else None
        if target is None and f"{s.path}.{f.name}" in by_path.values():
            target = f"{s.path}.{f.name}"
        if target is not None:
            type_text += f" (see [`{target}`](#{_anchor(target)}))"
        lines.append(f"| `{f.name}` | {_cell(type_text)} | {_cell(_default_text(f))} | {_cell(f.metadata['doc'])} |")
    lines.append("")
    return lines


def _nested_dataclass(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    for arg in typing.get_args(tp):
        found = _nested_dataclass(arg)
        if found is not None:
            return found
    return None


def _render_policy(module: str, fields: Sequence[str]) -> list[str]:
    lines = [
        f"Policy fields of the same section (also settable per key and per team in metadata under "
        f"`litellm_kv.{POLICY_MODULES[module].rsplit('.', 1)[1]}`; the strictest value applies — see "
        "[key-metadata.md](key-metadata.md)):", "",
        "| policy field | default | meaning |", "|---|---|---|",
    ]
    for name in fields:
        default, meaning = POLICY_DOCS[(module, name)]
        lines.append(f"| `{name}` | {default} | {_cell(meaning)} |")
    lines.append("")
    return lines


def _render_deployment_options() -> list[str]:
    lines = ["## Per-deployment options (`model_list[].model_info`)", "",
             "| key | meaning |", "|---|---|"]
    lines += [f"| `{k}` | {_cell(v)} |" for k, v in DEPLOYMENT_OPTIONS.items()]
    return [*lines, ""]


def _render_env() -> list[str]:
    lines = ["## Environment variables", "", "| variable | read by | meaning |", "|---|---|---|"]
    for name, modules in env_vars_in_code().items():
        meaning = ENV_DOCS.get(name, "**undocumented** (add it to docsgen.ENV_DOCS)")
        lines.append(f"| `{name}` | {', '.join(f'`{m}`' for m in modules)} | {_cell(meaning)} |")
    return [*lines, ""]


def _render_cli() -> list[str]:
    try:
        from litellm_kv.cli import build_parser
    except ImportError:
        return []
    parser = build_parser()
    lines = ["## Command line (`litellm-kv`)", ""]
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in sorted(action.choices.items()):
            lines += [f"### `litellm-kv {name}`", "", _cell(sub.description or helps.get(name, "")), "",
                      "| flag | default | meaning |", "|---|---|---|"]
            for opt in sub._actions:
                if isinstance(opt, argparse._HelpAction):
                    continue
                flags = ", ".join(f"`{o}`" for o in opt.option_strings) or f"`{opt.dest}`"
                default = "**required**" if opt.required else f"`{_value_text(opt.default)}`"
                lines.append(f"| {flags} | {default} | {_cell(opt.help or '')} |")
            lines.append("")
    return lines


def options_in_code() -> list[str]:
    """Every option name the code reads (fields of the sections, policy fields, env vars)."""
    import_all()
    names = [f"`{f.name}`" for s in sections() for f in dataclasses.fields(s.cls) if "doc" in f.metadata]
    names += [f"`{f}`" for fields in policy_fields().values() for f in fields]
    names += [f"`{v}`" for v in env_vars_in_code()]
    return names


# -- metrics.md -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MetricInfo:
    name: str  # as Prometheus exposes it
    kind: str
    labels: tuple[str, ...]
    help: str
    module: str


def metrics() -> list[MetricInfo]:
    """Every metric declared through litellm_kv.observability, after importing every module."""
    import_all()
    from litellm_kv import observability

    sources = {p: p.read_text() for p in source_files()}
    out = []
    for full, metric in observability._declared.items():
        kind = getattr(metric, "_type", "unknown")
        short = full.removeprefix(observability.PREFIX)
        module = next((".".join(p.relative_to(ROOT).with_suffix("").parts) for p, text in sources.items()
                       if re.search(rf"""["']{re.escape(short)}["']""", text)), "?")
        shown = full + "_total" if kind == "counter" else full
        out.append(MetricInfo(shown, kind, tuple(getattr(metric, "_labelnames", ())),
                              getattr(metric, "_documentation", ""), module))
    return sorted(out, key=lambda m: (m.module, m.name))


def render_metrics() -> str:
    """The generated part of docs/metrics.md: one table per defining module."""
    lines: list[str] = []
    module = None
    for m in metrics():
        if m.module != module:
            module = m.module
            lines += ["", f"### `{module}`", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        name = m.name + ("`<br>`_bucket, _sum, _count" if m.kind == "histogram" else "")
        labels = ", ".join(f"`{x}`" for x in m.labels) or "—"
        lines.append(f"| `{name}` | {m.kind} | {labels} | {_cell(m.help)} |")
    return "\n".join(lines).strip() + "\n"


# -- writing --------------------------------------------------------------------------------------
PAGES: dict[str, tuple[str, Any]] = {
    "docs/configuration.md": ("# Configuration reference\n", render_configuration),
    "docs/metrics.md": ("# Metrics reference\n", render_metrics),
}
#: Whole generated files (no hand-written part): the JSON Schema of the ``litellm_kv`` key/team metadata.
SCHEMA_FILE = "docs/key-metadata.schema.json"


def render_metadata_schema() -> str:
    from litellm_kv.governance.metadata import metadata_json_schema

    return json.dumps(metadata_json_schema(), indent=2, ensure_ascii=False) + "\n"


def splice(current: str | None, title: str, generated: str) -> str:
    """``current`` with its generated block replaced (or a new page around ``generated``)."""
    block = f"{BEGIN}\n\n{generated.strip()}\n\n{END}"
    if current is None or BEGIN not in current or END not in current:
        return f"{title}\n{block}\n"
    head, rest = current.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block + tail


def outdated(root: Path = ROOT, pages: Iterable[str] = PAGES) -> list[str]:
    """The pages whose generated block differs from what the code produces now."""
    stale = []
    for rel in pages:
        title, render = PAGES[rel]
        path = root / rel
        current = path.read_text() if path.exists() else None
        if current is None or splice(current, title, render()) != current:
            stale.append(rel)
    schema = root / SCHEMA_FILE
    if not schema.exists() or schema.read_text() != render_metadata_schema():
        stale.append(SCHEMA_FILE)
    return stale


def write(root: Path = ROOT, pages: Iterable[str] = PAGES) -> list[str]:
    written = []
    for rel in pages:
        title, render = PAGES[rel]
        path = root / rel
        current = path.read_text() if path.exists() else None
        new = splice(current, title, render())
        if new != current:
            path.write_text(new)
            written.append(rel)
    schema = root / SCHEMA_FILE
    text = render_metadata_schema()
    if not schema.exists() or schema.read_text() != text:
        schema.write_text(text)
        written.append(SCHEMA_FILE)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.docsgen", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated page is out of date")
    ap.add_argument("--stdout", choices=["configuration", "metrics"], help="print one reference instead")
    args = ap.parse_args(argv)
    if args.stdout:
        print(render_configuration() if args.stdout == "configuration" else render_metrics(), end="")
        return 0
    if args.check:
        stale = outdated()
        for rel in stale:
            print(f"{rel} is out of date: run python -m tools.docsgen", file=sys.stderr)
        return 1 if stale else 0
    for rel in write():
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
