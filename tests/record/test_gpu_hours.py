"""The GPU-hour account: spent on launched jobs, not spent thanks to the memory filter and early stopping."""

from __future__ import annotations

import optuna
import pytest

from primus_optuna.record.gpu_hours import gpu_hours_account
from primus_optuna.record.report import gpu_hours_saved, record_of
from primus_optuna.space import Space
from tests.helpers.recorded_study import small_spec

Dist = optuna.distributions.CategoricalDistribution


def test_account_adds_spent_and_saved_hours() -> None:
    spec = small_spec()
    space = Space(spec)
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("primus_spec", spec.to_public_dict())
    params = space.canonical(space.baseline).to_params()

    base = space.canonical(space.baseline)
    other = next(c for c in space.configs() if c != base).to_params()

    def add(state, value=None, p=params, **attrs):
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=value,
                params=p,
                distributions={k: Dist([v]) for k, v in p.items()},
                user_attrs=attrs,
            )
        )

    S = optuna.trial.TrialState
    add(S.COMPLETE, 4500.0, gpu_hours=2.5, source="measured", step_time_s=3.0)
    add(S.FAIL, gpu_hours=0.25, failure_reason="oom")
    add(S.PRUNED, gpu_hours=0.5, prune_reason="slow: 300.0 tokens/s/GPU ...", gpu_hours_saved_early_stop=1.75)
    # another configuration: one pruned and later launched anyway saved nothing
    add(S.PRUNED, p=other, prune_reason="memory: 150.2 GiB on stage 0 > 126.0 GiB usable", step_time_s=4.0)
    add(S.PRUNED, prune_reason="duplicate: same configuration as trial 0 (complete)")
    rec = record_of(study)
    acct = gpu_hours_account(rec)
    assert acct.spent == pytest.approx(3.25) and acct.launched == 3
    assert acct.saved_early_stop == pytest.approx(1.75) and acct.stopped == 1
    # the memory filter's figure is the report's: estimated step time x measured steps (train_iters 20) x GPUs
    assert acct.memory_pruned == 1
    assert acct.saved_memory == pytest.approx(gpu_hours_saved(rec)[0])
    assert acct.saved_memory == pytest.approx(4.0 * 20 * spec.world / 3600)
    line = acct.line()
    assert line.startswith("GPU-hours: 3.25 spent on 3 launched jobs; not spent: ")
    assert "1.75 thanks to early stopping (1 job stopped early)" in line


def test_account_of_a_study_that_launched_nothing() -> None:
    from primus_optuna.record.gpu_hours import GpuHoursAccount

    acct = GpuHoursAccount(
        spent=0.0, launched=0, saved_memory=1.5, memory_pruned=2, saved_early_stop=0, stopped=0
    )
    assert (
        acct.line()
        == "GPU-hours: no job launched; the memory filter pruned 2 trials that would have cost 1.50 (estimated)"
    )
