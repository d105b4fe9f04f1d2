"""The network probe: its scopes, its CSV (read back by ``cluster.network``), its refusals, and an interrupted
launch that leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_optuna.errors import SpecError
from primus_optuna.spec.network import load_network
from primus_optuna.workloads.netprobe import check_network_request, csv_text, measure_network, scopes


def test_scopes_grow_by_powers_of_two_nodes_with_all_ranks_then_one_per_node() -> None:
    got = scopes(4, 8)
    assert [(len(r), k) for r, k in got] == [(16, 8), (2, 1), (32, 8), (4, 1)]
    assert got[1][0] == [0, 8] and got[3][0] == [0, 8, 16, 24]  # the first rank of each node
    assert [(len(r), k) for r, k in scopes(6, 1)] == [(2, 1), (4, 1), (6, 1)]  # the whole world last
    assert scopes(1, 8) == []  # one node: nothing between nodes


def test_the_csv_is_what_cluster_network_reads(tmp_path: Path) -> None:
    rows = [("all_reduce", 16, 8, 1024, 0.5), ("send_recv", 2, 1, 4096, 12.25)]
    (tmp_path / "net.csv").write_text(csv_text(rows))
    net = load_network("net.csv", base_dir=tmp_path)
    assert net.rows == [("all_reduce", 16, 8, 1024.0, 0.5), ("send_recv", 2, 1, 4096.0, 12.25)]
    assert net.files("all_reduce") == ["net.csv"] and net.files("all_gather") == []


@pytest.mark.parametrize(
    ("budget", "local", "match"),
    [
        (0.0, 2, "--budget-s"),
        (float("inf"), 2, "--budget-s"),
        (5.0, 1, "--local-ranks 1"),
        (5.0, None, "--study"),
    ],
)
def test_bad_requests_name_the_option(budget: float, local: int | None, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        check_network_request(budget, local, None)


def test_an_interrupted_probe_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the launch runs: no CSV, no working directory left beside it."""
    import primus_optuna.run.command as command

    def interrupted(*args: object, **kwargs: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "run_launch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        measure_network(tmp_path / "net.csv", 1.0, "cpu", local_ranks=2)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_probe_says_why_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import primus_optuna.run.command as command
    from primus_optuna.run.base import RunFailure
    from primus_optuna.run.command import Launch, run_launch

    def broken(launch: Launch, log: Path, timeout_s: float, cwd: str | None = None) -> int:
        return run_launch(
            Launch(argv=["sh", "-c", "echo NCCL WARN no socket; exit 1"], env={}), log, timeout_s
        )

    monkeypatch.setattr(command, "run_launch", broken)
    with pytest.raises(RunFailure, match="code 1:\n.*NCCL WARN no socket"):
        measure_network(tmp_path / "net.csv", 1.0, "cpu", local_ranks=2)
    assert list(tmp_path.iterdir()) == []


def test_a_one_node_study_has_nothing_between_nodes() -> None:
    from primus_optuna.spec import StudySpec
    from tests.conftest import STUDIES

    with pytest.raises(SpecError, match="cluster.nodes: the study has 1 node"):
        check_network_request(60.0, None, StudySpec.from_yaml(STUDIES / "local-gpt-cpu.yaml"))
