"""The OptunaHub package under hub/: laid out as a registry package and loadable with
``optunahub.load_local_module``; its example runs."""

import importlib.util
import re

import pytest
import yaml

from tests.conftest import ROOT

HUB = ROOT / "hub" / "package"
PACKAGE = HUB / "samplers" / "primus"


def test_registry_layout_and_front_matter():
    for name in ("__init__.py", "README.md", "LICENSE", "example.py"):
        assert (PACKAGE / name).is_file(), name
    front = re.match(r"^---\n(.*?)\n---\n", (PACKAGE / "README.md").read_text(), re.S)
    assert front, "README starts with the registry's front matter"
    meta = yaml.safe_load(front.group(1))
    assert {"author", "title", "description", "tags", "optuna_versions", "license"} <= set(meta)
    assert "sampler" in meta["tags"] and meta["license"] == "MIT License"
    assert (PACKAGE / "LICENSE").read_text().startswith("MIT License")
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()


def test_loads_with_optunahub_and_the_example_runs():
    optunahub = pytest.importorskip("optunahub")
    module = optunahub.load_local_module(package="samplers/primus", registry_root=str(HUB))
    assert {"PrimusSampler", "MemoryPrefilterPruner", "make_objective"} <= set(module.__all__)
    spec = importlib.util.spec_from_file_location("hub_example", PACKAGE / "example.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    study = example.main(n_trials=6)
    assert len(study.trials) == 6 and study.best_value > 0


REGISTRY_RUFF = HUB.parent / "ruff.toml"


def test_the_package_passes_the_registrys_ruff_settings():
    """Issue 39 item 8: hub/ruff.toml holds the registry's settings (optuna/optunahub-registry@039785eb
    pyproject.toml [tool.ruff]: isort force-single-line, two lines after imports, line length 99)."""
    import subprocess
    import sys

    pytest.importorskip("ruff")
    text = REGISTRY_RUFF.read_text()
    for setting in ("line-length = 99", "force-single-line = true", "lines-after-imports = 2"):
        assert setting in text
    files = sorted(str(p) for p in PACKAGE.glob("*.py"))
    for args in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
        run = subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--config", str(REGISTRY_RUFF), *files],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stdout + run.stderr


def test_requirements_name_an_installable_primus_optuna():
    """Issue 39 item 8: `primus-optuna` is not on the index; requirements.txt installs it from the checkout, as
    its README says (pip reads the path relative to the working directory: run in the package folder)."""
    import subprocess
    import sys

    lines = [
        ln.strip()
        for ln in (PACKAGE / "requirements.txt").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert "primus-optuna" not in lines  # the bare name the index does not have
    path = next(ln for ln in lines if ln.startswith("."))
    assert (PACKAGE / path / "pyproject.toml").is_file()
    assert 'name = "primus-optuna"' in (PACKAGE / path / "pyproject.toml").read_text()
    assert "pip install -r requirements.txt" in (PACKAGE / "README.md").read_text()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            path,
        ],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
    )
    assert "Would install primus-optuna" in run.stdout, run.stdout + run.stderr
