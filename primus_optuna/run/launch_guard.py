"""Stop a run whose launches all fail the same way: a wrong path, a missing launcher or a broken environment
fails every trial identically, and a search over hundreds of trials would record each of them.

Example::

    guard = RepeatedLaunchFailure(first_trial=len(study.trials))
    study.optimize(objective, n_trials=100, catch=(RunFailure,), callbacks=[guard])
    if guard.message:
        print(guard.message)
"""

from __future__ import annotations

import re

import optuna

from ..search.attrs import FAILURE_REASON
from .base import LaunchFailure

LIMIT = 3
"""consecutive identical launch failures that stop the run"""


def _signature(trial: optuna.trial.FrozenTrial) -> str | None:
    """The last non-empty line of a launch failure's log with numbers blanked (pids, ports, times differ
    between identical failures); None for any other outcome."""
    if trial.state != optuna.trial.TrialState.FAIL:
        return None
    if trial.user_attrs.get(FAILURE_REASON) != LaunchFailure.reason:
        return None
    lines = [ln.strip() for ln in str(trial.user_attrs.get("log_tail", "")).splitlines() if ln.strip()]
    return re.sub(r"\d+", "#", lines[-1]) if lines else ""


class RepeatedLaunchFailure:
    """Optuna callback: stops the study once the last :data:`LIMIT` finished trials of this run (numbers
    from ``first_trial``) failed to launch with the same last log line; :attr:`message` then says why. The
    trials are read from the storage, so parallel workers' trials count in their order."""

    def __init__(self, first_trial: int, limit: int = LIMIT) -> None:
        self.first_trial = first_trial
        self.limit = limit
        self.message: str | None = None

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        finished = [
            t
            for t in study.get_trials(deepcopy=False)
            if t.number >= self.first_trial and t.state.is_finished()
        ]
        last = sorted(finished, key=lambda t: t.number)[-self.limit :]
        if len(last) < self.limit:
            return
        sigs = {_signature(t) for t in last}
        if len(sigs) != 1 or None in sigs:
            return
        lines = [ln for ln in str(last[-1].user_attrs.get("log_tail", "")).splitlines() if ln.strip()]
        self.message = (
            f"trials {', '.join(f'#{t.number}' for t in last)} failed to launch the same way"
            + (f" ({lines[-1].strip()[:300]})" if lines else "")
            + "; stopped the run: check runner.options (paths, launcher, environment) and the trial logs, then "
            "run the same command again"
        )
        study.stop()


__all__ = ["LIMIT", "RepeatedLaunchFailure"]
