"""The hardware profile document (spec/profile.py) and ``cluster.profile`` in a study file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from primus_optuna.errors import SpecError
from primus_optuna.spec import StudySpec
from primus_optuna.spec.profile import HardwareProfile, load_profile
from tests.conftest import STUDIES
from tests.helpers.profiles import synthetic_profile


def write_study(tmp_path: Path, profile_value: object) -> Path:
    data = yaml.safe_load((STUDIES / "local-gpt-cpu.yaml").read_text())
    data["cluster"]["profile"] = profile_value
    path = tmp_path / "study" / "s.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_profile_path_is_read_relative_to_the_study_file(tmp_path: Path) -> None:
    HardwareProfile.model_validate(synthetic_profile(name="node-7")).save(
        tmp_path / "study" / "prof" / "p.yaml"
    )
    spec = StudySpec.from_yaml(write_study(tmp_path, "prof/p.yaml"))
    assert spec.cluster.profile is not None and spec.cluster.profile.device.name == "node-7"
    # the stored study (its JSON) carries the profile's content and loads again
    again = StudySpec.from_dict(spec.to_dict())
    assert again.cluster.profile == spec.cluster.profile


def test_a_missing_profile_names_the_field_and_calibrate(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as exc:
        StudySpec.from_yaml(write_study(tmp_path, "nowhere.yaml"))
    msg = str(exc.value)
    assert "cluster.profile" in msg and "primus-optuna calibrate" in msg


def test_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**synthetic_profile(), "schema_version": 2}))
    with pytest.raises(SpecError, match="schema_version 2 is not 1"):
        load_profile(path)


def test_a_bad_table_names_the_row(tmp_path: Path) -> None:
    data = synthetic_profile()
    data["gemm"][3]["seconds"] = -1
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=r"gemm\.3\.seconds"):
        load_profile(path)


def test_save_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = HardwareProfile.model_validate(synthetic_profile())
    out = tmp_path / "p.yaml"

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prof.save(out)
    assert list(tmp_path.iterdir()) == []  # neither the profile nor a temporary file
    monkeypatch.undo()
    prof.save(out)
    assert load_profile(out) == prof


def test_a_cpu_profile_for_a_gpu_cluster_is_a_warning(tmp_path: Path) -> None:
    """A CPU-measured profile on the CPU study says nothing; on an AMD/NVIDIA GPU it warns, naming calibrate."""
    assert (
        StudySpec.from_yaml(write_study(tmp_path, synthetic_profile(name="cpu x2"))).cluster.warnings() == []
    )
    data = yaml.safe_load(write_study(tmp_path, synthetic_profile(name="cpu x2")).read_text())
    data["cluster"]["gpu"] = "mi300x"
    (line,) = StudySpec.from_dict(data).cluster.warnings()
    assert line.startswith("cluster.profile: measured on cpu x2, not on the cluster's mi300x")
    assert "primus-optuna calibrate" in line
    on_gpu = synthetic_profile(name="MI300X", kind="cuda")
    data["cluster"]["profile"] = on_gpu
    assert StudySpec.from_dict(data).cluster.warnings() == []
