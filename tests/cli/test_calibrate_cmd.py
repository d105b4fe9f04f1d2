"""``calibrate --network``: the probe run here as 2 one-rank nodes writes the CSV that ``cluster.network``
reads, and a study that names it prices its collectives from it; bad requests write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from primus_optuna.cli import cli
from primus_optuna.spec.network import load_network
from tests.conftest import STUDIES

LOCAL = ["calibrate", "--network", "--local-ranks", "2", "--device", "cpu"]
"""the probe on this machine: 2 processes, each a node of 1 rank"""


def test_network_probe_on_two_local_ranks_feeds_a_study(tmp_path: Path) -> None:
    net = tmp_path / "net.csv"
    argv = [*LOCAL, "--budget-s", "1", "--out", str(net)]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    assert f"wrote {net}" in result.output and "2 ranks (1 per node)" in result.output
    assert f"add to the study: cluster.network: {net}\n" in result.output  # no --study: the absolute path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.csv"]  # the probe's working directory is gone
    rows = load_network(str(net)).rows
    assert {(r[0], r[1], r[2]) for r in rows} >= {("all_reduce", 2, 1)}
    assert all(r[3] > 0 and r[4] > 0 for r in rows)

    data = yaml.safe_load((STUDIES / "local-gpt-cpu.yaml").read_text())
    data["cluster"].update(nodes=2, gpus_per_node=1, network="net.csv")  # 2 nodes of 1 rank, as measured
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(data))
    text = CliRunner().invoke(cli, ["estimate", str(study), "--explain-comm"])
    assert text.exit_code == 0, text.output
    assert "all_reduce measured (net.csv)" in text.output
    out = json.loads(CliRunner().invoke(cli, ["estimate", str(study), "--explain-comm", "--json"]).output)
    two = [r for r in out["communication"] if r["collective"] == "all_reduce" and r["ranks"] == 2]
    assert two and {r["source"] for r in two} == {"measured"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--network"], "--study"),
        (["--network", "--local-ranks", "1"], "--local-ranks 1"),
        (
            ["--network", "--study", str(STUDIES / "local-gpt-cpu.yaml")],
            "cluster.nodes: the study has 1 node",
        ),
        (["--network", "--local-ranks", "2", "--device", "cuda"], "--device cuda: torch sees no GPU"),
        (["--local-ranks", "2", "--device", "cpu"], "--local-ranks: only with --network"),
        (["--device", "cpu"], "--out: give the profile's path"),
    ],
)
def test_bad_network_requests_exit_2_and_write_nothing(
    tmp_path: Path, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = ["--out", str(tmp_path / "net.csv")] if "--network" in args else []
    result = CliRunner().invoke(cli, ["calibrate", *args, *out])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_the_probe_exits_130_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import primus_optuna.workloads.netprobe as netprobe

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(netprobe, "measure_network", interrupted)
    argv = [*LOCAL, "--out", str(tmp_path / "n.csv")]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 130 and "interrupted" in result.output
    assert list(tmp_path.iterdir()) == []
