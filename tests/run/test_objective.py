from pathlib import Path

import optuna
import pytest
from optuna.artifacts import FileSystemArtifactStore

from primus_optuna import Space, StudySpec
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.run.analytical import AnalyticalRunner
from primus_optuna.run.base import Measurement, OutOfMemory, RunFailure
from primus_optuna.run.objective import make_objective
from primus_optuna.search.calibrations import study_calibrations
from primus_optuna.search.pruner import MemoryPrefilterPruner
from primus_optuna.search.sampler import PrimusSampler
from tests.conftest import small_moe_study

optuna.logging.set_verbosity(optuna.logging.WARNING)
State = optuna.trial.TrialState


@pytest.fixture
def spec():
    return StudySpec.from_dict(small_moe_study())


def _study(spec, **kw):
    return optuna.create_study(direction="maximize", pruner=MemoryPrefilterPruner(spec=spec), **kw)


def _configs(spec):
    space = Space(spec)
    fit = [c for c in space.configs() if estimate_memory(spec, c).fits]
    nofit = [c for c in space.configs() if not estimate_memory(spec, c).fits]
    return fit, nofit


def test_attrs_values_memory_pruning_and_hooks(spec, tmp_path):
    fit, nofit = _configs(spec)
    seen = []
    study = _study(spec)
    study.enqueue_trial(fit[0].to_params())
    study.enqueue_trial(nofit[0].to_params())
    study.optimize(
        make_objective(spec, runs_dir=tmp_path, trial_hooks=[lambda t, a: seen.append((t.number, a))]),
        n_trials=2,
    )
    ok, pruned = study.trials
    assert ok.state == State.COMPLETE and ok.value > 0
    ua = ok.user_attrs
    assert ua["source"] == "analytical" and ua["config_key"] == fit[0].key()
    assert ua["estimate_tokens_per_s_per_gpu"] == pytest.approx(ok.value, rel=1e-4)
    assert "measured_tokens_per_s_per_gpu" not in ua and "estimate_error" not in ua
    assert ua["breakdown_s"] and ua["step_time_s"] > 0 and ua["memory_peak_gib"] > 0
    assert not (tmp_path / "trial-00000").exists()  # the analytical runner needs no work directory
    assert pruned.state == State.PRUNED and pruned.user_attrs["prune_reason"].startswith("memory: ")
    # the hooks see every outcome: the completed trial, then the pruned one with its reason
    assert [n for n, _ in seen] == [0, 1] and seen[0][1]["config_key"] == fit[0].key()
    assert seen[1][1]["prune_reason"].startswith("memory: ") and "value" not in seen[1][1]


def test_duplicate_configuration_is_pruned(spec, tmp_path):
    fit, _ = _configs(spec)
    study = _study(spec)
    for _ in range(2):
        study.enqueue_trial(fit[0].to_params())
    study.optimize(make_objective(spec, runs_dir=tmp_path), n_trials=2)
    a, b = study.trials
    assert a.state == State.COMPLETE and b.state == State.PRUNED
    assert b.user_attrs["prune_reason"] == "duplicate: same configuration as trial 0 (complete)"


class _Measured:
    kind = "fake"

    def __init__(self, spec, fail=None, log=None):
        self.inner, self.fail, self.log = AnalyticalRunner(spec), fail, log

    def run(self, config, context):
        if self.fail:
            raise self.fail("boom", log_path=self.log, log_tail="HIP out of memory")
        m = self.inner.run(config, context)
        return Measurement(
            m.tokens_per_s_per_gpu * 0.8,
            m.step_time_s / 0.8,
            "measured",
            10.0,
            log_path=self.log,
            details={},
            peak_reserved_gib=12.5,
        )


def test_measured_runner_records_the_estimate_error(spec, tmp_path):
    fit, _ = _configs(spec)
    study = _study(spec)
    study.enqueue_trial(fit[0].to_params())
    study.optimize(make_objective(spec, _Measured(spec), runs_dir=tmp_path), n_trials=1)
    ua = study.trials[0].user_attrs
    assert ua["source"] == "measured"
    # the reserved peak is recorded beside the allocated one: a reserve sample for the memory gate
    assert ua["measured_peak_memory_gib"] == 10.0 and ua["measured_reserved_memory_gib"] == 12.5
    assert ua["measured_tokens_per_s_per_gpu"] == pytest.approx(
        0.8 * ua["estimate_tokens_per_s_per_gpu"], rel=1e-4
    )
    assert ua["estimate_error"] == pytest.approx(0.25, rel=1e-3)
    # the study's running calibration: one trial measured at 0.8x the estimate -> global scale 1.25 on time
    cal = study_calibrations(study, spec).step  # derived from the trials
    assert cal.n_trials == 1 and cal.scale == pytest.approx(1.25, rel=1e-3)
    # and its memory calibration: the run reported a 10 GiB peak against the model's estimate
    mcal = study_calibrations(study, spec).memory.to_dict()
    ratio = 10.0 / ua["memory_peak_gib"]
    if 0.25 <= ratio <= 4.0:
        assert mcal["n_trials"] == 1 and mcal["scale"] == pytest.approx(ratio, rel=1e-3)
    else:  # not comparable (the fake runner's 10 GiB against a large estimate): discarded
        assert mcal["n_trials"] == 0 and mcal["scale"] == 1.0


