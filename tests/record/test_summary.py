"""One account per figure (#22 item 3): the run summary, ``run --json``, the report's executive summary and
the dashboard's study note are written from one :class:`StudySummary`."""

from __future__ import annotations

import optuna
import pytest

from primus_optuna.cli.run_cmd import summarize, summary_data
from primus_optuna.record.dashboard import study_summary as dashboard_note
from primus_optuna.record.report import load_record, render
from primus_optuna.record.summary import next_commands, reason_category, study_summary
from primus_optuna.space import Space
from tests.helpers.recorded_study import make_study, small_spec


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = make_study(url)
    spec = small_spec()
    space = Space(spec)
    dists = {
        a: optuna.distributions.CategoricalDistribution(space.candidates[a]) for a in space.searched_axes
    }
    c = space.canonical(space.make(mbs=2))
    base = {"config_key": c.key(), "phase": "fallback", "memory_peak_gib": 80.0}
    study.add_trial(  # a job stopped early: launched, it spent GPU-hours
        optuna.trial.create_trial(
            params=c.to_params(),
            distributions=dists,
            state=optuna.trial.TrialState.PRUNED,
            user_attrs={
                **base,
                "prune_reason": "slow: median 2000.0 < 0.95 x best",
                "gpu_hours": 0.5,
                "gpu_hours_saved_early_stop": 1.5,
                "source": "measured",
                "measured_partial": True,
            },
        )  # fmt: skip
    )
    study.add_trial(  # a placeholder: the sampler had nothing left to propose
        optuna.trial.create_trial(
            params={},
            distributions={},
            state=optuna.trial.TrialState.PRUNED,
            user_attrs={
                "phase": "exhausted",
                "prune_reason": "exhausted: every legal configuration was tried",
            },
        )  # fmt: skip
    )
    study.ask()  # a trial running now (another worker)
    return url


def test_every_view_carries_the_same_figures(url):
    study = optuna.load_study(study_name="small", storage=url)
    s = study_summary(load_record(url, "small"))
    # launched: the 6 measured completions, the OOM failure and the job stopped early
    assert s.launched == 8 and s.launched_failed == 1 and s.stopped_early == 1
    assert s.by_state["running"] == 1 and s.placeholders == 1
    assert s.pruned_by_reason == {"memory": 1, "duplicate": 1, "slow": 1}
    assert s.failed_by_reason == {"oom": 1}
    assert s.gain_over == "baseline" and s.centre is not None and s.centre.trial == 0
    assert s.llm.tokens == 3456 and s.llm.cost_usd == pytest.approx(0.0123)

    run_text = "\n".join(summarize(study, url))
    report = render(load_record(url, "small")).markdown()
    executive = report.split("## ")[1]
    note = dashboard_note(load_record(url, "small"))
    for text in (s.trials_text(), s.launched_text(), s.gpu_hours_text().removeprefix("GPU-hours"),
                 s.gain_text().removeprefix("gain"), s.llm.text()):  # fmt: skip
        assert text in run_text, text
        assert text in executive, text
        assert text in note, text
    # the error band of the estimates, from the study's own measured trials, on every view
    assert s.band is not None and "this study's 6 measured trials" in s.band.source
    for view in (run_text, executive, note):
        assert s.band_text().removeprefix("error band") in view
    assert s.gain_inside_band is None  # a measured gain: the measurement noise judges it, not the band
    assert "1 running" in s.trials_text() and "1 placeholder" in s.trials_text()
    assert "spent on 8 launched jobs" in s.gpu_hours_text()

    doc = summary_data(study, url)
    assert doc["launched"] == 8 and doc["budget"]["launched"] == 8 and doc["budget"]["n_trials"] == 30
    assert doc["budget"]["running"] == 1 and doc["budget"]["placeholders"] == 1
    assert doc["gpu_hours"]["spent"] == pytest.approx(s.gpu_hours.spent, abs=1e-4)
    assert doc["baseline"]["trial"] == 0 and doc["centre"]["trial"] == 0
    assert doc["llm"]["tokens"] == 3456
    assert doc["band"]["text"] == s.band.text() and doc["band"]["low"] == s.band.low
    assert doc["gain_inside_band"] is None and doc["gain_band"] is None


def _estimated(rec):
    """The recorded study as the analytical runner would have left it: every value an estimate."""
    for t in rec.trials:
        if t.state == "COMPLETE":
            t.attrs["source"] = "analytical"
    return rec


@pytest.mark.parametrize(("baseline", "inside"), [(4500.0, True), (3000.0, False)])
def test_an_estimated_gain_inside_the_ratio_band_is_flagged_on_every_view(url, baseline, inside):
    """Best 5,200 over the baseline: +15.6% lies inside the one-node ratio band (±18%, vTrain's held-back
    pairs), +73% does not; the flag reads the same in the run summary, the report and the dashboard note."""
    from primus_optuna.physics.uncertainty import ratio_band

    rec = _estimated(load_record(url, "small"))
    rec.baseline.values = [baseline]
    s = study_summary(rec)
    assert s.gain == pytest.approx(5200.0 / baseline - 1)
    assert s.gain_band is not None and s.gain_band.text() == ratio_band(rec.spec).text()
    assert s.gain_inside_band is inside
    flag = "error of the ratio of two estimates could undo it" if inside else "more than a "
    assert flag in s.gain_text()
    run_text = "\n".join(s.lines())
    executive = render(rec).markdown().split("## ")[1]
    for view in (run_text, executive, dashboard_note(rec)):
        assert s.gain_text().removeprefix("gain") in view
        assert "catalog constants" in view  # the held-back band: no measured trial
    assert s.to_dict()["gain_inside_band"] is inside


