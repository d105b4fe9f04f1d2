"""Ctrl-C and ``kill -TERM`` on the real ``primus-optuna run`` (subprocesses): with a launched job running, and on the analytical runner."""

import os
import signal

import optuna
import pytest

from .helpers import (
    ROOT,
    State,
    cli,
    finish,
    job_runner,
    launches,
    scale_study,
    trials,
    wait_for,
    write_study,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_stops_the_job_fails_the_trial_and_resume_reruns_it_first(tmp_path, sig):
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "hold-all").write_text("")  # the job runs until the signal arrives
    study = write_study(tmp_path / "study.yaml", scale_study(runner=job_runner(ctl)))
    url = f"sqlite:///{tmp_path / 'i.db'}"
    args = ["run", study, "--storage", url, "--no-llm", "--no-progress"]
    proc = cli([*args, "--n-trials", 3], cwd=tmp_path)
    (_, job_pid, _), *_ = wait_for(lambda: launches(ctl), proc=proc, what="the baseline's job to start")
    proc.send_signal(sig)  # to `run` only: the job is in its own session, as on a cluster
    rc, out, err = finish(proc, timeout=60)
    assert rc == 128 + sig, err[-3000:]
    # the signal reached the job and `run` waited for it to end: no busy GPU left behind
    assert (ctl / f"stopped-0-{signal.Signals(sig).name}").exists()
    assert not _alive(job_pid)
    assert "Traceback" not in err and "Traceback" not in out
    assert "interrupted" in err and "#0" in err and "re-run first" in err
    (t0,) = trials(url, "scale")
    assert t0.state == State.FAIL and t0.user_attrs["failure_reason"] == "interrupted"
    assert t0.user_attrs["sweep_axis"] == "baseline"
    assert t0.user_attrs["gpu_hours"] > 0  # the stopped job's GPU time is accounted for

    (ctl / "hold-all").unlink()
    rc, out, err = finish(cli([*args, "--n-trials", 2], cwd=tmp_path))
    assert rc == 0, err[-3000:]
    assert "re-running first the interrupted trial(s) #0" in out
    ts = trials(url, "scale")
    retry = ts[1]
    assert retry.state == State.COMPLETE and retry.user_attrs["retry_of"] == 0
    assert retry.user_attrs["sweep_axis"] == "baseline" and retry.params == t0.params
    assert "gain over the baseline (trial 1" in out  # the re-run baseline is the baseline
    # a second resume does not re-run it again
    rc, out, _ = finish(cli([*args, "--n-trials", 1], cwd=tmp_path))
    assert rc == 0 and "re-running first" not in out


def _trial_count(url: str, name: str) -> int:
    try:
        return len(trials(url, name))
    except KeyError:  # the study does not exist yet
        return 0


@pytest.mark.parametrize("moment", ["opening", "searching"])
def test_ctrl_c_on_the_analytical_runner_exits_130_and_leaves_no_trial_running(tmp_path, moment):
    # the analytical runner spends its time in the sampler's decision, in Optuna's tell (after_trial) and in
    # SQLAlchemy: a KeyboardInterrupt raised there was lost in a weakref callback (the run went on, exit 0),
    # became an UnboundLocalError in Optuna's _run_trial, or left the trial RUNNING
    study = ROOT / "studies" / "mixtral-8x22b-mi355x-fp8.yaml"
    db = tmp_path / "c.db"
    url = f"sqlite:///{db}"
    name = "mixtral-8x22b-mi355x-fp8"
    proc = cli(["run", study, "--storage", url, "--n-trials", 200, "--no-llm"], cwd=tmp_path)
    if moment == "opening":  # the storage file exists: the study is being created and its sweep designed
        wait_for(db.exists, proc=proc, what="the storage file")
    else:
        wait_for(lambda: _trial_count(url, name) >= 3, proc=proc, what="three trials")
    proc.send_signal(signal.SIGINT)
    rc, out, err = finish(proc)
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    assert "interrupted (SIGINT)" in err and "run the same command again" in err
    ts = trials(url, name) if _trial_count(url, name) else []
    assert not [t.number for t in ts if t.state == State.RUNNING]
    assert len(ts) < 200
    rc, out, err = finish(cli(["run", study, "--storage", url, "--n-trials", 2, "--no-llm"], cwd=tmp_path))
    assert rc == 0, err[-3000:]
    done = [t.user_attrs["config_key"] for t in trials(url, name) if t.state == State.COMPLETE]
    assert len(done) == len(set(done)) >= 2
