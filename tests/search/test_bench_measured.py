"""The replay harness of scripts/bench_measured.py: its objective returns the CSV's measured value, refuses what
vTrain did not measure, and a search on one small held-back landscape counts measured trials only."""

import csv

import optuna
import pytest

from primus_optuna.physics import calibration
from primus_optuna.search.attrs import PRUNE_REASON
from primus_optuna.space import Space
from tests.helpers.scripts import load_script
from tests.helpers.vtrain import CSV, load_rows, split_groups

GROUP = (1024, 24, 4)
"""held back with split seed 0; 9 measured rows on 8 GPUs"""


bench = load_script("bench_measured")


@pytest.fixture(scope="module")
def land():
    rows = load_rows()
    assert GROUP in split_groups(rows, 0)[1]
    (out,) = bench.build_landscapes(rows, {GROUP}, [8], min_points=1)
    return out


def _csv_tps(tp: int, pp: int, mbs: int) -> float:
    """tokens/s/GPU of the CSV row of GROUP on 8 GPUs, read from the file directly."""
    h, layers, gbs = GROUP
    with CSV.open() as fh:
        for r in csv.DictReader(fh):
            key = (r["hidden size"], r["# layers"], r["global batch"], r["# GPUs"])
            par = (r["tensor parallelism"], r["pipeline parallelism"], r["micro batch"])
            if key == (str(h), str(layers), str(gbs), "8") and par == (str(tp), str(pp), str(mbs)):
                return gbs * 1024 / (float(r["iteration time (ms)"]) / 1000) / 8
    raise AssertionError(f"no CSV row TP{tp} PP{pp} MBS{mbs}")


def _study():
    return optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))


def test_replay_returns_the_measured_value(land):
    space = Space(land.spec)
    measured = sorted(land.measured, key=lambda c: c.key())
    # 9 rows, every one legal: 1F1B runs with fewer micro-batches than stages (PP4 at GBS 4)
    assert len(measured) == 9 and not land.illegal
    assert any(c.pp == 4 and c.mbs * c.dp * 4 > 4 for c in measured)
    study = _study()
    for c in measured:
        study.enqueue_trial(c.to_params())
    study.optimize(bench.ReplayObjective(land), n_trials=len(measured))
    for c, t in zip(measured, study.trials, strict=True):
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert space.canonical(c) == c
        assert t.value == pytest.approx(_csv_tps(c.tp, c.pp, c.mbs), rel=1e-12)


def test_an_unmeasured_legal_configuration_is_pruned_and_not_counted(land):
    space = Space(land.spec)
    unmeasured = [c for c in space.configs() if c not in land.measured]
    assert unmeasured  # TP2/4/8 at PP1 were not run on 8 GPUs at GBS 4
    study = _study()
    study.enqueue_trial(unmeasured[0].to_params())
    study.optimize(bench.ReplayObjective(land), n_trials=1)
    (t,) = study.trials
    assert t.state == optuna.trial.TrialState.PRUNED
    assert t.user_attrs[PRUNE_REASON].startswith("unmeasured:")
    assert bench.ReplayObjective(land).value(unmeasured[0]) is None


def test_a_search_counts_measured_trials_and_top_k_follows_the_model(land):
    run = bench.run_sampler(land, "primus", 0, n_measured=4, max_trials=40)
    assert len(run.values) == 4 and set(run.values) <= set(land.measured.values())
    assert bench.fraction(run.values, 4, land.best) <= 1.0
    fam = calibration.FAMILIES["ampere"]
    rep = bench.bench_landscape(land, fam, ["top-k"], [0], n_measured=len(land.measured), max_trials=40)
    top = rep.of("top-k")[0].values
    assert sorted(top) == sorted(land.measured.values())  # every measured point, in the model's order
    assert top[rep.best_model_rank - 1] == land.best
    assert bench.trials_to(top, land.best, target=1.0) == rep.best_model_rank


def test_only_held_back_groups_are_searched():
    h, layers, gbs = sorted(split_groups(load_rows(), 0)[0])[0]
    with pytest.raises(SystemExit) as e:
        bench.main(["--groups", f"{h}x{layers}x{gbs}"])
    assert e.value.code == 2
