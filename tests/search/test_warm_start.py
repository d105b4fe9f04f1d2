"""Warm start: an earlier study's measured trials seed the calibrations and its winner is offered first."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from primus_optuna import Space, StudySpec
from primus_optuna.errors import SpecError
from primus_optuna.physics.calibration import Calibration
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.record.earlier import open_earlier_studies, parse_source, warm_start
from primus_optuna.record.storage import open_study
from primus_optuna.run.base import Measurement, RunContext
from primus_optuna.run.objective import make_objective
from primus_optuna.search.calibrations import study_calibrations
from primus_optuna.search.early_stop import study_pruner
from primus_optuna.search.sampler import PrimusSampler
from primus_optuna.search.warm_start import fit_from_pairs
from primus_optuna.space import TrainingConfig
from tests.conftest import small_dense_study, small_moe_study

optuna.logging.set_verbosity(optuna.logging.WARNING)
State = optuna.trial.TrialState


class Cluster:
    """A 'measured' runner: the estimate with per-axis-value effects the model does not know (the zero-bubble
    schedules 0.7× of the estimate, selective recompute 0.8×), a peak 0.9× the model's and a reserved peak
    1 GiB above it."""

    kind = "fake-cluster"

    def __init__(self, spec: StudySpec) -> None:
        self.spec = spec

    def truth(self, config: TrainingConfig) -> float:
        est = estimate_throughput(self.spec, config).tokens_per_s_per_gpu
        slow = 0.7 if config.pp_schedule in ("zb1p", "zbv") else 1.0
        return est * slow * (0.8 if config.recompute == "selective" else 1.0)

    def run(self, config: TrainingConfig, context: RunContext) -> Measurement:
        tps = self.truth(config)
        peak = 0.9 * estimate_memory(self.spec, config).peak_gib
        step = self.spec.workload.seq_length * self.spec.workload.global_batch_size / tps / self.spec.world
        return Measurement(tps, step, source="measured", peak_memory_gib=peak, peak_reserved_gib=peak + 1.0)


def _run(spec: StudySpec, url: str, n: int, tmp: Path, sources: tuple[str, ...] = ()) -> optuna.Study:
    handle = open_study(
        spec, storage=url, pruner=study_pruner(spec, launches_jobs=False), heartbeat_interval=None
    )
    study = handle.study
    if sources:
        warm_start(study, spec, sources)
    study.sampler = PrimusSampler(spec, seed=0)
    study.optimize(make_objective(spec, Cluster(spec), runs_dir=tmp / "runs"), n_trials=n)
    return study


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, optuna.Study]:
    """An earlier study of 14 measured trials (run once for the module; the tests only read it)."""
    tmp = tmp_path_factory.mktemp("earlier")
    # a sweep over most of the 14 trials, so every schedule is measured (the default sweep is 15% of n_trials)
    spec = StudySpec.from_dict(small_moe_study(axes={"mbs": [1, 2]}, sweep_trials=12))
    url = f"sqlite:///{tmp / 'earlier.db'}"
    return url, _run(spec, url, 14, tmp)


def test_parse_source() -> None:
    assert parse_source("sqlite:///a.db:old") == ("sqlite:///a.db", "old")
    assert parse_source("sqlite:///a.db") == ("sqlite:///a.db", None)
    assert parse_source("old.db:mixtral-4n") == ("old.db", "mixtral-4n")
    assert parse_source("journal:runs/x.log") == ("journal:runs/x.log", None)
    assert parse_source("postgresql://u:p@h:5432/db") == ("postgresql://u:p@h:5432/db", None)
    assert parse_source("postgresql://h:5432/db:s1") == ("postgresql://h:5432/db", "s1")


def test_warm_started_study_offers_the_imported_winner_first_with_the_imported_calibration(earlier, tmp_path):
    url, old = earlier
    winner = max((t for t in old.trials if t.state == State.COMPLETE), key=lambda t: t.value)
    # the new study: the same model on twice the global batch (a new workload, the same space)
    spec = StudySpec.from_dict({**small_moe_study(axes={"mbs": [1, 2]}), "name": "bigger-batch"})
    spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"global_batch_size": 64})})
    ws = open_earlier_studies(spec, [f"{url}:small-moe"])
    measured = [t for t in old.trials if t.state == State.COMPLETE]
    assert len(ws.pairs) == len(measured) and all(p.legal for p in ws.pairs)
    space = Space(spec)
    pairs = [p.to_pair(space) for p in ws.pairs]
    # each imported pair keeps the earlier model error, re-estimated under the new workload
    for (_, est, m), t in zip(pairs, measured, strict=True):
        old_est = float(t.user_attrs["estimate_tokens_per_s_per_gpu"])
        assert m / est.tokens_per_s_per_gpu == pytest.approx(t.value / old_est, rel=1e-3)
    new_url = f"sqlite:///{tmp_path / 'new.db'}"
    handle = open_study(spec, storage=new_url, heartbeat_interval=None)
    warm_start(handle.study, spec, [f"{url}:small-moe"])
    cal = study_calibrations(handle.study, spec).step
    fitted = Calibration.fit([(e, m) for _, e, m in pairs])
    assert cal.n_trials == fitted.n_trials == len(measured) and cal.scale == pytest.approx(fitted.scale)
    assert cal.multipliers == pytest.approx(fitted.multipliers)
    assert study_calibrations(handle.study, spec).memory.scale == pytest.approx(0.9, rel=1e-4)
    # the earlier runs' allocator reserve (reserved − allocated peak) comes along on the same GPU
    assert ws.memory_reserves and ws.memory_reserves == pytest.approx(
        [1.0] * len(ws.memory_reserves), abs=1e-3
    )
    assert study_calibrations(handle.study, spec).memory.reserve_gib == pytest.approx(1.0, abs=1e-3)
    offers = [space.canonical(TrainingConfig.from_params(p)) for p in ws.offers]
    assert 1 <= len(offers) <= 3
    n_offers = sum(c != space.canonical(space.baseline) for c in offers)  # the baseline already ran
    study = _run(spec, new_url, 2 + n_offers, tmp_path)
    first, second = study.trials[0], study.trials[1]
    assert first.user_attrs["sweep_axis"] == "baseline"
    assert second.user_attrs["phase"] == "warm_start"
    assert second.user_attrs["config_key"] == space.canonical(TrainingConfig.from_params(winner.params)).key()
    assert [t.user_attrs["phase"] for t in study.trials[1 : 1 + n_offers]] == ["warm_start"] * n_offers
    # then the sweep goes on, skipping the points the earlier study measured (the budgeted sweep may have none
    # left: then the fallback), and nothing imported is measured again
    nxt = study.trials[1 + n_offers]
    assert nxt.user_attrs["phase"] in ("sweep", "fallback")
    if nxt.user_attrs["phase"] == "sweep":
        assert nxt.user_attrs["sweep_index"] > 1
        imported = {space.canonical(TrainingConfig.from_params(p.params)).key() for p in ws.pairs}
        assert nxt.user_attrs["config_key"] not in imported
    # the imported winner is measured first and is still the best of the imported configurations here
    assert second.value == max(t.value for t in study.trials[: 1 + n_offers])
    assert ws.ranking["n"] > 10 and -1.0 <= ws.ranking["spearman"] <= 1.0
    assert "offered first after the baseline" in ws.summary()
    from primus_optuna.record.report import build_report

    md = build_report(new_url, "bigger-batch", tmp_path / "report")["md"].read_text()
    assert (
        f"**Warm start** (study attr `warm_start`): warm start from {url}:small-moe: {len(pairs)} measured"
        in md
    )
    assert f"rank {ws.ranking['top1_was']} under the uncalibrated model" in md


def test_the_fallback_ranks_with_the_imported_evidence(earlier, tmp_path):
    url, _ = earlier
    spec = StudySpec.from_dict({**small_moe_study(axes={"mbs": [1, 2]}), "name": "n2"})
    ws = open_earlier_studies(spec, [url])  # one study in the storage: its name may be omitted
    space = Space(spec)
    cal, factors = fit_from_pairs(space, [p.to_pair(space) for p in ws.pairs])
    # the per-axis-value effect the model misses (zero bubble 0.7x) is learnt from the imported pairs
    b = space.baseline
    assert factors.log_factor(b.replace(pp_schedule="zb1p")) < factors.log_factor(
        b.replace(pp_schedule="1f1b")
    )
    # and it moves the ranking (issue 21's step-time model already ranks a plain-1F1B, no-recompute layout
    # first here, so the #1 may stay): the warm-started #1 avoids what the evidence penalises, and the order
    # below it changes
    r = ws.ranking
    assert "-zb" not in r["top1"] and "selective" not in r["top1"]
    assert r["spearman"] < 1.0 and (r["top1_was"] > 1 or r["top10_overlap"] < 10)


def test_a_study_of_another_model_is_refused_unless_forced(earlier, tmp_path):
    url, _ = earlier
    dense = StudySpec.from_dict(small_dense_study())
    with pytest.raises(
        SpecError, match=r"tuned model 'mixtral-8x7b', this one tunes 'llama3.1-8b'.*--force-warm-start"
    ):
        open_earlier_studies(dense, [url])
    ws = open_earlier_studies(dense, [url], force=True)
    assert ws.pairs and any("another model" in n for n in ws.notes)


def test_bad_sources_are_named(tmp_path, earlier):
    url, _ = earlier
    spec = StudySpec.from_dict(small_moe_study())
    with pytest.raises(SpecError, match="no storage file"):
        open_earlier_studies(spec, [f"sqlite:///{tmp_path / 'missing.db'}"])
    with pytest.raises(SpecError, match="no study 'nope'"):
        open_earlier_studies(spec, [f"{url}:nope"])
    assert not (tmp_path / "missing.db").exists()


def test_a_source_of_estimates_only_says_why_nothing_was_imported(tmp_path):
    from primus_optuna.run.analytical import AnalyticalRunner

    spec = StudySpec.from_dict(small_moe_study())
    url = f"sqlite:///{tmp_path / 'estimates.db'}"
    handle = open_study(
        spec, storage=url, pruner=study_pruner(spec, launches_jobs=False), heartbeat_interval=None
    )
    handle.study.sampler = PrimusSampler(spec, seed=0)
    handle.study.optimize(
        make_objective(spec, AnalyticalRunner(spec), runs_dir=tmp_path / "runs"), n_trials=3
    )
    done = sum(t.state == State.COMPLETE for t in handle.study.trials)
    ws = open_earlier_studies(spec, [url])
    assert ws.pairs == []
    assert f"{url}: {done} trials estimated by the analytical runner are not imported" in ws.summary()
