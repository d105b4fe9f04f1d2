"""Helpers of the scale-out and fault-injection tests: a small study, the CLI as a subprocess, a fake job.

``cli_driver.py`` runs the real ``primus-optuna`` command line; the only test tweaks, from the environment,
are a short heartbeat (the CLI's is 30 s with a 90 s grace period) and a self-kill inside one runner call.
``job.py`` is a stand-in training job for the ``command`` runner (see its docstring).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DRIVER = HERE / "cli_driver.py"
JOB = HERE / "job.py"
State = optuna.trial.TrialState


def scale_study(name: str = "scale", **extra: Any) -> dict[str, Any]:
    """Llama 3.1 8B on 8 H100 with a few axes: 24 legal configurations, 21 fit, a 4-point sweep set in the
    study file (``search.sweep_trials``), so a measured study runs it in the plan's order (the tests check
    the order across kills and restarts; the default sweep's order follows the measurements)."""
    data: dict[str, Any] = {
        "name": name,
        "model": {"catalog": "llama3.1-8b"},
        "cluster": {"gpu": "h100", "nodes": 1, "gpus_per_node": 8},
        "workload": {"seq_length": 4096, "global_batch_size": 64, "precision": "bf16"},
        "search": {
            "baseline": {"tp": 2, "pp": 2, "mbs": 1},
            "sweep_trials": 4,
            "axes": {
                "tp": [1, 2, 4],
                "pp": [1, 2],
                "mbs": [1, 2],
                "recompute": ["none", "full"],
                "cp": [1],
                "vpp": [1],
                "pp_schedule": ["1f1b"],
            },
        },
    }
    data.update(extra)
    return data


def job_runner(ctl: Path) -> dict[str, Any]:
    """``runner:`` section running :data:`JOB` with the control directory ``ctl``."""
    return {
        "kind": "command",
        "options": {
            "argv": [sys.executable, str(JOB), str(ctl), "{trial}", "{tp}", "{pp}", "{mbs}", "{recompute}"],
            "timeout_s": 60,
        },
    }


def write_study(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli(
    args: Sequence[Any], *, cwd: Path, env: dict[str, str] | None = None, script: bool = False
) -> subprocess.Popen[str]:
    """Start ``primus-optuna ARGS`` (the console script when ``script``, else through :data:`DRIVER`)."""
    console = Path(sys.executable).with_name("primus-optuna")
    argv = [str(console)] if script and console.exists() else [sys.executable, str(DRIVER)]
    path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
    full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.Popen(
        [*argv, *(str(a) for a in args)],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def wait_for(
    cond: Callable[[], Any],
    *,
    proc: subprocess.Popen[str] | None = None,
    timeout: float = 60,
    what: str = "condition",
) -> Any:
    """Poll ``cond`` until it is truthy; fail early with its output if ``proc`` exits meanwhile."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(
                f"process exited ({proc.returncode}) before {what}:\n{out[-2000:]}\n{err[-3000:]}"
            )
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def launches(ctl: Path) -> list[tuple[int, int, str]]:
    """``(trial, pid, "tp pp mbs recompute")`` of every job started so far, by trial number."""
    out = []
    for f in ctl.glob("launch-*"):
        _, trial, pid = f.name.split("-")
        out.append((int(trial), int(pid), f.read_text()))
    return sorted(out)


def kill_job(pid: int) -> None:
    """SIGKILL a job this test started (its own process group, as the command runner starts it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=url)
    return sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
