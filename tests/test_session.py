"""The library session ``primus-optuna run`` uses (issue 39): Python users open the same study, sampler,
pruner and objective, and get the same refusals."""

from __future__ import annotations

import pytest

from primus_optuna import StudySpec
from primus_optuna.errors import SpecError
from primus_optuna.run.base import RunFailure
from primus_optuna.search.sampler import PrimusSampler
from primus_optuna.session import ANALYTICAL_HEARTBEAT_S, open_session
from tests.cli.test_impossible import IMPOSSIBLE
from tests.conftest import small_moe_study


def test_a_session_opens_runs_and_resumes_the_study_as_run_does(tmp_path):
    spec = StudySpec.from_dict(small_moe_study(n_trials=3))
    url = f"sqlite:///{tmp_path / 's.db'}"
    session = open_session(spec, storage=url)
    assert isinstance(session.study.sampler, PrimusSampler) and session.llm is None
    assert session.n_trials == 3 and session.runner.kind == "analytical"
    assert session.study._storage.get_heartbeat_interval() == ANALYTICAL_HEARTBEAT_S
    session.study.optimize(session.objective, n_trials=session.n_trials, catch=(RunFailure,))
    again = open_session(spec, storage=url)
    assert len(again.study.trials) == 3 and not again.handle.created
    edited = StudySpec.from_dict(
        {**small_moe_study(), "workload": {**small_moe_study()["workload"], "seq_length": 8192}}
    )
    with pytest.raises(SpecError, match="different search space"):
        open_session(edited, storage=url)


def test_a_session_where_nothing_fits_is_refused_and_writes_nothing(tmp_path):
    with pytest.raises(SpecError, match="no configuration fits"):
        open_session(StudySpec.from_dict(IMPOSSIBLE), storage=f"sqlite:///{tmp_path / 'x.db'}")
    assert not (tmp_path / "x.db").exists()
    with pytest.raises(SpecError, match="--study-name"):
        open_session(StudySpec.from_dict(small_moe_study()), study_name="a/b")
