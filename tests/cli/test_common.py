"""Helpers shared by the subcommands."""

from __future__ import annotations

import optuna

from primus_optuna.cli._common import trial_value_text


def test_a_trial_value_carries_its_kind():
    def trial(source):
        attrs = {} if source is None else {"source": source}
        return optuna.trial.create_trial(value=1234.56, user_attrs=attrs)

    assert trial_value_text(trial("profiled")) == "1234.6 tokens/s/GPU (projected)"
    assert trial_value_text(trial("analytical")) == "1234.6 tokens/s/GPU (estimated)"
    assert trial_value_text(trial(None)) == "1234.6 tokens/s/GPU"
    assert trial_value_text(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL)) == ""
