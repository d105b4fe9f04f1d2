"""The report, notes and export of a real small `primus-optuna run` (analytical runner, no LLM)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna_dashboard import get_note

from primus_optuna.cli import cli
from primus_optuna.record.export import parse_export, study_spec
from primus_optuna.record.report import build_report, load_record

pytest.importorskip("primus_optuna.physics.throughput")

STUDY = Path(__file__).resolve().parents[2] / "studies" / "qwen3-30b-a3b-h200-bf16.yaml"


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[str, str, Path]:
    tmp = tmp_path_factory.mktemp("run")
    storage = f"sqlite:///{tmp / 'q.db'}"
    r = CliRunner().invoke(
        cli, ["run", str(STUDY), "--storage", storage, "--n-trials", "14", "--no-llm", "--no-progress"]
    )
    assert r.exit_code == 0, r.output
    return storage, r.output, tmp


def test_run_prints_where_the_report_goes(ran) -> None:
    storage, output, tmp = ran
    # next to the storage, where `report` without --out writes it (and scripts/run.sh's runs/ folder)
    assert f"report: {tmp / 'q-report'}/report.html" in output


def test_report_of_a_real_run(ran) -> None:
    storage, _, tmp = ran
    paths = build_report(storage, None, tmp / "report")
    md = paths["md"].read_text()
    study = optuna.load_study(study_name="qwen3-30b-a3b-h200-bf16", storage=storage)
    rec = load_record(storage)
    assert len(rec.trials) == len(study.trials) == 14
    best = study.best_trial
    assert f"**Best configuration**: trial {best.number}, `{best.user_attrs['config_key']}`" in md
    assert f"{best.value:.1f} tokens/s/GPU (" in md and "TFLOP/s/GPU, MFU" in md and "(analytical)" in md
    # the analytical runner measures nothing: said so, not an empty table
    assert "nothing to compare yet" in md
    # sensitivity from the analytical models: a verdict and one row per neighbour
    assert "Verdict: **not available" not in md
    section = md.split("### Sensitivity", 1)[1].split("## 8.", 1)[0]
    assert section.count("\n| ") >= 4
    # every swept axis has its table
    axes = {t.user_attrs.get("sweep_axis") for t in study.trials} - {None, "baseline"}
    for axis in axes:
        assert f"### Axis {axis}" in md


def test_notes_written_during_the_run(ran) -> None:
    storage, _, _ = ran
    study = optuna.load_study(study_name="qwen3-30b-a3b-h200-bf16", storage=storage)
    assert "**Best**: trial" in get_note(study)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    for t in done:
        note = get_note(optuna.trial.Trial(study, t._trial_id))
        assert f"## Trial {t.number}" in note and "### Step-time breakdown" in note
        # the rationale in full, wrapped to the dashboard's note pane
        assert " ".join(t.user_attrs["rationale"].split()) in " ".join(note.split())


def test_export_of_a_real_run(ran) -> None:
    storage, _, _ = ran
    r = CliRunner().invoke(cli, ["export", "--storage", storage, "--format", "megatron"])
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="qwen3-30b-a3b-h200-bf16", storage=storage)
    config = parse_export(r.output, "megatron", study_spec(study))
    assert config.key() == study.best_trial.user_attrs["config_key"]
