"""Live log following and early stopping: intermediate values, ThroughputPruner, the stopped process group."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import pytest

from primus_optuna.physics.memory import estimate_memory
from primus_optuna.record.dashboard import dashboard_app
from primus_optuna.run.base import RunContext, RunFailure
from primus_optuna.run.command import CommandRunner
from primus_optuna.run.follow import LogFollower
from primus_optuna.run.objective import make_objective
from primus_optuna.search.calibrations import study_calibrations
from primus_optuna.search.early_stop import ThroughputPruner, slow_verdict
from primus_optuna.search.pruner import MemoryPrefilterPruner
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from tests.helpers.runners import fake_argv, mixtral_spec

optuna.logging.set_verbosity(optuna.logging.WARNING)
State = optuna.trial.TrialState


def test_rule_prunes_clearly_slower_and_keeps_slightly_slower() -> None:
    assert slow_verdict([600.0, 610.0, 605.0], 1000.0).startswith("slow: 605.0 tokens/s/GPU over 3")
    assert slow_verdict([970.0, 975.0, 968.0, 972.0], 1000.0) is None  # 3% below, margin 5%
    assert slow_verdict([600.0, 600.0], 1000.0) is None  # fewer than min_iters
    # the same median with a large iteration-to-iteration spread gets more slack
    steady, noisy = [900.0, 900.0, 900.0], [600.0, 900.0, 1200.0]
    assert slow_verdict(steady, 1000.0) and slow_verdict(noisy, 1000.0) is None


def test_pruner_validates_its_thresholds() -> None:
    with pytest.raises(ValueError, match="margin"):
        ThroughputPruner(margin=1.5)
    with pytest.raises(Exception, match="min_iters"):
        StudySpec.from_dict({**_spec_dict(), "search": {"early_stop": {"min_iters": 1}}})


def _spec_dict() -> dict[str, Any]:
    return mixtral_spec().to_dict()


def test_follower_reads_only_complete_new_lines_after_warmup(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    f = LogFollower(log, seq_length=8192, world_size=64, global_batch_size=128, warmup_iters=2)
    assert f.poll() == []  # no file yet
    line = " iteration {i}/ 9 | elapsed time per iteration (ms): {ms} |\n"
    log.write_text("".join(line.format(i=i, ms=40000.0) for i in (1, 2, 3)) + " iteration 4/ 9 | elap")
    got = f.poll()
    assert [it.iteration for it in got] == [3] and got[0].target == 9
    assert got[0].tokens_per_s_per_gpu == pytest.approx(8192 * 128 / 40.0 / 64)
    with log.open("a") as fh:  # the rest of line 4, and iteration 4 again from another rank
        fh.write("sed time per iteration (ms): 20000.0 |\n" + line.format(i=4, ms=99999.0))
    got = f.poll()
    assert [it.iteration for it in got] == [4] and got[0].step_time_s == pytest.approx(20.0)


class _PerTrial:
    """A launching runner whose fake job prints the given per-iteration tokens/s/GPU for each trial."""

    kind = "command"
    launches_jobs = True

    def __init__(self, spec: StudySpec, tmp: Path, values: dict[int, list[float]], delay: float) -> None:
        self.spec, self.tmp, self.values, self.delay = spec, tmp, values, delay

    def run(self, config: Any, context: RunContext) -> Any:
        pidfile = self.tmp / f"child-{context.trial_number}.pid"
        vals = ",".join(str(v) for v in self.values[context.trial_number or 0])
        runner = CommandRunner(self.spec, fake_argv("steps", str(self.delay), str(pidfile), vals))
        runner.poll_s = 0.05
        return runner.run(config, context)


def _gone(pid: int) -> bool:
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def stopped_study(tmp_path: Path) -> tuple[optuna.Study, str]:
    """Trial 0 completes at 1000 tokens/s/GPU; trial 1 slows to 500 (stopped); trial 2 runs at 980 (kept)."""
    spec = mixtral_spec()
    url = f"sqlite:///{tmp_path / 'es.db'}"
    pruner = MemoryPrefilterPruner(spec=spec, wrapped=ThroughputPruner(min_iters=3, margin=0.05))
    study = optuna.create_study(direction="maximize", storage=url, pruner=pruner, study_name="es")
    study.set_user_attr("primus_spec", spec.to_public_dict())  # what open_study stores (the report reads it)
    values = {0: [1000.0] * 8, 1: [1000.0, 1000.0] + [500.0] * 60, 2: [980.0] * 8}
    objective = make_objective(spec, _PerTrial(spec, tmp_path, values, 0.05), runs_dir=tmp_path / "runs")
    fits = [c for c in Space(spec).configs() if estimate_memory(spec, c).fits][:3]
    for config in fits:  # three distinct configurations (the duplicate guard prunes a repeated one)
        study.enqueue_trial(config.to_params())
    study.optimize(objective, n_trials=3, catch=(RunFailure,))
    return study, url


def test_slow_job_is_stopped_with_its_process_group_and_slightly_slower_runs_to_the_end(
    stopped_study, tmp_path: Path
) -> None:
    study, _ = stopped_study
    done, slow, close = study.trials
    assert done.state == State.COMPLETE and done.value == pytest.approx(1000.0)
    assert sorted(done.intermediate_values) == [3, 4, 5, 6, 7, 8]
    assert slow.state == State.PRUNED
    reason = slow.user_attrs["prune_reason"]
    assert reason.startswith("slow: 500.0 tokens/s/GPU over 3 iterations") and "1000.0" in reason
    assert len(slow.intermediate_values) == 3 and slow.user_attrs["iterations_run"] == 5
    # 57 of 62 iterations left at the median step time (seq 8192 × GBS 128 / 500 / 64 GPUs) on 64 GPUs
    step = 8192 * 128 / 500.0 / 64
    assert slow.user_attrs["gpu_hours_saved_early_stop"] == pytest.approx(57 * step * 64 / 3600, rel=1e-3)
    assert slow.user_attrs["gpu_hours"] > 0
    # its partial measurement (median of the iterations it ran) calibrates the model like a completed trial's
    assert slow.user_attrs["measured_partial"] and slow.user_attrs["measured_tokens_per_s_per_gpu"] == 500.0
    assert study_calibrations(study).step.n_trials == 3
    assert _gone(int((tmp_path / "child-1.pid").read_text())), "the stopped job's child survived"
    assert close.state == State.COMPLETE and close.value == pytest.approx(980.0)
    assert len(close.intermediate_values) == 6 and "prune_reason" not in close.user_attrs


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def test_intermediate_values_show_in_the_dashboard_api(stopped_study, tmp_path: Path) -> None:
    study, url = stopped_study
    server = make_server("127.0.0.1", 0, dashboard_app(url, tmp_path / "art"), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        with urllib.request.urlopen(f"{base}/api/studies", timeout=10) as r:
            sid = json.loads(r.read())["study_summaries"][0]["study_id"]
        with urllib.request.urlopen(f"{base}/api/studies/{sid}", timeout=10) as r:
            trials = json.loads(r.read())["trials"]
    finally:
        server.shutdown()
        thread.join(5)
    slow = next(t for t in trials if t["number"] == 1)
    assert slow["state"] == "Pruned"
    assert [(v["step"], v["value"]) for v in slow["intermediate_values"]] == [
        (3, 500.0),
        (4, 500.0),
        (5, 500.0),
    ]


def test_pruner_holds_jobs_to_measured_trials_only() -> None:
    study = optuna.create_study(direction="maximize")
    est = study.ask()
    est.set_user_attr("source", "analytical")
    study.tell(est, 5000.0)  # an estimate from an earlier analytical run of the study: not a job's throughput
    running = study.ask()
    for i, v in enumerate([600.0, 610.0, 605.0], start=3):
        running.report(v, i)
    pruner = ThroughputPruner()
    assert not pruner.prune(study, study._storage.get_trial(running._trial_id))
    measured = study.ask()
    measured.set_user_attr("source", "measured")
    study.tell(measured, 1000.0)
    assert pruner.prune(study, study._storage.get_trial(running._trial_id))
    assert study._storage.get_trial(running._trial_id).user_attrs["prune_reason"].startswith("slow: 605.0")


def test_a_failing_callback_never_leaves_the_job_running(tmp_path: Path) -> None:
    spec = mixtral_spec()
    pidfile = tmp_path / "child.pid"
    runner = CommandRunner(spec, fake_argv("steps", "0.05", str(pidfile), ",".join(["900.0"] * 60)))
    runner.poll_s = 0.05

    def broken(it: Any, live: bool) -> str | None:
        raise RuntimeError("storage went away")

    ctx = RunContext(spec=spec, workdir=tmp_path / "w", trial_number=0, on_iteration=broken)
    config = next(c for c in Space(spec).configs() if estimate_memory(spec, c).fits)
    with pytest.raises(RuntimeError, match="storage went away"):
        runner.run(config, ctx)
    assert _gone(int(pidfile.read_text()))


def test_report_shows_the_gpu_hours_and_the_stopped_job(stopped_study, tmp_path: Path) -> None:
    from primus_optuna.record.report import build_report

    study, url = stopped_study
    md = build_report(url, "es", tmp_path / "report")["md"].read_text()
    hours = sum(t.user_attrs["gpu_hours"] for t in study.trials)
    assert f"**GPU-hours: {hours:.2f} spent on 3 launched jobs; not spent: " in md
    row = next(line for line in md.splitlines() if line.startswith("| 1 |"))
    assert "500.0" in row and "slow: 500.0 tokens/s/GPU" in row