def test_one_reason_vocabulary():
    assert reason_category("memory: 150 GiB > 126 GiB usable") == "memory"
    assert reason_category("duplicate (trial 5)") == "duplicate"
    assert reason_category("oom") == "oom" and reason_category(None) == "no reason recorded"


def test_next_commands_paste_into_a_new_shell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmds = next_commands("sqlite:///runs/my study.db", "my study")
    # a relative file storage is made absolute, arguments are quoted for the shell
    assert (
        cmds[0]
        == f"primus-optuna report --storage 'sqlite:///{tmp_path}/runs/my study.db' --study-name 'my study'"
    )
    import shlex

    assert shlex.split(cmds[1])[-1] == f"sqlite:///{tmp_path}/runs/my study.db"
    assert cmds[2].endswith("--format primus")
    # FP8 attention has no framework argument (exports refuse it): the axes' env export is suggested
    assert next_commands("sqlite:///s.db", "s", export_format="env")[2].endswith("--format env")


def test_measured_peak_comes_first_everywhere(url):
    from primus_optuna.physics.memory_calibration import MemoryCalibration
    from primus_optuna.record.dashboard import trial_note
    from primus_optuna.record.report import sensitivity

    rec = load_record(url, "small")
    best = rec.best
    best.attrs.update(measured_peak_memory_gib=97.25, memory_peak_calibrated_gib=88.0)
    s = study_summary(rec)
    assert s.best.peak_text() == (
        f"peak memory 97.25 GiB measured (estimate {best.peak_gib:.2f} GiB, calibrated estimate 88.00 GiB)"
    )
    assert s.best.peak_text() in "\n".join(s.lines())
    note = trial_note(best.attrs, None, best.number)
    assert note.index("97.25 GiB measured") < note.index("peak memory estimated")
    # the sensitivity table judges fit with the memory filter's calibration
    mcal = MemoryCalibration(scale=0.5, n_trials=2)
    rows, _ = sensitivity(rec, best.config, None, mcal)
    raw, _ = sensitivity(rec, best.config)
    for a, b in zip(rows, raw, strict=True):
        if b.get("peak_gib") is not None:
            assert a["peak_gib"] == pytest.approx(0.5 * b["peak_gib"])


def test_pareto_lines_say_which_figures_are_estimates(tmp_path):
    """The run summary's Pareto front names each throughput and peak as measured or estimated: the recorded
    study measured its throughputs, not its peaks, so no line shows a bare memory figure."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    make_study(url, multi=True)
    s = study_summary(load_record(url, "small"))
    lines = s.lines()
    front = lines[lines.index(next(x for x in lines if x.startswith("Pareto front ("))) + 1 :][
        : len(s.pareto)
    ]
    assert front
    for line, t in zip(front, s.pareto, strict=True):
        assert (
            f"tok/s/GPU (measured), {t.estimated_peak_memory_gib:.1f} GiB estimated  {t.config_key}" in line
        )


def test_suggested_export_is_one_the_study_can_write() -> None:
    """The run summary suggests the Primus overlay, else Megatron-LM arguments (TE's fused grouped MLP: the
    Megatron-LM that Primus pins lacks it), else the axes as env (FP8 attention: no framework argument sets it),
    as space.megatron_args.export_refusal decides for every export."""
    from primus_optuna.record.summary import suggested_export
    from primus_optuna.spec import StudySpec
    from tests.conftest import FLAGSHIP, STUDIES

    base = StudySpec.from_yaml(FLAGSHIP).to_dict()
    nvidia = {**base, "cluster": {**base["cluster"], "gpu": "b200"}}

    def spec(**workload):
        return StudySpec.from_dict({**nvidia, "workload": {**nvidia["workload"], **workload}})

    assert suggested_export(StudySpec.from_dict(base)) == "primus"
    assert suggested_export(spec(te_op_fuser=True)) == "megatron"
    # an NVIDIA study's GPUs run Megatron-LM (Primus-Turbo, which Primus's DeepEP and sync-free MoE need, is ROCm's)
    for name in ("gpt-oss-120b-h100-bf16.yaml", "qwen3-235b-a22b-gb200-fp8.yaml"):
        assert suggested_export(StudySpec.from_yaml(STUDIES / name)) == "megatron"
    amd_fp8_output = {
        **base,
        "workload": {**base["workload"], "fp8_recipe": "mxfp8", "fp8_output_proj": True},
    }
    assert (
        suggested_export(StudySpec.from_dict(amd_fp8_output)) == "env"
    )  # neither Primus nor its Megatron-LM
    assert suggested_export(spec(fp8_recipe="mxfp8", fp8_dot_product_attention=True)) == "env"


def test_answers_cut_at_the_token_limit_are_counted_on_every_surface():
    """The planner's ``truncated`` counter reaches the summary's and the report's usage lines (absent at 0)."""
    from primus_optuna.record.report.sections import llm_usage_line
    from primus_optuna.record.summary import llm_usage

    books = {"calls": 3, "unparseable": 1, "tokens": 900, "truncated": 2}
    assert "2 answers cut at llm.max_tokens" in llm_usage(books).text()
    assert "2 answers cut at llm.max_tokens" in llm_usage_line(books)
    one = {**books, "truncated": 1}
    assert "1 answer cut at" in llm_usage(one).text() and "1 answer cut at" in llm_usage_line(one)
    assert "cut at" not in llm_usage({**books, "truncated": 0}).text() + llm_usage_line(
        {**books, "truncated": 0}
    )
