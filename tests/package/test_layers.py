"""The layers import only downward (spec -> space -> physics -> search -> run -> record -> cli), and the
physics stays free of Optuna, DSPy, LiteLLM and torch (it estimates whole spaces in bulk; importing any of
them would cost seconds)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "primus_optuna"

RANK = {
    "errors": 0,
    "redaction": 0,
    "spec": 1,
    "space": 2,
    "physics": 3,
    "search": 4,
    "run": 5,
    "workloads": 5,
    "record": 6,
    "session": 6,
    "cli": 7,
}
"""The layer of each top-level module or subpackage; a module may import its own rank or lower."""

HEAVY = ("optuna", "dspy", "litellm", "torch", "matplotlib", "optuna_dashboard")
"""Libraries the spec, space and physics layers never import."""

LAZY_UPWARD = {("run/objective.py", "primus_optuna.record.storage")}
"""Upward imports inside a function that exist today (storage_runs_dir reads the storage's file path)."""


def _modules_in_sys_modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_physics_imports_no_optuna_dspy_litellm_or_torch() -> None:
    loaded = _modules_in_sys_modules_after("import primus_optuna.physics")
    assert "primus_optuna.physics.throughput" in loaded  # the import did happen
    assert sorted(m for m in loaded if m.split(".")[0] in HEAVY) == []


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module name, imported at module level) of every import in ``path``."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = list(rel[:-1])
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((name, id(node) in top))
    return out


def test_layers_import_only_downward() -> None:
    files = sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE or p.stem in RANK)
    assert {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in files} == set(RANK)
    wrong = []
    for path in files:
        rel = path.relative_to(PACKAGE)
        layer = rel.parts[0].removesuffix(".py")
        for name, at_top in _imports(path):
            parts = name.split(".")
            if parts[0] == "primus_optuna" and len(parts) > 1 and RANK.get(parts[1], -1) > RANK[layer]:
                if (rel.as_posix(), name) not in LAZY_UPWARD:
                    wrong.append(f"{rel}: {name} ({'module level' if at_top else 'in a function'})")
            if RANK[layer] <= RANK["physics"] and parts[0] in HEAVY:
                wrong.append(f"{rel}: {name} (the {layer} layer stays free of {', '.join(HEAVY)})")
    assert wrong == []
