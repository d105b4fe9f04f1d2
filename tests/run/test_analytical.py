from pathlib import Path

import pytest

from primus_optuna import Space, StudySpec
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.run.analytical import AnalyticalRunner
from primus_optuna.run.base import OutOfMemory, RunContext, Runner
from primus_optuna.run.factory import make_runner
from tests.conftest import small_moe_study


def test_the_estimate_is_the_value(tmp_path: Path):
    spec = StudySpec.from_dict(small_moe_study())
    space = Space(spec)
    config = next(c for c in space.configs() if estimate_memory(spec, c).fits)
    runner = make_runner(spec)
    assert isinstance(runner, AnalyticalRunner) and isinstance(runner, Runner) and runner.kind == "analytical"
    m = runner.run(config, RunContext(spec, tmp_path))
    est = estimate_throughput(spec, config)
    assert m.source == "analytical"
    assert m.tokens_per_s_per_gpu == pytest.approx(est.tokens_per_s_per_gpu)
    assert m.step_time_s == pytest.approx(est.step_time_s)
    assert m.peak_memory_gib == pytest.approx(estimate_memory(spec, config).peak_gib)
    assert set(m.details["breakdown_s"]) == set(est.breakdown_s)


def test_a_configuration_that_does_not_fit_is_an_out_of_memory_failure(tmp_path: Path):
    spec = StudySpec.from_dict(small_moe_study())
    space = Space(spec)
    config = next(c for c in space.configs() if not estimate_memory(spec, c).fits)
    with pytest.raises(OutOfMemory) as exc:
        AnalyticalRunner(spec).run(config, RunContext(spec, tmp_path))
    assert exc.value.reason == "oom" and "GiB" in str(exc.value)
