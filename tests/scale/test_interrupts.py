"""Ctrl-C and ``kill -TERM`` on the real ``primus-optuna run`` (subprocesses) with a launched job running."""

import os
import signal

import optuna
import pytest

from .helpers import State, cli, finish, job_runner, launches, scale_study, trials, wait_for, write_study

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
