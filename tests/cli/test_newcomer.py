"""What a newcomer meets first (#22 items 1, 2, 7): progress off a terminal, pasteable next commands, safe
parallelism, a job that does not outlive a killed `run`, strict storage and output paths, one-line OOMs."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from click.testing import CliRunner

from primus_optuna.cli import cli
from tests.conftest import ROOT, small_moe_study
from tests.helpers.runners import FAKE

CLI = [sys.executable, "-c", "import sys; from primus_optuna.cli import main; sys.exit(main())"]


def _write(tmp_path: Path, data: dict, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _cli(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [*CLI, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, **kw
    )


def _launching(tmp_path: Path, *argv: str) -> dict:
    data = small_moe_study()
    data["runner"] = {"kind": "command", "options": {"argv": [sys.executable, FAKE, *argv], "timeout_s": 120}}
    return data


def test_a_run_into_a_log_prints_progress_lines_and_next_commands_that_paste(tmp_path):
    (tmp_path / "runs").mkdir()
    study = _write(tmp_path, small_moe_study())
    r = _cli(["run", study, "--storage", "sqlite:///runs/p.db", "--n-trials", 3], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr + r.stdout  # no progress-bar redraws in a log file
    assert "[1/3] trial 0 complete" in r.stderr and "[3/3] trial 2" in r.stderr
    first = next(x for x in r.stderr.splitlines() if x.startswith("[1/3]"))
    assert " tokens/s/GPU (estimated)" in first  # the analytical runner's value is an estimate, and says so
    assert f"report: {tmp_path / 'runs' / 'p-report'}/report.html" in r.stdout
    nxt = r.stdout.split("next:\n", 1)[1].splitlines()
    report = shlex.split(nxt[0])
    assert report[1:] == [
        "report",
        "--storage",
        f"sqlite:///{tmp_path}/runs/p.db",
        "--study-name",
        "small-moe",
    ]
    # pasted elsewhere (another working directory), the command works and writes where `run` said
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r2 = _cli(report[1:], cwd=elsewhere)
    assert r2.returncode == 0, r2.stderr
    assert (tmp_path / "runs" / "p-report" / "report.html").is_file()


def test_n_jobs_with_a_launching_runner_is_refused_with_the_fix(tmp_path):
    study = _write(tmp_path, _launching(tmp_path, "oom"))
    db = tmp_path / "j.db"
    r = CliRunner().invoke(cli, ["run", str(study), "--storage", f"sqlite:///{db}", "--n-jobs", "2"])
    assert r.exit_code == 2 and r.output.startswith("error: --n-jobs 2: the command runner launches")
    assert "same --storage" in r.output and not db.exists()
    assert "refused" in CliRunner().invoke(cli, ["run", "--help"]).output  # --help says so


def test_an_out_of_memory_trial_is_one_log_line(tmp_path):
    study = _write(tmp_path, _launching(tmp_path, "oom"))
    r = _cli(
        ["run", study, "--storage", f"sqlite:///{tmp_path / 'o.db'}", "--n-trials", 1, "--no-progress"],
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "failed with value" not in r.stderr
    (line,) = [x for x in r.stderr.splitlines() if "failed" in x]
    assert "trial 0 failed (oom): out of memory" in line


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.mark.slow
def test_kill_9_of_run_does_not_orphan_the_launched_job(tmp_path):
    pidfile = tmp_path / "child.pid"
    study = _write(tmp_path, _launching(tmp_path, "hang", str(pidfile)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [
        "run",
        str(study),
        "--storage",
        f"sqlite:///{tmp_path / 'k.db'}",
        "--n-trials",
        "1",
        "--no-progress",
    ]
    proc = subprocess.Popen(
        [*CLI, *args], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None, "the job never started"
        time.sleep(0.1)
    child = int(pidfile.read_text())
    os.kill(proc.pid, signal.SIGKILL)  # no handler sees this one
    proc.wait(10)
    deadline = time.monotonic() + 30
    while not _gone(child):
        assert time.monotonic() < deadline, "the launched job outlived `run`"
        time.sleep(0.2)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--storage", "sqlite:/x.db"], "a SQLite URL has three slashes"),
        (["--storage", "sqlite:///nodir/x.db"], "the folder 'nodir' does not exist"),
        (["--study-name", "a/b"], "no '/'"),
    ],
)
def test_run_refuses_storage_paths_that_would_write_elsewhere(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    study = _write(tmp_path, small_moe_study())
    before = set(os.listdir(tmp_path))
    r = CliRunner().invoke(cli, ["run", str(study), "--n-trials", "1", *args])
    assert r.exit_code == 2 and r.output.startswith("error: ") and message in r.output
    assert len(r.output.strip().splitlines()) == 1 and set(os.listdir(tmp_path)) == before


def test_export_refuses_an_output_folder_that_does_not_exist(tmp_path):
    study = _write(tmp_path, small_moe_study())
    url = f"sqlite:///{tmp_path / 'e.db'}"
    assert CliRunner().invoke(cli, ["run", str(study), "--storage", url, "--n-trials", "1"]).exit_code == 0
    r = CliRunner().invoke(cli, ["export", "--storage", url, "-o", str(tmp_path / "nodir" / "best.yaml")])
    assert r.exit_code == 2 and "does not exist" in r.output and not (tmp_path / "nodir").exists()


def test_a_study_name_with_a_slash_is_refused(tmp_path):
    data = small_moe_study()
    data["name"] = "team/mixtral"
    r = CliRunner().invoke(cli, ["space", str(_write(tmp_path, data))])
    assert r.exit_code == 2 and "name: 'team/mixtral' holds a path separator" in r.output
    assert "'team-mixtral'" in r.output


def test_check_of_an_illegal_configuration_prints_no_dp_0(tmp_path):
    study = _write(tmp_path, small_moe_study())
    r = CliRunner().invoke(cli, ["check", str(study), "--config", "tp=3"])
    assert r.exit_code == 1 and "dp=0" not in r.output
    assert "illegal" in r.output
    assert "dp: none (tp·cp·pp = 6 does not divide the 8 GPUs)" in r.output


def test_check_json_of_an_illegal_configuration_has_no_dp_0(tmp_path):
    """``check --json`` says what the human output says: no data-parallel size (null), and why."""
    study = _write(tmp_path, small_moe_study())
    r = CliRunner().invoke(cli, ["check", str(study), "--config", "tp=3", "--json"])
    doc = json.loads(r.output)
    assert r.exit_code == 1 and doc["legal"] is False
    assert doc["config"]["dp"] is None and doc["config"]["num_microbatches"] is None
    assert doc["derived_note"] == "tp·cp·pp = 6 does not divide the 8 GPUs"
    assert '"dp": 0' not in r.output
    ok = json.loads(CliRunner().invoke(cli, ["check", str(study), "--config", "tp=1", "--json"]).output)
    assert ok["config"]["dp"] == 4 and ok["config"]["num_microbatches"] == 8 and ok["derived_note"] is None


def test_check_names_the_batch_that_does_not_divide(tmp_path):
    data = small_moe_study()
    data["workload"]["global_batch_size"] = 36
    study = _write(tmp_path, data)
    r = CliRunner().invoke(cli, ["check", str(study), "--config", "tp=1,pp=2,mbs=4", "--json"])
    doc = json.loads(r.output)
    assert doc["config"]["dp"] == 4 and doc["config"]["num_microbatches"] is None
    assert doc["derived_note"] == "GBS 36 not divisible by mbs·dp = 16"


def test_the_study_name_is_the_value_column_a_user_can_type(tmp_path):
    study = _write(tmp_path, small_moe_study())
    url = f"sqlite:///{tmp_path / 'v.db'}"
    assert CliRunner().invoke(cli, ["run", str(study), "--storage", url, "--n-trials", "2"]).exit_code == 0
    loaded = optuna.load_study(study_name="small-moe", storage=url)
    assert loaded.metric_names == ["tokens_per_s_per_gpu"]  # no slash: a name a user can type
    pytest.importorskip("pandas")
    assert "value_tokens_per_s_per_gpu" in loaded.trials_dataframe().columns


def test_the_centre_warning_names_the_centre_used_and_the_real_reason(tmp_path):
    """A baseline outside the study's axes fits in memory: the warning says it is outside the axes (not a
    memory figure) and names the centre the sampler actually sweeps from."""
    data = small_moe_study(axes={"recompute": ["none", "full"]})
    data["search"]["baseline"]["recompute"] = "full:1"
    url = f"sqlite:///{tmp_path / 'w.db'}"
    r = CliRunner().invoke(cli, ["run", str(_write(tmp_path, data)), "--storage", url, "--n-trials", "1"])
    assert r.exit_code == 0, r.output
    warning = next(x for x in r.output.splitlines() if x.startswith("warning: "))
    assert "uses values outside the study's axes (recompute=full:1)" in warning
    assert "<=" not in warning and "GiB usable" not in warning  # no memory figure posing as the reason
    centre = optuna.load_study(study_name="small-moe", storage=url).user_attrs["sweep"]["centre"]
    assert warning.endswith(f"the sweep starts from {centre}")


@pytest.mark.slow
def test_run_sh_names_the_report_it_writes(tmp_path):
    env = {**os.environ, "PRIMUS_OPTUNA_STORAGE": f"sqlite:///{tmp_path / 'r.db'}"}
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "run.sh"), "--n-trials", "2"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    html = tmp_path / "r-report" / "report.html"
    assert f"report: {html}" in r.stdout and f"wrote {html}" in r.stdout and html.is_file()
    assert "source " in r.stderr and ".venv/bin/activate" in r.stderr
