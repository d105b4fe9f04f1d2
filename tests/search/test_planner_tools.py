"""The planner's tools on a study: the ``estimate`` tool's whole step-time breakdown, and each term's
measured-vs-estimated factor once trials are measured."""

from __future__ import annotations

import json

import optuna

from primus_optuna import Space, StudySpec
from primus_optuna.physics.calibration import BREAKDOWN_TERMS, TERM_GROUPS
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.search.fallback import ModelGuidedProposer
from primus_optuna.search.planner_tools import PlannerTools
from primus_optuna.search.suggest import axis_distributions
from tests.conftest import small_moe_study


def _tools(spec: StudySpec, space: Space, study: optuna.Study) -> PlannerTools:
    fallback = ModelGuidedProposer(spec, space)
    return PlannerTools(spec, space, study, study.trials, fallback=fallback)


def test_estimate_shows_every_term_then_measured_vs_estimated_per_term():
    spec = StudySpec.from_dict(small_moe_study())
    space = Space(spec)
    fits = [c for c in space.configs() if estimate_memory(spec, c).fits]
    piped = next(c for c in fits if c.pp > 1)
    study = optuna.create_study(direction="maximize")
    before = json.loads(_tools(spec, space, study).estimate(piped.to_params()))
    est = estimate_throughput(spec, piped)
    assert list(before["step_terms_s"]) == list(BREAKDOWN_TERMS)  # every term, not the three largest
    assert abs(sum(before["step_terms_s"].values()) - est.step_time_s) < 1e-3
    assert before["busiest_stage"] == est.busiest_stage
    assert len(before["pipeline_work_s_per_stage"]) == len(before["peak_gib_per_stage"]) == piped.pp
    assert "measured_vs_estimated" not in before  # nothing measured yet
    # a cluster whose communication takes twice the model's time: measured trials say so, term by term
    comm = set(TERM_GROUPS["communication"])
    dist = axis_distributions(space)
    for c in fits[:: max(1, len(fits) // 12)][:12]:
        e = estimate_throughput(spec, c)
        step = sum(v * (2.0 if t in comm else 1.0) for t, v in e.breakdown_s.items())
        study.add_trial(
            optuna.trial.create_trial(
                params=c.to_params(),
                distributions=dist,
                value=e.tokens_per_s_per_gpu * e.step_time_s / step,
            )
        )
    after = json.loads(_tools(spec, space, study).estimate(piped.to_params()))
    res = after["measured_vs_estimated"]
    assert res["measured_trials"] == 12
    terms = res["terms"]
    assert set(terms) == {t for t, v in est.breakdown_s.items() if v > 0}
    comm_terms = [t for t in terms if t in comm]
    assert comm_terms
    for t in comm_terms:
        # the calibration's fit (ridge towards one global scale) puts more of the gap on communication
        assert terms[t]["measured_over_estimated"] > terms["compute_mlp"]["measured_over_estimated"] > 1.0
        assert (
            abs(terms[t]["calibrated_s"] - terms[t]["estimated_s"] * terms[t]["measured_over_estimated"])
            < 2e-3
        )
