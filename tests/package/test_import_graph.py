"""The package's import graph has no cycles: every ``import`` / ``from ... import`` between primus_optuna
modules counts, also one inside a function or under ``TYPE_CHECKING`` (a lazy import hides a cycle, it does
not remove it)."""

import ast

from tests.conftest import ROOT

PACKAGE = ROOT / "primus_optuna"


def _modules() -> dict[str, object]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _edges(mods: dict[str, object]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here[: len(here) - (node.level - 1)] if node.level else []
                target = (
                    ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                )
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    out.add(full if full in mods else target)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        edges[name] = {m for m in out if m in mods and m != name}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_package_import_graph_has_no_cycles():
    edges = _edges(_modules())
    assert edges["primus_optuna.search.sampler"]  # the graph is read (sanity)
    assert _cycles(edges) == []


def test_the_detector_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
