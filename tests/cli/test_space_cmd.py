import json

import yaml
from click.testing import CliRunner

from primus_optuna.cli import cli
from tests.conftest import FLAGSHIP, small_moe_study


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_space_json_is_stable():
    r = invoke("space", FLAGSHIP, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert list(doc) == ["axes", "legal_configs", "baseline", "no_fit"]
    assert doc["no_fit"] is None
    memory = doc["baseline"].pop("memory")
    assert memory["fits"] == (memory["peak_gib"] <= memory["usable_gib"])
    assert doc["legal_configs"] > 1000
    assert doc["baseline"] == {
        "config": {
            "tp": 1,
            "pp": 4,
            "ep": 8,
            "cp": 1,
            "vpp": 2,
            "mbs": 1,
            "recompute": "full:1",
            "moe_dispatcher": "alltoall",
            "pp_schedule": "interleaved",
            "ep_overlap": False,
        },
        "legal": True,
        "reasons": [],
    }
    assert 3 not in doc["axes"]["tp"]


def test_space_text():
    r = invoke("space", FLAGSHIP)
    assert r.exit_code == 0 and "legal configurations:" in r.output and "baseline" in r.output


def test_check_legal_and_illegal():
    r = invoke("check", FLAGSHIP, "--config", "tp=2,mbs=1")
    assert r.exit_code == 0 and r.output.splitlines()[1] == "legal"
    r = invoke("check", FLAGSHIP, "--config", "tp=3", "--json")
    assert r.exit_code == 1
    doc = json.loads(r.output)
    assert doc["legal"] is False and any("KV groups" in x for x in doc["reasons"])
    assert doc["config"]["pp"] == 4  # missing keys come from the baseline


def test_check_reports_canonical_form():
    r = invoke("check", FLAGSHIP, "--config", "pp=1,ep=8")
    assert r.exit_code == 1 and "canonical form:" in r.output


def test_user_errors_exit_2_with_one_message(tmp_path):
    bad = small_moe_study()
    bad["cluster"]["gpu"] = "mi350x"
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(bad))
    for args in (
        ["space", p],
        ["check", FLAGSHIP, "--config", "tp=abc"],
        ["space", tmp_path / "missing.yaml"],
        ["check", FLAGSHIP, "--config", "foo=1"],
    ):
        r = invoke(*args)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.startswith("error: ") and r.output.count("error:") == 1
    r = invoke("space", p)
    assert "did you mean 'mi355x'" in r.output


def test_empty_space_exit_2(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text(yaml.safe_dump(small_moe_study(axes={"tp": [3]})))
    r = invoke("space", p)
    assert r.exit_code == 2 and "every combination breaks tp_heads" in r.output


def test_study_file_errors_exit_2_naming_the_field(tmp_path):
    cases = [
        (
            {"workload": {"seq_length": 4096, "global_batch_size": 32, "precision": "bf16", "seq_len": 1}},
            "workload.seq_len",
        ),
        ({"cluster": {"gpu": "mi300x", "nodes": 0, "gpus_per_node": 4}}, "cluster.nodes"),
        ({"model": {"catalog": "mixtral-8x7"}}, "did you mean 'mixtral-8x7b'"),
    ]
    for override, needle in cases:
        p = tmp_path / "bad.yaml"
        p.write_text(yaml.safe_dump({**small_moe_study(), **override}))
        for cmd in ("space", "check", "estimate", "plan"):
            r = invoke(cmd, p)
            assert r.exit_code == 2, (cmd, override, r.output)
            assert r.output.startswith("error: ") and needle in r.output, r.output


def test_space_warns_about_a_dropped_axis_value_and_an_oversized_node(tmp_path):
    data = small_moe_study()
    data["search"].setdefault("axes", {})["tp"] = [1, 3]
    data["cluster"]["gpus_per_node"] = 16
    data["cluster"]["nodes"] = 1
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(cli, ["space", str(p)])
    assert r.exit_code == 0, r.output
    assert "warning: search.axes.tp: 3 is in no legal configuration (tp=3 does not divide" in r.output
    assert "warning: cluster.gpus_per_node: 16" in r.output
