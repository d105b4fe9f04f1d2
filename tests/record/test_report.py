"""The audit report: every section, with numbers equal to what storage holds."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import optuna
import pytest

from primus_optuna.record.report import build_report, fmt_gib, fmt_pct, fmt_tok, load_record
from primus_optuna.redaction import redact
from tests.helpers.recorded_study import FALLBACK_WHY, SENTINEL_KEY, make_study

SECTIONS = (
    "## 1. Executive summary",
    "## 2. Setup",
    "## 3. Sweep phase",
    "## 4. Planner phase",
    "## 5. Memory filter",
    "## 6. Estimates vs measurements",
    "## 7. Result",
    "## 8. Plots",
    "## 9. All trials",
)


def _row(md: str, first_cell: str) -> list[str]:
    """Cells of the All-trials table row for trial ``first_cell``."""
    table = md.split("## 9. All trials", 1)[1]
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell}")


def test_report_sections_and_numbers(small_study, tmp_path: Path) -> None:
    storage, study = small_study
    paths = build_report(storage, "small", tmp_path / "out")
    md = paths["md"].read_text()
    html = paths["html"].read_text()
    for s in SECTIONS:
        assert s in md
        assert s.removeprefix("## ") in html
    # every trial's state, value, estimate and peak memory as stored
    for t in study.get_trials():
        cells = _row(md, str(t.number))
        assert cells[1] == t.state.name
        assert cells[4] == fmt_tok(t.value)
        assert cells[5] == fmt_tok(t.user_attrs["estimate_tokens_per_s_per_gpu"])
        assert (
            cells[6] == fmt_gib(t.user_attrs["memory_peak_gib"]) + " est."
        )  # no measured peak: the estimate
    # estimates vs measurements: mean and median of the stored estimate_error
    errs = [t.user_attrs["estimate_error"] for t in study.trials if t.state.name == "COMPLETE"]
    assert f"Mean estimate_error **{fmt_pct(statistics.fmean(errs))}**" in md
    assert f"median **{fmt_pct(statistics.median(errs))}**" in md
    assert "optimistic" in md
    # memory filter: GPU-hours = step time (from the estimate) x steps (train_iters=20) x 8 GPUs
    mem = [t for t in study.trials if t.user_attrs.get("prune_reason", "").startswith("memory")]
    step = [256 * 4096 / (t.user_attrs["estimate_tokens_per_s_per_gpu"] * 8) for t in mem]
    hours = sum(s * 20 * 8 / 3600 for s in step)
    assert f"GPU-hours not spent: {hours:.2f}" in md
    assert mem[0].user_attrs["prune_reason"] in md
    # planner: each round (transcript artifact), accepted and rejected candidates with reasons, tokens and
    # cost, the failed call, fallback trials and why, LLM usage totals
    assert "### Round 1 (before trial 5, openai/test-model)" in md
    assert "2 accepted, 1 rejected; tokens 2000, cost $0.0100" in md
    assert "| tp=3 | rejected | illegal: tp=3 does not divide 32 heads | odd TP |" in md
    assert "| mbs=4, moe_dispatcher=deepep | accepted |  | DeepEP with MBS 4 |" in md
    assert "**Error, fell back**: LMTimeoutError: request timed out" in md
    assert f"Fallback trials by reason: {FALLBACK_WHY}: 2." in md
    assert "2 calls (0 with no answer, 0 unparseable), 3456 tokens, $0.0123" in md
    # result: best trial and gain over the baseline (trial 0)
    best, base = study.best_trial, study.trials[0]
    assert f"**Best configuration**: trial {best.number}" in md
    assert f"objective {fmt_pct(best.value / base.value - 1)}" in md
    est = (
        best.user_attrs["estimate_tokens_per_s_per_gpu"] / base.user_attrs["estimate_tokens_per_s_per_gpu"]
        - 1
    )
    assert f"estimated {fmt_pct(est)}" in md
    assert "### Sensitivity" in md and "Verdict:" in md
    # sweep: one table per swept axis, the pruned mbs=8 point with its outcome
    assert "### Axis mbs" in md and "### Axis tp" in md and "### Axis recompute" in md
    assert "### Axis mbs" in md and "| 8 | 2 |" in md  # the swept value
    # plots: PNGs beside the Markdown, embedded in the HTML
    assert {p.name for p in paths["plots"].iterdir()} >= {
        "history.png",
        "axis_effects.png",
        "estimate_vs_measured.png",
    }
    assert html.count("data:image/png;base64,") >= 3 and "plots/" not in html
    # reproduce command and the study file beside it
    assert "primus-optuna run study.yaml" in md and paths["study"].is_file()
    # in a fresh study (this one's storage and name would resume it), as many trials as this one holds
    n = len(study.trials)
    assert f"--storage sqlite:///reproduce.db --study-name small-reproduce --n-trials {n} " in md


def test_report_never_contains_the_api_key(small_study, tmp_path: Path) -> None:
    storage, study = small_study
    study.set_user_attr("llm_note", f"leaked {SENTINEL_KEY}")
    trial = study.ask()
    trial.set_user_attr("rationale", f"the key is {SENTINEL_KEY}")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    out = tmp_path / "report"
    paths = build_report(storage, "small", out)
    for p in out.rglob("*"):
        if p.is_file():
            assert SENTINEL_KEY.encode() not in p.read_bytes(), p
    assert redact(f"x {SENTINEL_KEY} y") == "x [redacted] y"
    assert paths["md"].is_file()


def test_report_on_empty_study(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'e.db'}"
    study = make_study(storage, name="full")
    empty = optuna.create_study(study_name="empty", storage=storage)
    empty.set_user_attr("primus_spec", study.user_attrs["primus_spec"])
    md = build_report(storage, "empty", tmp_path / "r")["md"].read_text()
    for s in SECTIONS:
        assert s in md
    assert "No sweep trial has run yet." in md
    assert "No completed trial yet: no best configuration." in md
    assert "The study has no trial yet." in md


def test_report_pareto(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'm.db'}"
    study = make_study(storage, multi=True)
    paths = build_report(storage, "small", tmp_path / "r")
    md = paths["md"].read_text()
    front = sorted(study.best_trials, key=lambda t: -t.values[0])
    rec = load_record(storage, "small")
    assert [t.number for t in rec.pareto()] == [t.number for t in front]
    section = md.split("### Pareto front", 1)[1].split("###", 1)[0]
    rows = re.findall(r"^\| (\d+) \|", section, flags=re.M)
    assert [int(r) for r in rows] == [t.number for t in front]
    assert (paths["plots"] / "pareto_front.png").is_file()


def test_non_primus_study_is_a_user_error(tmp_path: Path) -> None:
    from primus_optuna.errors import SpecError

    storage = f"sqlite:///{tmp_path / 'x.db'}"
    optuna.create_study(study_name="plain", storage=storage)
    with pytest.raises(SpecError, match="not created by primus-optuna"):
        build_report(storage, "plain", tmp_path)


def test_report_shows_the_running_calibration(small_study, tmp_path: Path) -> None:
    from primus_optuna.physics.calibration import Calibration
    from primus_optuna.physics.throughput import estimate_throughput
    from primus_optuna.record.export import study_spec, trial_config
    from primus_optuna.search.fallback import corrected_tps

    storage, study = small_study
    spec = study_spec(study)
    done = [
        t
        for t in study.trials
        if t.state.name == "COMPLETE" and t.user_attrs.get("measured_tokens_per_s_per_gpu")
    ]
    pairs = [
        (estimate_throughput(spec, trial_config(t, spec)), t.user_attrs["measured_tokens_per_s_per_gpu"])
        for t in done
    ]
    cal = Calibration.fit(pairs)
    study.set_user_attr("calibration", cal.to_dict())
    md = build_report(storage, "small", tmp_path / "out")["md"].read_text()
    assert f"fitted on {cal.n_trials} measured trials" in md
    after = statistics.fmean(abs(corrected_tps(e, cal) / m - 1.0) for e, m in pairs)
    assert f"mean absolute error on these trials (in-sample) is {fmt_pct(after)}" in md


def test_sweep_tables_show_the_swept_value_around_a_moved_centre(tmp_path):
    """A centre that moved from the baseline (tp 1→2): the axis tables name the swept value, not every
    difference from the baseline."""
    from primus_optuna.record.report import load_record, render
    from tests.helpers.recorded_study import make_study

    url = f"sqlite:///{tmp_path / 'c.db'}"
    make_study(url)
    rec = load_record(url, "small")
    for t in rec.trials:
        if t.phase == "sweep" and t.config is not None and t.attr("sweep_axis") != "tp":
            t.config = t.config.replace(tp=2)
    sweep = render(rec).markdown().split("Sweep phase")[1].split("\n## ")[0]
    mbs = sweep.split("### Axis mbs")[1].split("\n###")[0]
    assert "| 4 | 1 |" in mbs and "tp=2" not in mbs
    assert "vs the sweep centre" in mbs


def test_report_has_the_capacity_plan_when_the_study_names_targets(tmp_path: Path) -> None:
    from primus_optuna.spec import StudySpec
    from tests.conftest import small_dense_study

    storage = f"sqlite:///{tmp_path / 'c.db'}"
    data = small_dense_study()
    data["capacity"] = {"gpus": [8, 16], "gpu": ["h100", "a100-80gb"], "tokens": "100B", "days": 30}
    data["workload"]["precision"] = "fp8"
    spec = StudySpec.from_dict(data)
    study = optuna.create_study(study_name="cap", storage=storage)
    study.set_user_attr("primus_spec", spec.to_public_dict())
    paths = build_report(storage, "cap", tmp_path / "r")
    md = paths["md"].read_text()
    assert "Capacity plan" in md and "target: 100B tokens in 30 days" in md  # as `capacity` writes it
    assert "excluded: the study trains in FP8" in md  # a100-80gb
    assert "| h100 | 16 |" in md and "fewest GPUs meeting the target:" in md
    # each row's error band, as the `capacity` table prints it
    from primus_optuna.physics.capacity import capacity_table

    (row16,) = [r for r in capacity_table(spec, [16], ["h100"]).all_rows if r.gpus == 16]
    line = next(x for x in md.splitlines() if x.startswith("| h100 | 16 |"))
    assert "| eff. | band |" in md and f"| {row16.band.text()} |" in line
    assert (tmp_path / "r" / "plots" / "capacity.png").read_bytes()[:4] == b"\x89PNG"
    assert "capacity plan" in paths["html"].read_text()  # the plot, embedded
    # a study without targets has no such section (the golden report is unchanged)
    plain = optuna.create_study(study_name="plain", storage=storage)
    plain.set_user_attr("primus_spec", StudySpec.from_dict(small_dense_study()).to_public_dict())
    assert "Capacity plan" not in build_report(storage, "plain", tmp_path / "p")["md"].read_text()


def test_report_says_which_collectives_were_measured(tmp_path: Path) -> None:
    """A study with ``cluster.network``: the Setup names the measured collectives, their file, and the rest
    from the catalog (a study without one has no such line)."""
    from primus_optuna.spec import StudySpec
    from tests.conftest import small_moe_study

    net = tmp_path / "net.csv"
    net.write_text("collective,ranks,ranks_per_node,bytes,busbw_gbs\nall_reduce,8,4,1048576,5.0\n")
    data = small_moe_study()
    data["cluster"]["network"] = "net.csv"
    spec = StudySpec.from_dict(data, base_dir=tmp_path)
    storage = f"sqlite:///{tmp_path / 'n.db'}"
    study = optuna.create_study(study_name="net", storage=storage)
    study.set_user_attr("primus_spec", spec.to_public_dict())
    md = build_report(storage, "net", tmp_path / "r")["md"].read_text()
    assert (
        "**Collectives**: all_reduce measured (net.csv); all_gather, reduce_scatter, all_to_all, send_recv from "
        "the catalog" in md
    )
    plain = optuna.create_study(study_name="plain", storage=storage)
    plain.set_user_attr("primus_spec", StudySpec.from_dict(small_moe_study()).to_public_dict())
    assert "**Collectives**" not in build_report(storage, "plain", tmp_path / "p")["md"].read_text()
