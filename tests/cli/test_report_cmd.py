"""``report``, ``export`` and ``dashboard`` on a hand-built study."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from primus_optuna.cli import cli
from primus_optuna.record.export import FORMATS, parse_export
from primus_optuna.space import Space
from tests.helpers.recorded_study import make_study, small_spec


def invoke(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def storage(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'small.db'}"
    make_study(url)
    return url


def test_report_writes_md_and_html(storage: str, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    r = invoke("report", "--storage", storage, "--study-name", "small", "--out", out)
    assert r.exit_code == 0, r.output
    assert f"wrote {out / 'report.md'}" in r.output
    assert "## 7. Result" in (out / "report.md").read_text()
    assert (out / "report.html").read_text().startswith("<!doctype html>")


def test_report_guesses_the_only_study_and_accepts_a_path(storage: str, tmp_path: Path) -> None:
    path = storage.removeprefix("sqlite:///")
    r = invoke("report", "--storage", path, "--out", tmp_path / "r2")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r2" / "report.md").is_file()


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_best_round_trips(storage: str, fmt: str) -> None:
    r = invoke("export", "--storage", storage, "--study-name", "small", "--format", fmt)
    assert r.exit_code == 0, r.output
    spec = small_spec()
    study = optuna.load_study(study_name="small", storage=storage)
    expected = Space(spec).canonical(Space(spec).make(**study.best_trial.params))
    assert parse_export(r.output, fmt, spec) == expected
    assert study.best_trial.number == 5


def test_export_chosen_trial_to_file(storage: str, tmp_path: Path) -> None:
    out = tmp_path / "t3.json"
    r = invoke(
        "export", "--storage", storage, "--study-name", "small", "--format", "json", "--trial", 3, "-o", out
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["trial"] == 3 and doc["config"]["tp"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--study-name", "nope"), "no such study"),
        (("--study-name", "small", "--trial", 99), "no trial with that number"),
    ],
)
def test_export_user_errors(storage: str, args: tuple, message: str) -> None:
    r = invoke("export", "--storage", storage, *args)
    assert r.exit_code == 2 and message in r.output


def test_missing_storage_file_is_a_user_error(tmp_path: Path) -> None:
    r = invoke("report", "--storage", tmp_path / "absent.db")
    assert r.exit_code == 2 and "no such file" in r.output
    assert not (tmp_path / "absent.db").exists()


def test_dashboard_needs_a_storage(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = invoke("dashboard")
    assert r.exit_code == 2 and "--storage is required" in r.output


def test_dashboard_starts_the_server_with_the_artifact_store(
    storage: str, tmp_path: Path, monkeypatch
) -> None:
    import optuna_dashboard

    seen: dict = {}
    monkeypatch.setattr(optuna_dashboard, "run_server", lambda st, **kw: seen.update(kw, storage=st))
    r = invoke("dashboard", "--storage", storage, "--port", 8099)
    assert r.exit_code == 0, r.output
    assert seen["port"] == 8099 and seen["host"] == "127.0.0.1"
    assert Path(seen["artifact_store"]._base_path) == tmp_path / "small-artifacts"


def test_export_into_a_missing_directory_is_refused_and_a_pruned_trial_warns(
    storage: str, tmp_path: Path
) -> None:
    study = optuna.load_study(study_name="small", storage=storage)
    out = tmp_path / "new" / "dir" / "best.yaml"
    r = invoke("export", "--storage", storage, "--study-name", "small", "-o", out)
    assert r.exit_code == 2 and "does not exist" in r.output and not (tmp_path / "new").exists()
    out.parent.mkdir(parents=True)
    r = invoke("export", "--storage", storage, "--study-name", "small", "-o", out)
    assert r.exit_code == 0, r.output
    assert out.is_file()
    pruned = next(t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED)
    r = invoke(
        "export", "--storage", storage, "--study-name", "small", "--trial", pruned.number, "--format", "json"
    )
    assert r.exit_code == 0 and f"warning: trial {pruned.number} is pruned" in r.output
    blocked = tmp_path / "file"
    blocked.write_text("")
    r = invoke("export", "--storage", storage, "--study-name", "small", "-o", blocked / "x.yaml")
    assert r.exit_code == 2 and r.output.startswith("error: --output")


def test_dashboard_port_in_use_is_one_error_line(storage: str) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        r = invoke("dashboard", "--storage", storage, "--port", port)
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        f"error: --port {port}: cannot listen on 127.0.0.1:{port} (Address already in use); "
        "pick a free one with --port"
    ]


def test_report_on_an_empty_storage_says_it_holds_no_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.storages.RDBStorage(url)  # the file exists, with no study in it
    for cmd in (["report"], ["export", "--format", "json"]):
        r = invoke(*cmd, "--storage", url)
        assert r.exit_code == 2
        assert r.output.startswith(f"error: --storage {url}: it holds no study;"), r.output


def test_export_header_says_whether_the_value_was_measured(storage: str, tmp_path: Path) -> None:
    r = invoke("export", "--storage", storage, "--study-name", "small")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0].startswith("# primus-optuna study small, trial 5, ")
    assert "tokens/s/GPU (measured): " in r.output.splitlines()[0]
    from tests.conftest import small_moe_study

    (tmp_path / "s.yaml").write_text(json.dumps(small_moe_study()))
    url = f"sqlite:///{tmp_path / 'a.db'}"
    assert (
        invoke("run", tmp_path / "s.yaml", "--storage", url, "--n-trials", 2, "--no-progress").exit_code == 0
    )
    r = invoke("export", "--storage", url)
    assert "tokens/s/GPU (estimated): " in r.output.splitlines()[0], r.output
    # an estimate carries its band; a measured value does not need one
    assert r.output.splitlines()[1].startswith("# error band of the estimate: "), r.output
    measured = invoke("export", "--storage", storage, "--study-name", "small").output
    assert "error band" not in measured


def test_export_defaults_to_a_format_the_studys_gpus_run(storage: str) -> None:
    """The H200 study's default export is Megatron-LM arguments (no Primus-Turbo: it is ROCm's)."""
    r = invoke("export", "--storage", storage, "--study-name", "small")
    assert r.exit_code == 0, r.output
    assert "--tensor-model-parallel-size" in r.output and "use_turbo" not in r.output
    assert "modules:" not in r.output


def test_report_to_an_unwritable_folder_is_one_error(storage: str, tmp_path: Path) -> None:
    """Issue 39 item 12: exit 2 and one message naming --out, no traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = invoke("report", "--storage", storage, "--study-name", "small", "--out", blocker / "report")
    assert r.exit_code == 2, r.output
    assert "--out" in r.output and "cannot write the report there" in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_export_torchtitan(storage: str) -> None:
    """``--format torchtitan`` (Qwen3-30B-A3B: ``--module qwen3 --config qwen3_30b_a3b``): a trial TorchTitan
    runs round-trips; the best one (DeepEP) is refused with the reason, exit 2."""
    from primus_optuna.space.torchtitan_args import titan_refusal

    spec = small_spec()
    study = optuna.load_study(study_name="small", storage=storage)
    space = Space(spec)
    runs = [t for t in study.trials if t.params and not titan_refusal(spec, space.make(**t.params))]
    assert runs
    r = invoke(
        "export",
        "--storage",
        storage,
        "--study-name",
        "small",
        "--format",
        "torchtitan",
        "--trial",
        runs[0].number,
    )
    assert r.exit_code == 0, r.output
    assert "--module qwen3 \\\n--config qwen3_30b_a3b \\\n" in r.output
    assert parse_export(r.output, "torchtitan", spec) == space.canonical(space.make(**runs[0].params))
    r = invoke("export", "--storage", storage, "--study-name", "small", "--format", "torchtitan")
    assert r.exit_code == 2 and "moe_dispatcher=deepep" in r.output
