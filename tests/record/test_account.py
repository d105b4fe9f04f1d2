"""Issue 39: one account of a study (record.account.StudyAccount) that the run summary, ``run --json``, the
report and the dashboard note all render, after a kill -9, a heartbeat retry and a resume (item 10), and for a
study made with the README's custom-objective recipe (item 11)."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import optuna
import pytest

from primus_optuna import StudySpec
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.record.account import study_account
from primus_optuna.record.dashboard import study_summary as dashboard_note
from primus_optuna.record.report import build_report, record_of
from primus_optuna.record.summary import study_summary
from primus_optuna.run.base import Measurement, OutOfMemory, RunFailure
from primus_optuna.run.objective import make_objective
from primus_optuna.search.pruner import MemoryPrefilterPruner
from primus_optuna.search.sampler import PrimusSampler
from tests.conftest import small_moe_study

State = optuna.trial.TrialState


class _Killed(BaseException):
    """kill -9 of the worker: nothing after it runs (Optuna catches Exception and KeyboardInterrupt only)."""


class _Launcher:
    """A launching runner stand-in: run 1 measures (peak 50 GiB, a log, 36 s), run 2 is killed after its
    measurement was recorded, run 3 (the heartbeat retry) runs out of memory before any figure."""

    kind = "fake"
    launches_jobs = True

    def __init__(self, spec: StudySpec, tmp: Path) -> None:
        self.spec, self.tmp, self.calls = spec, tmp, 0

    def run(self, config, context):
        self.calls += 1
        if self.calls == 3:
            raise OutOfMemory("HIP out of memory")
        log = self.tmp / f"run-{self.calls}.log"
        log.write_text(f"log of run {self.calls}\n")
        est = estimate_throughput(self.spec, config)
        return Measurement(
            est.tokens_per_s_per_gpu,
            est.step_time_s,
            "measured",
            peak_memory_gib=40.0 + 10 * self.calls,
            log_path=str(log),
            details={"wall_s": 36.0},
        )


def _kill_second(trial, attrs):
    if trial.number == 1 and attrs.get("source") == "measured":
        raise _Killed


def _storage(url: str) -> optuna.storages.RDBStorage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url,
            heartbeat_interval=1,
            grace_period=1,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
        )


def test_10_every_surface_agrees_with_the_storage_after_a_kill_and_a_resume(tmp_path):
    spec = StudySpec.from_dict(small_moe_study())
    url = f"sqlite:///{tmp_path / 's.db'}"
    runner = _Launcher(spec, tmp_path)
    objective = make_objective(spec, runner, runs_dir=tmp_path / "runs", trial_hooks=[_kill_second])
    study = optuna.create_study(
        study_name="s",
        storage=_storage(url),
        direction="maximize",
        sampler=PrimusSampler(spec, seed=0),
        pruner=MemoryPrefilterPruner(spec=spec),
    )
    with pytest.raises(_Killed):
        study.optimize(objective, n_trials=3)
    time.sleep(2.2)  # the killed worker's heartbeat goes stale
    resumed = optuna.load_study(
        study_name="s", storage=_storage(url), sampler=PrimusSampler(spec, seed=0), pruner=study.pruner
    )
    resumed.optimize(objective, n_trials=1, catch=(RunFailure,))
    trials = resumed.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [State.COMPLETE, State.FAIL, State.FAIL]
    killed, retry = trials[1], trials[2]
    assert retry.system_attrs["failed_trial"] == 1 and retry.user_attrs["failure_reason"] == "oom"
    # the retry's own run left no figure: nothing of the killed run is shown as its own
    for attr in ("gpu_hours", "measured_peak_memory_gib", "source"):
        assert killed.user_attrs.get(attr) is not None and retry.user_attrs.get(attr) is None, attr
    assert (
        killed.user_attrs["log_tail"] == "log of run 2\n"
        and retry.user_attrs["log_tail"] == "HIP out of memory"
    )

    rec = record_of(resumed, url)
    acc = study_account(rec)
    assert acc.launched == 3 and acc.launched_failed == 2  # the killed job ran, the retry ran out of memory
    assert acc.failed_by_reason == {"no reason recorded": 1, "oom": 1}
    assert acc.gpu_hours_spent == pytest.approx(2 * 36.0 * spec.world / 3600 + retry_hours(rec, 2))
    s = study_summary(rec)
    launched = s.launched_text()
    assert launched.startswith("3 launched (2 of them failed, 0 stopped early)")
    lines = "\n".join(s.lines())
    assert launched in lines and "failed by reason: no reason recorded 1, oom 1" in lines
    data = s.to_dict()
    assert data["budget"]["launched"] == 3 and data["account"]["launched"] == 3
    assert data["failed_by_reason"] == {"no reason recorded": 1, "oom": 1}
    report = Path(build_report(url, "s", tmp_path / "report")["md"]).read_text()
    assert launched in report and "failed: no reason recorded" in report and "error" not in launched
    assert launched in dashboard_note(rec)


def retry_hours(rec, number: int) -> float:
    """The wall time of trial ``number`` (a launched job without its own GPU-hours attr) × the GPUs."""
    t = next(t for t in rec.trials if t.number == number)
    return (t.duration_s or 0.0) * rec.spec.world / 3600


def test_11_a_custom_objectives_report_names_its_values_and_its_stopped_jobs_once(tmp_path):
    """The README's custom-objective recipe: values from the user's launcher (no ``source``), jobs stopped by
    the wrapped MedianPruner after reporting."""
    spec = StudySpec.from_dict(small_moe_study())
    url = f"sqlite:///{tmp_path / 'c.db'}"
    from primus_optuna import suggest_config

    def objective(trial):
        config = suggest_config(trial, spec)
        if trial.should_prune():
            raise optuna.TrialPruned()
        tokens = estimate_throughput(spec, config).tokens_per_s_per_gpu
        for step in range(4):
            trial.report(tokens, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return tokens

    study = optuna.create_study(
        study_name="c",
        storage=url,
        direction="maximize",
        sampler=PrimusSampler(spec, seed=0),
        pruner=MemoryPrefilterPruner(
            wrapped=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0), spec=spec
        ),
    )
    study.optimize(objective, n_trials=8)
    rec = record_of(study, url)
    acc = study_account(rec)
    complete = sum(t.state == State.COMPLETE for t in study.trials)
    stopped = [t for t in study.trials if t.state == State.PRUNED and t.intermediate_values]
    assert stopped, "the recipe's MedianPruner stopped some jobs"
    assert acc.sources == {"your objective": complete}
    assert acc.launched == complete + len(stopped) and acc.stopped_early == len(stopped)
    s = study_summary(rec)
    assert f"{len(stopped)} stopped early" in s.launched_text()
    assert f"({len(stopped)} job{'s' * (len(stopped) != 1)} stopped early)" in s.gpu_hours_text()
    report = Path(build_report(url, "c", tmp_path / "report")["md"]).read_text()
    assert "unknown source" not in report and "analytical runner, whose" not in report
    assert "from your objective" in report and "(your objective)" in report
    assert "slow job" not in report


def test_11_the_reports_result_section_gives_the_summarys_gain_over_the_sweep_centre(tmp_path):
    """A baseline that does not fit is never run: the run summary gives the gain over the sweep centre, and the
    report's result section says the same instead of "no gain to report"."""
    data = small_moe_study()
    data["search"]["baseline"] = {"tp": 1, "pp": 1, "ep": 1, "mbs": 4}  # does not fit: the sweep moves off it
    spec = StudySpec.from_dict(data)
    url = f"sqlite:///{tmp_path / 'g.db'}"
    study = optuna.create_study(
        study_name="g",
        storage=url,
        direction="maximize",
        sampler=PrimusSampler(spec, seed=0),
        pruner=MemoryPrefilterPruner(spec=spec),
    )
    study.optimize(make_objective(spec), n_trials=4)
    s = study_summary(record_of(study, url))
    assert s.gain_over == "centre" and s.gain is not None
    report = Path(build_report(url, "g", tmp_path / "report")["md"]).read_text()
    result = report.split("## 7. Result", 1)[1]
    assert "no gain to report" not in result
    assert s.gain_text()[1:] in result and f"{s.gain:+.1%}" in result