def test_run_failure_is_recorded_with_its_log_and_the_study_goes_on(spec, tmp_path):
    fit, _ = _configs(spec)
    log = tmp_path / "train.log"
    log.write_text("step 1\nHIP out of memory\n")
    store = FileSystemArtifactStore(str(tmp_path / "artifacts"))
    (tmp_path / "artifacts").mkdir()
    study = _study(spec)
    study.enqueue_trial(fit[0].to_params())
    seen = []
    objective = make_objective(
        spec,
        _Measured(spec, OutOfMemory, str(log)),
        runs_dir=tmp_path,
        artifact_store=store,
        trial_hooks=[lambda t, a: seen.append(a)],
    )
    study.optimize(objective, n_trials=2, catch=(RunFailure,))
    assert study.trials[0].state == State.FAIL and len(study.trials) == 2  # caught: the study went on
    assert seen[0]["failure_reason"] == "oom"  # the hooks (dashboard note) see the failure too
    ua = study.trials[0].user_attrs
    assert ua["failure_reason"] == "oom" and "HIP out of memory" in ua["log_tail"]
    assert ua["memory_model_miss"] is True  # the model said it fits
    # an out-of-memory run is a lower bound for the memory calibration: this configuration is now out
    mcal = study_calibrations(study, spec).memory.to_dict()
    assert spec.cluster.gpu.hbm_gib / ua["memory_peak_gib"] <= 1.5  # close enough to count as evidence
    assert mcal["n_oom"] >= 1 and mcal["scale"] * ua["memory_peak_gib"] >= ua["memory_usable_gib"]
    assert any(p.read_text() == log.read_text() for p in (tmp_path / "artifacts").iterdir())


def test_successful_measured_run_keeps_its_log(spec, tmp_path):
    fit, _ = _configs(spec)
    log = tmp_path / "train.log"
    log.write_text("iteration 3/ 3 | elapsed time per iteration (ms): 1000.0\n")
    (tmp_path / "artifacts").mkdir()
    store = FileSystemArtifactStore(str(tmp_path / "artifacts"))
    study = _study(spec)
    study.enqueue_trial(fit[0].to_params())
    study.optimize(
        make_objective(spec, _Measured(spec, log=str(log)), runs_dir=tmp_path, artifact_store=store),
        n_trials=1,
    )
    t = study.trials[0]
    assert t.state == State.COMPLETE and "elapsed time per iteration" in t.user_attrs["log_tail"]
    assert [p.read_text() for p in (tmp_path / "artifacts").iterdir()] == [log.read_text()]


def test_pareto_objective_returns_throughput_and_memory(tmp_path):
    spec = StudySpec.from_dict(small_moe_study(objective=["tokens_per_s_per_gpu", "peak_memory_gib"]))
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=PrimusSampler(spec))
    study.optimize(make_objective(spec, runs_dir=tmp_path), n_trials=8)
    done = [t for t in study.trials if t.state == State.COMPLETE]
    assert done and all(t.values[1] == pytest.approx(t.user_attrs["memory_peak_gib"], rel=1e-3) for t in done)
    assert all(
        t.user_attrs["prune_reason"].startswith("memory") for t in study.trials if t.state == State.PRUNED
    )


def test_default_runs_dir_is_next_to_a_sqlite_storage(spec, tmp_path):
    fit, _ = _configs(spec)
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'x.db'}", study_name="x", direction="maximize"
    )
    study.enqueue_trial(fit[0].to_params())
    study.optimize(make_objective(spec, _Measured(spec)), n_trials=1)
    assert (tmp_path / "x-runs" / "trial-00000").is_dir()
    assert Path(tmp_path / "x.db").is_file()


