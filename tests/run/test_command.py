"""The command runner with a fake launcher: recorded logs, OOM, hang, crash, no throughput, templates."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from primus_optuna.errors import SpecError
from primus_optuna.run.base import LaunchFailure, NoThroughput, OutOfMemory, RunContext, RunTimeout
from primus_optuna.run.command import CommandRunner, render, template_fields
from tests.helpers.runners import baseline, fake_argv, mixtral_spec


@pytest.fixture
def spec():
    return mixtral_spec()


def _ctx(spec, tmp_path: Path, n: int = 0) -> RunContext:
    return RunContext(spec=spec, workdir=tmp_path / f"trial-{n}", trial_number=n, study_name="t")


def test_replays_megatron_log(spec, tmp_path: Path) -> None:
    m = CommandRunner(spec, fake_argv("replay", "megatron.log")).run(baseline(spec), _ctx(spec, tmp_path))
    assert m.source == "measured"
    assert m.step_time_s == pytest.approx(36.2501)
    assert m.tokens_per_s_per_gpu == pytest.approx(8192 * 128 / 36.2501 / 64)
    assert m.peak_memory_gib == pytest.approx(147.0)
    assert m.peak_reserved_gib == pytest.approx(160000.0 / 1024)  # its "max reserved", beside the peak
    assert Path(m.log_path or "").read_text().count("consumed samples") == 7
    assert m.details["iterations_averaged"] == [3, 4, 5, 6, 7]


def test_replays_primus_log(spec, tmp_path: Path) -> None:
    m = CommandRunner(spec, fake_argv("replay", "primus.log")).run(baseline(spec), _ctx(spec, tmp_path))
    assert m.tokens_per_s_per_gpu == pytest.approx(3620.8)
    assert m.peak_memory_gib is None  # "hip mem usage" is one rank's memory in use, not a peak
    assert m.peak_reserved_gib is None


def test_oom(spec, tmp_path: Path) -> None:
    with pytest.raises(OutOfMemory) as exc:
        CommandRunner(spec, fake_argv("oom")).run(baseline(spec), _ctx(spec, tmp_path))
    assert exc.value.reason == "oom"
    assert "HIP out of memory" in exc.value.log_tail
    assert Path(exc.value.log_path or "").is_file()


def test_hang_is_killed_with_its_process_group(spec, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    runner = CommandRunner(spec, fake_argv("hang", str(pidfile)), timeout_s=2.0)
    with pytest.raises(RunTimeout) as exc:
        runner.run(baseline(spec), _ctx(spec, tmp_path))
    assert exc.value.reason == "timeout" and "iteration 1/" in exc.value.log_tail
    child = int(pidfile.read_text())
    for _ in range(50):  # the orphaned child is reaped by init shortly after SIGKILL
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child}/status").read_text().find("State:\tZ") >= 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the launcher's child survived the timeout")


def test_crash(spec, tmp_path: Path) -> None:
    with pytest.raises(LaunchFailure) as exc:
        CommandRunner(spec, fake_argv("crash")).run(baseline(spec), _ctx(spec, tmp_path))
    assert exc.value.reason == "launch_failed" and "code 3" in str(exc.value)
    assert "bad launch configuration" in exc.value.log_tail


def test_teardown_crash_after_the_last_iteration_keeps_the_measurement(spec, tmp_path: Path) -> None:
    m = CommandRunner(spec, fake_argv("teardown")).run(baseline(spec), _ctx(spec, tmp_path))
    assert m.tokens_per_s_per_gpu == pytest.approx(7.0) and m.details["exit_code"] == 134
    with pytest.raises(LaunchFailure, match="code 134"):
        CommandRunner(spec, fake_argv("midway")).run(baseline(spec), _ctx(spec, tmp_path, 1))


def test_missing_executable(spec, tmp_path: Path) -> None:
    with pytest.raises(LaunchFailure, match="could not start"):
        CommandRunner(spec, ["/nonexistent/launcher"]).run(baseline(spec), _ctx(spec, tmp_path))


def test_no_throughput(spec, tmp_path: Path) -> None:
    with pytest.raises(NoThroughput) as exc:
        CommandRunner(spec, fake_argv("silent")).run(baseline(spec), _ctx(spec, tmp_path))
    assert exc.value.reason == "no_throughput" and "nothing logged" in exc.value.log_tail


def test_templates_render_one_argv_element_each(spec, tmp_path: Path) -> None:
    argv = fake_argv("echo", "--tp={tp}", "{pp}", "{recompute} {mbs}", "{workdir}/x", "{{literal}}")
    runner = CommandRunner(spec, argv, env={"FAKE_TP": "tp{tp}"})
    m = runner.run(baseline(spec), _ctx(spec, tmp_path))
    lines = Path(m.log_path or "").read_text().splitlines()
    work = str((tmp_path / "trial-0").resolve())
    assert lines[:6] == ["ARG --tp=1", "ARG 4", "ARG none 2", f"ARG {work}/x", "ARG {literal}", "ENV tp1"]


@pytest.mark.parametrize(
    "template", ["{tp.__class__}", "{tp[0]}", "{tp!r}", "{mbs:>10}", "{unknown}", "{os}", "{"]
)
def test_bad_templates_are_refused_up_front(spec, template: str) -> None:
    with pytest.raises(SpecError):
        CommandRunner(spec, ["echo", template])


def test_injected_values_never_reach_argv(spec, tmp_path: Path) -> None:
    runner = CommandRunner(spec, fake_argv("echo", "{recompute}", "{tp}"))

    def forced(axis: str, value: object):
        """A config with a bad categorical value, which TrainingConfig itself refuses to build."""
        with pytest.raises(ValueError, match=axis):
            dataclasses.replace(baseline(spec), **{axis: value})
        c = dataclasses.replace(baseline(spec))
        object.__setattr__(c, axis, value)
        return c

    evil = [
        forced("recompute", "none; rm -rf /"),
        forced("moe_dispatcher", "$(reboot)"),
        dataclasses.replace(baseline(spec), tp="1 --evil"),  # type: ignore[arg-type]
        dataclasses.replace(baseline(spec), mbs=2.5),  # type: ignore[arg-type]
        baseline(spec).replace(tp=3),  # illegal: not launched either
    ]
    for i, config in enumerate(evil):
        with pytest.raises(LaunchFailure, match="refused"):
            runner.run(config, _ctx(spec, tmp_path, i))
        assert not (tmp_path / f"trial-{i}" / "run.log").exists()


def test_template_helpers() -> None:
    assert template_fields("a{tp}b{mbs}") == ["tp", "mbs"]
    assert render("a{tp}b", {"tp": "2"}) == "a2b"


@pytest.mark.parametrize(
    ("args", "state", "reason"),
    [
        (("replay", "megatron.log"), "COMPLETE", None),
        (("replay", "primus.log"), "COMPLETE", None),
        (("oom",), "FAIL", "oom"),
        (("hang", "PIDFILE"), "FAIL", "timeout"),
        (("crash",), "FAIL", "launch_failed"),
        (("silent",), "FAIL", "no_throughput"),
    ],
)
def test_each_outcome_is_the_right_trial_state(spec, tmp_path: Path, args: tuple, state: str, reason) -> None:
    import optuna

    from primus_optuna.run.base import RunFailure
    from primus_optuna.run.objective import make_objective

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    args = tuple(str(tmp_path / "pid") if a == "PIDFILE" else a for a in args)
    runner = CommandRunner(spec, fake_argv(*args), timeout_s=2.0)
    store = optuna.artifacts.FileSystemArtifactStore(str(tmp_path / "artifacts"))
    (tmp_path / "artifacts").mkdir()
    study = optuna.create_study(direction="maximize")
    fits = baseline(spec).replace(recompute="full")  # the memory model says it fits: an OOM is a model miss
    study.enqueue_trial(fits.to_params())
    objective = make_objective(spec, runner, artifact_store=store, runs_dir=tmp_path / "runs")
    study.optimize(objective, n_trials=1, catch=(RunFailure,))
    t = study.trials[0]
    assert t.state.name == state
    if reason is None:
        assert t.user_attrs["source"] == "measured"
        assert t.user_attrs["measured_tokens_per_s_per_gpu"] == pytest.approx(t.value, abs=1e-3)
        est = t.user_attrs["estimate_tokens_per_s_per_gpu"]
        assert t.user_attrs["estimate_error"] == pytest.approx(est / t.value - 1, abs=1e-4)
    else:
        assert t.user_attrs["failure_reason"] == reason
        assert t.user_attrs["log_tail"]
        assert optuna.artifacts.get_all_artifact_meta(t, storage=study._storage)  # the log is attached
        assert t.user_attrs.get("memory_model_miss", False) == (reason == "oom")


def test_stop_flag_forwards_the_signal_to_the_job_group_and_waits(spec, tmp_path: Path) -> None:
    """A signal handled by another thread (``run --n-jobs``) reaches a job this thread waits for."""
    import signal
    import threading

    from primus_optuna.run.interrupt import Interrupted, request_stop, reset_stop

    pidfile = tmp_path / "child.pid"
    runner = CommandRunner(spec, fake_argv("hang", str(pidfile)), timeout_s=60.0)
    timer = threading.Timer(1.0, request_stop, args=(signal.SIGTERM,))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Interrupted) as exc:
            runner.run(baseline(spec), _ctx(spec, tmp_path))
    finally:
        timer.cancel()
        reset_stop()
    assert exc.value.signum == signal.SIGTERM and exc.value.log_path
    assert time.monotonic() - t0 < 30
    child = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the job's child outlived the interrupt")


def test_run_launch_stops_the_whole_process_group_on_ctrl_c(tmp_path) -> None:
    """An interrupt while waiting (the CLI's Ctrl-C) ends the launched process and the children it started,
    then goes on; a launch that ends returns its exit code."""
    import os
    import signal
    import threading
    import time

    from primus_optuna.run.command import Launch, run_launch
    from primus_optuna.run.interrupt import Interrupted

    assert run_launch(Launch(argv=["sh", "-c", "exit 3"], env={}), tmp_path / "a.log", 30) == 3
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $! > {pids}; wait"

    def interrupt(signum: int, frame: object) -> None:  # as handle_signals raises it (a shell's background
        raise Interrupted(signal.SIGTERM)  # job ignores SIGINT, so the group is sent SIGTERM here)

    old = signal.signal(signal.SIGUSR1, interrupt)
    try:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGUSR1)).start()
        with pytest.raises(KeyboardInterrupt):
            run_launch(Launch(argv=["sh", "-c", script], env={}), tmp_path / "b.log", 30)
    finally:
        signal.signal(signal.SIGUSR1, old)
    child = int(pids.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the launched process's child outlived the interrupt")
