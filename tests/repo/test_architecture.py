"""The package's import arrows, checked from the source: each package imports only the layers below it,
no module imports itself back through others, and only the LiteLLM adapter imports LiteLLM.

The rules are the table at the top of docs/architecture.md; ``test_docs_table_states_the_rules`` keeps the
two in step, so the page a newcomer reads is the rule the build enforces.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "litellm_kv"

# Unit -> units it may import (besides itself). A unit is a sub-package or a top-level module of litellm_kv.
BASE = ("config", "errors", "observability", "tasks", "retire", "redis_client", "redis_eviction")
RULES: dict[str, tuple[str, ...]] = {
    "errors": (),
    "retire": (),
    "tasks": (),
    "observability": (),
    "addresses": (),
    "config": ("errors",),
    "redis_client": ("observability",),
    "redis_eviction": ("observability", "redis_client"),
    "index": ("errors", "observability", "tasks", "retire", "redis_client"),
    "vllm": ("index", *BASE),
    "routing": ("vllm", "index", *BASE),
    "governance": ("vllm", *BASE),
    "services": ("routing", "vllm", "index", *BASE),
    "simulator": ("routing", "vllm", "index", *BASE),
    "doctor": ("routing", "governance", "vllm", "index", "addresses", *BASE),
    "integration": ("routing", "governance", "vllm", "index", "addresses", *BASE),
    "cli": ("services", "simulator", "doctor", *BASE),
    # Compatibility paths of the public API (thin re-exports).
    "hashing": ("vllm",),
    "events": ("vllm",),
    "vision": ("governance",),
}
MAY_IMPORT_LITELLM = {"integration"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module this file imports, wherever the import statement stands (TYPE_CHECKING included)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            out.add(base)
            # `from litellm_kv.governance import reasoning` imports a module, not a name.
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path) if m in modules and m != name}
    return graph


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_unit_has_a_rule() -> None:
    units = {_unit(m) for m in _graph()} - {""}
    assert units <= set(RULES), f"packages or modules with no import rule: {sorted(units - set(RULES))}"


def test_imports_run_one_way() -> None:
    bad = []
    for module, deps in sorted(_graph().items()):
        unit = _unit(module)
        for dep in sorted(deps):
            target = _unit(dep)
            if target and target != unit and target not in RULES.get(unit, ()):
                bad.append(f"{module} -> {dep}")
    assert not bad, "imports against the layer rules (docs/architecture.md):\n" + "\n".join(bad)


def test_no_import_circle() -> None:
    graph = _graph()
    # Parent packages are imported implicitly with their children; only explicit edges count here.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import circles: {cycles}"


def test_only_the_adapter_imports_litellm() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if _unit(module) in MAY_IMPORT_LITELLM:
            continue
        for dep in _imports(path):
            if dep == "litellm" or dep.startswith("litellm."):
                bad.append(f"{module} imports {dep}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The import reader is not blind: a relative import, a function-level import and a TYPE_CHECKING
    import are all seen."""
    sample = tmp_path / "litellm_kv" / "routing" / "sample.py"
    sample.parent.mkdir(parents=True)
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "from ..integration import callback\n"
        "def f():\n    import litellm\n"
        "if TYPE_CHECKING:\n    from litellm_kv.governance.policy import Limit\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = _imports(sample)
    finally:
        ROOT = saved
    assert {"litellm_kv.integration.callback", "litellm", "litellm_kv.governance.policy"} <= found


def test_docs_table_states_the_rules() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows: dict[str, set[str]] = {}
    for line in text.split("## Request path")[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        deps = {u.strip("/").removesuffix(".py") for u in re.findall(r"`([\w/.]+)`", cells[2])}
        for unit in re.findall(r"`([\w/.]+)`", cells[0]):
            rows[unit.strip("/").removesuffix(".py")] = deps
    missing = set(RULES) - set(rows)
    assert not missing, f"docs/architecture.md has no row for {sorted(missing)}"
    wrong = {u: (sorted(rows[u]), sorted(RULES[u])) for u in RULES if rows[u] != set(RULES[u])}
    assert not wrong, f"docs/architecture.md states other import rules than the code enforces: {wrong}"
