"""The axis names are listed in one module (:mod:`primus_optuna.spec.axes`): no other module spells a list of
them (a tuple, list, set or dict of axis names, class fields or function parameters named after the axes)."""

from __future__ import annotations

import ast
from pathlib import Path

from primus_optuna.spec.axes import AXES

PACKAGE = Path(__file__).resolve().parents[2] / "primus_optuna"
REGISTRY_MODULE = PACKAGE / "spec" / "axes.py"
ALL_BUT = 3
"""a rule, a physics term or a repair order reads some axes by name (``("tp", "cp", "pp", "mbs")`` derives dp);
one literal, class body or signature naming all the axes but this many (or fewer) is a list of the axes"""


def _axis_names(node: ast.AST) -> set[str]:
    """The axis names one literal, class body or signature spells."""
    names: list[str] = []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        names = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    elif isinstance(node, ast.Dict):
        names = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    elif isinstance(node, ast.ClassDef):
        names = [
            s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        ]
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names = [a.arg for a in node.args.args + node.args.kwonlyargs]
    return set(names) & set(AXES)


def offenders(root: Path = PACKAGE) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if path == REGISTRY_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = _axis_names(node)
            if len(names) >= len(AXES) - ALL_BUT:
                out.append(f"{path.relative_to(root.parent)}:{node.lineno}: {sorted(names)}")  # type: ignore[attr-defined]
    return out


def test_no_module_but_the_registry_lists_the_axes() -> None:
    assert offenders() == []


def test_the_check_finds_a_hand_written_list(tmp_path: Path) -> None:
    every = AXES[: len(AXES) - ALL_BUT]
    (tmp_path / "a.py").write_text(f"ORDER = {every!r}\n")
    (tmp_path / "b.py").write_text("class C:\n" + "".join(f"    {a}: int\n" for a in every))
    (tmp_path / "c.py").write_text(f"def f({', '.join(every)}):\n    pass\n")
    (tmp_path / "d.py").write_text(f"SOME = {AXES[: len(AXES) - ALL_BUT - 1]!r}\n")
    assert [o.split(":")[0] for o in offenders(tmp_path)] == [f"{tmp_path.name}/{m}.py" for m in "abc"]
