"""``primus-optuna calibrate`` and :func:`primus_optuna.workloads.calibrate.calibrate` on this machine's CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from primus_optuna.cli import cli
from primus_optuna.spec import StudySpec
from primus_optuna.spec.profile import COLLECTIVES, load_profile
from primus_optuna.workloads import calibrate as calibrate_module
from primus_optuna.workloads.calibrate import study_shapes
from tests.conftest import STUDIES

LOCAL = STUDIES / "local-gpt-cpu.yaml"


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real, tiny calibration of this CPU (2 gloo processes), shared by the tests below."""
    out = tmp_path_factory.mktemp("calibrate") / "cpu.yaml"
    result = CliRunner().invoke(
        cli,
        [
            "calibrate",
            "--device",
            "cpu",
            "--budget-s",
            "3",
            "--study",
            str(LOCAL),
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    return out


def test_calibrate_cpu_writes_a_profile_with_gloo_collectives(cpu_profile: Path) -> None:
    prof = load_profile(cpu_profile)
    assert prof.schema_version == 1 and prof.device.kind == "cpu" and prof.device.count == 2
    assert prof.compute_dtype == "fp32" and prof.device.torch
    assert prof.gemm_points("fp32") and prof.attention and prof.memory
    assert prof.fitted.gemm["fp32"].points == len(prof.gemm_points("fp32")) and prof.fitted.memory is not None
    assert prof.allocator.applicable is False and "CPU" in prof.allocator.reason
    assert prof.op_overhead_us is not None and prof.op_overhead_us > 0
    coll = prof.collectives
    assert coll.backend == "gloo" and coll.ranks == 2
    measured = {p.op for p in coll.points}
    assert "all_reduce" in measured and all(p.ranks == 2 for p in coll.points)
    # every collective is either measured or recorded with the reason it was not
    assert measured | set(coll.unsupported) == set(COLLECTIVES)


def test_a_study_estimated_with_the_measured_profile(cpu_profile: Path, tmp_path: Path) -> None:
    text = LOCAL.read_text().replace(
        "  gpus_per_node: 2\n", f"  gpus_per_node: 2\n  profile: {cpu_profile}\n"
    )
    (tmp_path / "s.yaml").write_text(text)
    result = CliRunner().invoke(cli, ["estimate", str(tmp_path / "s.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["throughput"]["tokens_per_s_per_gpu"] > 0
    assert set(doc["measured"]) >= {"gemm", "attention", "memory"}
    text = CliRunner().invoke(cli, ["estimate", str(tmp_path / "s.yaml")]).output
    assert "gemm priced from hardware profile" in text


def test_study_shapes_are_the_layers_gemms_and_attention() -> None:
    gemms, grouped, attention = study_shapes(StudySpec.from_yaml(LOCAL))
    # hidden 128, 4 heads of 32, seq 128, ffn 512, vocab 1024; mbs 1, 4 and 8 of the candidates
    for mbs in (1, 4, 8):
        t = 128 * mbs
        assert {(t, 384, 128), (t, 128, 128), (t, 1024, 128)} <= set(gemms)
    assert grouped == []
    assert (128, 32, 4, 1) in attention


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cuda"], "torch sees no GPU"),
        (["--device", "cpu", "--out", "/nonexistent-dir/p.yaml"], "does not exist"),
        (["--device", "cpu", "--budget-s", "0"], "--budget-s"),
        (["--device", "cpu", "--study", "/nonexistent.yaml"], "not found"),
    ],
)
def test_bad_input_is_one_error_exit_2_and_nothing_written(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "p.yaml"
    argv = ["calibrate", "--out", str(out), *args] if "--out" not in args else ["calibrate", *args]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(calibrate_module, "calibrate", interrupted)
    result = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 130
    assert "interrupted" in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_ctrl_c_ends_a_forked_sibling_quietly(monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    """Ctrl-C reaches the whole process group: a CPU calibration's forked siblings end without a traceback
    (the parent alone says the calibration was interrupted)."""

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(calibrate_module, "_measure", interrupted)
    (proc,) = calibrate_module._start_siblings(1, (), None)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert "Traceback" not in capfd.readouterr().err