def test_secrets_in_a_jobs_output_never_reach_storage_artifacts_or_the_exception(spec, tmp_path, monkeypatch):
    """A launched job that dumps its environment (a key in its log, its OOM message) — the trial's log_tail,
    the uploaded log and the re-raised failure are redacted; the log on disk is the job's own and untouched."""
    secret = "wandb-sentinel-0123456789"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    fit, _ = _configs(spec)
    log = tmp_path / "train.log"
    log.write_text(f"WANDB_API_KEY={secret}\nHIP out of memory\n")
    (tmp_path / "artifacts").mkdir()
    store = FileSystemArtifactStore(str(tmp_path / "artifacts"))
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    study.enqueue_trial(fit[0].to_params())

    class Leaky:
        kind = "fake"

        def run(self, config, context):
            raise OutOfMemory(
                f"out of memory; env WANDB_API_KEY={secret}", log_path=str(log), log_tail=log.read_text()
            )

    raised = []
    objective = make_objective(spec, Leaky(), runs_dir=tmp_path, artifact_store=store)

    def wrapped(trial):
        try:
            return objective(trial)
        except RunFailure as exc:
            raised.append(str(exc))
            raise

    study.optimize(wrapped, n_trials=1, catch=(RunFailure,))
    t = study.trials[0]
    assert t.state == State.FAIL and "[redacted]" in t.user_attrs["log_tail"]
    assert secret not in raised[0] and "[redacted]" in raised[0]
    assert secret.encode() not in (tmp_path / "s.db").read_bytes()
    uploaded = [p.read_text() for p in (tmp_path / "artifacts").iterdir()]
    assert uploaded and all(secret not in u and "HIP out of memory" in u for u in uploaded)
    assert secret in log.read_text()  # the job's own log file is left as the job wrote it


class _Noisy:
    """A measured runner whose runs of one configuration differ (run-to-run noise)."""

    kind = "noisy"
    repeats = 3

    def __init__(self, values):
        self.values = list(values)
        self.workdirs = []

    def run(self, config, context):
        self.workdirs.append(context.workdir)
        v = self.values.pop(0)
        return Measurement(tokens_per_s_per_gpu=v, step_time_s=1.0, source="measured")


def test_repeats_take_the_median_and_record_the_spread(spec, tmp_path):
    from primus_optuna.cli.run_cmd import summarize
    from primus_optuna.search.state import store_spec

    runner = _Noisy([1000.0, 1100.0, 1040.0, 1050.0, 990.0, 1010.0])
    study = _study(spec)
    store_spec(study, spec)  # as `run` does: the summary reads the study file the study stored
    for c in _configs(spec)[0][:2]:
        study.enqueue_trial(c.to_params())
    study.optimize(make_objective(spec, runner, runs_dir=tmp_path), n_trials=2)
    t0, t1 = study.trials
    assert t0.value == 1040.0 and t0.user_attrs["measured_repeats"] == [1000.0, 1100.0, 1040.0]
    assert t0.user_attrs["measured_spread"] == pytest.approx(100.0 / 1040.0, abs=1e-5)
    assert t1.value == 1010.0  # median of 1050, 990, 1010
    assert [w.name for w in runner.workdirs[:3]] == ["repeat-0", "repeat-1", "repeat-2"]
    # 1040 vs 1010 (3% apart) is within the ~7% run-to-run spread: run says so
    lines = summarize(study, "sqlite:///x.db")
    assert any("are within the measurement noise" in line for line in lines), lines


def test_repeats_option_is_validated():
    from primus_optuna.errors import SpecError
    from primus_optuna.run.presets import build_command_runner

    s = StudySpec.from_dict(small_moe_study())
    assert build_command_runner(s, "command", {"argv": ["x"], "repeats": 3}).repeats == 3
    assert build_command_runner(s, "command", {"argv": ["x"]}).repeats == 1
    with pytest.raises(SpecError, match="runner.options.repeats"):
        build_command_runner(s, "command", {"argv": ["x"], "repeats": 0})


def test_oom_whose_calibrated_estimate_fitted_is_a_memory_model_miss(spec, tmp_path):
    """The filter let the trial through on the calibrated peak (the raw estimate alone would not fit): the
    out-of-memory run is a miss of the memory model the filter used."""
    _, nofit = _configs(spec)
    usable = [(c, estimate_memory(spec, c)) for c in nofit]
    c, mem = min(usable, key=lambda cm: cm[1].peak_gib)  # the closest to fitting
    scale = 0.9 * mem.usable_gib / mem.peak_gib
    study = _study(spec)
    for _ in range(3):  # measured peaks at `scale` x the estimate: the study's memory calibration
        attrs = {"source": "measured", "memory_peak_gib": 100.0, "measured_peak_memory_gib": 100.0 * scale}
        study.add_trial(optuna.trial.create_trial(state=State.COMPLETE, value=1000.0, user_attrs=attrs))
    study.enqueue_trial(c.to_params())
    study.optimize(
        make_objective(spec, _Measured(spec, OutOfMemory), runs_dir=tmp_path), n_trials=1, catch=(RunFailure,)
    )
    ua = study.trials[-1].user_attrs
    assert ua["failure_reason"] == "oom" and ua["memory_peak_gib"] > ua["memory_usable_gib"]
    assert ua["memory_peak_calibrated_gib"] <= ua["memory_usable_gib"]
    assert ua["memory_model_miss"] is True
