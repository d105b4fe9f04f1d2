"""RepeatedLaunchFailure: a run stops once its last trials failed to launch the same way."""

from __future__ import annotations

import optuna

from primus_optuna.run.launch_guard import LIMIT, RepeatedLaunchFailure

DIST = {"x": optuna.distributions.IntDistribution(0, 10)}


def _fail(study: optuna.Study, tail: str, reason: str = "launch_failed") -> None:
    study.add_trial(
        optuna.trial.create_trial(
            params={"x": len(study.trials)},
            distributions=DIST,
            state=optuna.trial.TrialState.FAIL,
            user_attrs={"failure_reason": reason, "log_tail": tail},
        )
    )


def _ok(study: optuna.Study) -> None:
    study.add_trial(optuna.trial.create_trial(params={"x": 0}, distributions=DIST, value=1.0))


def _stops(study: optuna.Study, first: int = 0) -> RepeatedLaunchFailure:
    guard = RepeatedLaunchFailure(first_trial=first)
    study.stop = lambda: setattr(guard, "stopped", True)  # type: ignore[method-assign]
    guard.stopped = False  # type: ignore[attr-defined]
    guard(study, study.trials[-1])
    return guard


def test_identical_launch_failures_stop_the_run_with_the_line() -> None:
    study = optuna.create_study()
    for pid in range(LIMIT - 1):
        _fail(study, f"starting\ntorchrun: pid {pid}: /opt/Megatron-LM/pretrain_gpt.py: No such file")
    g = _stops(study)
    assert not g.stopped and g.message is None  # two are not yet a pattern
    _fail(study, "starting\ntorchrun: pid 77: /opt/Megatron-LM/pretrain_gpt.py: No such file")
    g = _stops(study)
    assert g.stopped and g.message is not None
    assert "trials #0, #1, #2 failed to launch the same way" in g.message
    assert "pretrain_gpt.py: No such file" in g.message and "runner.options" in g.message


def test_different_failures_a_success_or_earlier_runs_do_not_stop_it() -> None:
    study = optuna.create_study()
    _fail(study, "error: tp=3 does not divide 32 heads")
    _fail(study, "CUDA error: an illegal memory access")
    _fail(study, "NCCL timeout")
    assert not _stops(study).stopped
    study = optuna.create_study()
    for _ in range(LIMIT):
        _fail(study, "same")
    _ok(study)
    assert not _stops(study).stopped
    # out of memory is the configuration's fault, not the launch's
    study = optuna.create_study()
    for _ in range(LIMIT):
        _fail(study, "same", reason="oom")
    assert not _stops(study).stopped
    # a resumed run counts its own trials only
    study = optuna.create_study()
    for _ in range(LIMIT):
        _fail(study, "same")
    _fail(study, "same")
    assert not _stops(study, first=LIMIT).stopped
