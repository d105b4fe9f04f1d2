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
