"""Budget accounting: launched vs pruned trials and the GPU-hours launched trials spent."""

from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest

from primus_optuna.record.budget import budget_accounting

State = optuna.trial.TrialState
T0 = datetime(2026, 1, 1, 12, 0, 0)


def _trial(state, minutes=0.0, value=None, **attrs):
    t = optuna.trial.create_trial(state=state, value=value, user_attrs=attrs)
    t.datetime_start = T0
    t.datetime_complete = T0 + timedelta(minutes=minutes)
    return t


def test_launched_trials_spend_gpu_hours_and_prunes_before_launch_do_not():
    trials = [
        _trial(State.COMPLETE, 30, 100.0, source="measured"),  # 0.5 h x 64 GPUs = 32 GPU-h
        _trial(State.COMPLETE, 90, 120.0, source="measured"),  # 96 GPU-h
        _trial(State.FAIL, 6, failure_reason="oom"),  # launched, failed: 6.4 GPU-h
        _trial(State.PRUNED, 0.01, prune_reason="memory: 300 GiB on stage 0 > 259 GiB usable"),
        _trial(State.PRUNED, 0.01, prune_reason="memory: 280 GiB on stage 1 > 259 GiB usable"),
        _trial(State.PRUNED, 0.01, prune_reason="duplicate: same configuration as trial 0 (complete)"),
        _trial(State.PRUNED, 0.0, prune_reason="exhausted: every legal configuration ...", phase="exhausted"),
        _trial(State.PRUNED, 20, prune_reason="throughput: below the best after 40 steps", source="measured"),
    ]
    acc = budget_accounting(trials, gpus=64)
    assert acc.trials == 7  # the exhausted placeholder is not a trial of the search
    assert acc.launched == 4 and acc.failed_launched == 1 and acc.pruned_other == 1
    assert dict(acc.pruned_before_launch) == {"memory": 2, "duplicate": 1}
    assert acc.gpu_hours_spent == pytest.approx(64 * (0.5 + 1.5 + 0.1 + 20 / 60))
    assert acc.to_dict()["gpu_hours_spent"] == pytest.approx(acc.gpu_hours_spent, abs=1e-4)


def test_an_analytical_study_spends_and_saves_nothing_and_says_so():
    trials = [
        _trial(State.COMPLETE, 0.001, 10.0, source="analytical"),
        _trial(State.PRUNED, 0.0, prune_reason="memory: 1 > 0"),
    ]
    acc = budget_accounting(trials, gpus=8)
    assert acc.launched == 0 and acc.analytical == 1 and acc.gpu_hours_spent == 0.0
    assert dict(acc.pruned_before_launch) == {"memory": 1}


def test_run_summary_prints_the_budget(tmp_path):
    from primus_optuna import StudySpec
    from primus_optuna.cli.run_cmd import summarize
    from primus_optuna.record.storage import open_study
    from primus_optuna.run.objective import make_objective
    from primus_optuna.search.pruner import MemoryPrefilterPruner
    from primus_optuna.search.sampler import PrimusSampler
    from tests.conftest import small_moe_study

    spec = StudySpec.from_dict(small_moe_study(sweep_trials=3))
    url = f"sqlite:///{tmp_path / 's.db'}"
    handle = open_study(spec, storage=url, pruner=MemoryPrefilterPruner(), heartbeat_interval=None)
    handle.study.sampler = PrimusSampler(spec)
    handle.study.optimize(make_objective(spec, runs_dir=handle.runs_dir), n_trials=4)
    lines = summarize(handle.study, url)
    assert any(line.startswith("budget: 0 launched, 4 estimated") for line in lines), lines
    assert any(line.startswith("GPU-hours: none spent (no job launched)") for line in lines), lines


def test_the_report_shows_the_sweep_centre_what_it_skipped_and_the_budget(tmp_path):
    from primus_optuna import StudySpec
    from primus_optuna.record.report import build_report
    from primus_optuna.record.storage import open_study
    from primus_optuna.run.objective import make_objective
    from primus_optuna.search.pruner import MemoryPrefilterPruner
    from primus_optuna.search.sampler import PrimusSampler
    from tests.conftest import small_moe_study

    spec = StudySpec.from_dict(small_moe_study(sweep_trials=3))
    url = f"sqlite:///{tmp_path / 's.db'}"
    handle = open_study(spec, storage=url, pruner=MemoryPrefilterPruner(), heartbeat_interval=None)
    sampler = PrimusSampler(spec)
    handle.study.sampler = sampler
    handle.study.optimize(make_objective(spec, runs_dir=handle.runs_dir), n_trials=4)
    out = build_report(url, spec.name, tmp_path / "report")
    md = Path(out["md"]).read_text()
    assert f"Sweep centre {sampler.design.centre.key()}" in md
    assert "(search.sweep_trials budget 3)" in md
    skipped = sampler.design.skipped
    assert skipped and all(s.reason in md for s in skipped[:3])
    assert "budget: 0 launched, 4 estimated" in md


def test_a_trial_interrupted_before_its_job_started_was_not_launched():
    trials = [
        _trial(State.FAIL, 0.1, failure_reason="interrupted"),  # Ctrl-C before any job: no gpu_hours
        _trial(State.FAIL, 60, failure_reason="interrupted", gpu_hours=1.0),  # its job was running
    ]
    acc = budget_accounting(trials, gpus=8)
    assert acc.launched == 1 and acc.failed_launched == 1
