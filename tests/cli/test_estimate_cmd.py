import json

import pytest
from click.testing import CliRunner

from primus_optuna.cli import cli
from primus_optuna.physics import BREAKDOWN_KEYS, estimate_memory
from primus_optuna.physics.uncertainty import estimate_band
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from tests.conftest import FLAGSHIP


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["estimate", str(FLAGSHIP), *args])
    return result.exit_code, result.output


def test_json_document_matches_the_library() -> None:
    code, out = run("--config", "tp=2,pp=8,vpp=1,pp_schedule=1f1b,recompute=full,mbs=1", "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"config", "legal", "reasons", "memory", "throughput"}
    # the estimate's error band: the flagship's regime (MoE, 8 nodes, network not measured)
    band = estimate_band(StudySpec.from_yaml(FLAGSHIP))
    t = doc["throughput"]
    assert (
        t["band"]["low"] == band.low and t["band"]["high"] == band.high and t["band"]["source"] == band.source
    )
    assert t["band"]["regime"]["multi_node"] and t["band"]["regime"]["moe"]
    assert t["tokens_per_s_per_gpu_range"] == [
        t["tokens_per_s_per_gpu"] * (1 + band.low),
        t["tokens_per_s_per_gpu"] * (1 + band.high),
    ]
    assert doc["legal"] is True and doc["reasons"] == []
    assert doc["config"]["tp"] == 2 and doc["config"]["dp"] == 4
    m = doc["memory"]
    assert set(m) == {
        "peak_gib",
        "usable_gib",
        "capacity_gib",
        "fits",
        "peak_stage",
        "recompute",
        "stages",
        "pace_stage",
    }
    assert m["recompute"] == "full"
    assert len(m["stages"]) == 8
    assert set(m["stages"][0]) == {"stage", "total_gib", "breakdown", "layers", "work_s"}
    # the stage's layers: embedding, MoE layers, loss (Mixtral: 56 MoE layers over 8 stages)
    assert [s["layers"] for s in m["stages"]] == ["E+7moe"] + ["7moe"] * 6 + ["7moe+L"]
    assert tuple(m["stages"][0]["breakdown"]) == BREAKDOWN_KEYS
    spec = StudySpec.from_yaml(FLAGSHIP)
    space = Space(spec)
    est = estimate_memory(spec, space.make(tp=2, pp=8, vpp=1, pp_schedule="1f1b", recompute="full", mbs=1))
    assert m["peak_gib"] == round(est.peak_gib, 3) and m["fits"] is est.fits is True


def test_table_shows_every_stage_and_the_verdict() -> None:
    code, out = run()
    assert code == 0
    assert "memory per GPU (GiB), activations with recompute=full:1:" in out  # the baseline's recompute
    assert out.count("<- peak") == 1
    for key in ("weights", "grads", "optim", "activ", "ccl", "deepep", "overhead", "total"):
        assert key in out
    assert "GiB: fits" in out  # AMD's published recipe (the baseline) fits in 90% of 287.9 GiB
    assert "usable 259.1 of 287.9 GiB" in out


def test_illegal_config_prints_reasons_and_exits_1() -> None:
    code, out = run("--config", "tp=3", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["legal"] is False and any("tp=3" in r for r in doc["reasons"])
    code, out = run("--config", "pp=7")
    assert code == 1
    assert "illegal:" in out and "does not divide the 64 GPUs" in out
    assert "memory: not estimated" in out


def test_illegal_config_prints_no_dp_0_but_why() -> None:
    """``estimate`` heads an illegal configuration as ``check`` does: no ``dp=0``, the reason instead."""
    code, out = run("--config", "pp=7")
    assert code == 1 and "dp=0" not in out and "micro-batches=0" not in out
    assert "dp: none (tp·cp·pp = 7 does not divide the 64 GPUs)" in out


def test_illegal_but_computable_config_still_has_memory() -> None:
    # pp_schedule zb1p with recompute=full is illegal, yet every size divides
    code, out = run("--config", "vpp=1,pp_schedule=zb1p,recompute=full", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["legal"] is False and "memory" in doc


def test_user_error_exit_2() -> None:
    code, _ = run("--config", "tq=2")
    assert code == 2


def test_estimate_includes_the_step_time_breakdown() -> None:
    from primus_optuna import Space, StudySpec
    from primus_optuna.physics import estimate_throughput

    runner = CliRunner()
    res = runner.invoke(cli, ["estimate", str(FLAGSHIP), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    thr = doc["throughput"]
    spec = StudySpec.from_yaml(FLAGSHIP)
    direct = estimate_throughput(spec, Space(spec).baseline)
    # the library's section (tests/physics/test_throughput.py), then the error band
    assert list(thr) == [*direct.to_dict(), "band", "tokens_per_s_per_gpu_range"]
    assert thr["tokens_per_s_per_gpu"] == pytest.approx(direct.tokens_per_s_per_gpu)
    assert sum(thr["breakdown_s"].values()) == pytest.approx(thr["step_time_s"], rel=1e-6)
    text = runner.invoke(cli, ["estimate", str(FLAGSHIP)]).output
    assert "tokens/s/GPU" in text and "compute_mlp" in text
    band = estimate_band(spec)
    assert f"error band: {band.describe(direct.tokens_per_s_per_gpu)}" in text
    assert f"{direct.tokens_per_s_per_gpu:,.0f} tokens/s/GPU \u221276%/+13% (catalog constants" in text
    # an illegal configuration has no throughput section
    bad = json.loads(runner.invoke(cli, ["estimate", str(FLAGSHIP), "--config", "tp=3", "--json"]).output)
    assert "throughput" not in bad and bad["legal"] is False


def test_explain_comm_prints_nccl_style_bus_bandwidths() -> None:
    """``--explain-comm`` (issue 21): all-reduce/all-gather/reduce-scatter bus bandwidths for 1-64 nodes of
    the study's cluster; across nodes never above the node's NICs (8 x 50 GB/s on the MI355X flagship)."""
    code, out = run("--explain-comm")
    assert code == 0
    assert "NCCL-style bus bandwidth" in out
    for name in ("all_reduce", "all_gather", "reduce_scatter"):
        assert name in out
    code, out = run("--explain-comm", "--json")
    rows = json.loads(out)["communication"]
    assert {r["nodes"] for r in rows} == {1, 2, 4, 8, 16, 32, 64}
    assert all(0 < r["bus_gbs"] <= 400 for r in rows if r["nodes"] > 1)
    assert {r["source"] for r in rows} == {"catalog"}
    assert "catalog constants for all" in json.loads(out)["communication_sources"]


def test_explain_comm_says_which_collectives_were_measured(tmp_path) -> None:
    """With ``cluster.network`` the measured bus bandwidths replace the catalog's (marked ``*``, ``~`` where the
    model is anchored beyond them), and the sources line names the file per collective."""
    import yaml

    from tests.conftest import STUDIES

    net = STUDIES.parent / "tests" / "spec" / "data" / "network" / "cloud.csv"
    data = yaml.safe_load((STUDIES / "llama3.1-70b-h100-bf16.yaml").read_text())
    data["cluster"]["network"] = str(net)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(cli, ["estimate", str(study), "--explain-comm"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"all_reduce measured ({net})" in out
    assert "all_to_all, send_recv from the catalog" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("all_reduce") and ln.split()[2] == "64")
    assert line.split()[3:] == ["2.2*", "7.1*", "10.2*", "11.0*"]  # 64 ranks of 8 per node: measured
    assert any(
        ln.startswith("all_reduce") and ln.split()[2] == "128" and "~" in ln for ln in out.splitlines()
    )
    rows = json.loads(CliRunner().invoke(cli, ["estimate", str(study), "--explain-comm", "--json"]).output)
    big = next(
        r
        for r in rows["communication"]
        if r["collective"] == "all_reduce" and r["ranks"] == 64 and r["bytes"] == 2**30
    )
    assert big["source"] == "measured" and big["bus_gbs"] == pytest.approx(11.0)


def test_each_stage_shows_its_pipeline_work_and_the_one_that_sets_the_pace() -> None:
    """DeepSeek-V3's layout (E+3 dense+5 MoE | 8 MoE ×6 | 5 MoE+MTP+loss): the work column says which stage sets
    the steady state (a middle one), the light first and last stages less; the JSON carries the same per-stage
    work as the library's estimate, and the stage setting the pace is the one with the most."""
    from primus_optuna.physics.throughput import estimate_throughput
    from tests.conftest import STUDIES

    study = STUDIES / "deepseek-v3-mi355x-fp8.yaml"
    result = CliRunner().invoke(cli, ["estimate", str(study), "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.output)
    spec = StudySpec.from_yaml(study)
    est = estimate_throughput(spec, Space(spec).baseline)
    work = [s["work_s"] for s in doc["memory"]["stages"]]
    assert work == pytest.approx(list(est.stage_work_s)) and doc["throughput"][
        "stage_work_s"
    ] == pytest.approx(work)
    pace = doc["memory"]["pace_stage"]
    assert pace == est.busiest_stage == doc["throughput"]["busiest_stage"] and work[pace] == max(work)
    assert work[0] < work[pace] and work[-1] < work[pace]
    text = CliRunner().invoke(cli, ["estimate", str(study)]).output
    assert "work s" in text and text.count("pace") == 2  # the marked stage and the line that explains it
