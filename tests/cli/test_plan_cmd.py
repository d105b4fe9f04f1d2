"""``plan``: JSON contract, ranking, baseline rank, Pareto set; the library function behind it."""

import json

import yaml
from click.testing import CliRunner

from primus_optuna.cli import cli
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.plan import plan_space
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from tests.conftest import small_moe_study


def study_file(tmp_path, data=None):
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump(data or small_moe_study()))
    return p


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_plan_json_contract_and_ranking(tmp_path):
    r = invoke("plan", study_file(tmp_path), "--json", "--top", "5")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert list(doc) == ["legal_configs", "feasible_configs", "top", "baseline", "pareto", "no_fit"]
    assert doc["no_fit"] is None
    assert 0 < doc["feasible_configs"] <= doc["legal_configs"]
    assert len(doc["top"]) == 5
    assert all(set(e) == {"config", "tokens_per_s_per_gpu", "peak_gib"} for e in doc["top"])
    tps = [e["tokens_per_s_per_gpu"] for e in doc["top"]]
    assert tps == sorted(tps, reverse=True)
    base = doc["baseline"]
    assert {"config", "tokens_per_s_per_gpu", "rank"} <= set(base)
    if base["rank"] is not None:
        assert base["rank"] >= 1 and (
            base["rank"] > 5 or doc["top"][base["rank"] - 1]["config"] == base["config"]
        )
    # Pareto set: sorted by throughput, memory strictly falling, nobody dominated
    pareto = doc["pareto"]
    assert pareto and pareto[0]["tokens_per_s_per_gpu"] == tps[0]
    mems = [e["peak_gib"] for e in pareto]
    assert mems == sorted(mems, reverse=True) and len(set(mems)) == len(mems)


def test_plan_matches_brute_force(tmp_path):
    spec = StudySpec.from_dict(small_moe_study())
    space = Space(spec)
    result = plan_space(spec, space, top=3)
    feasible = [c for c in space.configs() if estimate_memory(spec, c).fits]
    assert result.feasible_configs == len(feasible)
    best = max(feasible, key=lambda c: estimate_throughput(spec, c).tokens_per_s_per_gpu)
    assert result.top[0].tokens_per_s_per_gpu == estimate_throughput(spec, best).tokens_per_s_per_gpu
    for e in result.ranked:  # nothing feasible is better on both axes than a Pareto member
        for p in result.pareto:
            assert not (e.tokens_per_s_per_gpu > p.tokens_per_s_per_gpu and e.peak_gib < p.peak_gib)
    if result.baseline_rank:
        assert result.ranked[result.baseline_rank - 1] is result.baseline


def test_plan_text(tmp_path):
    r = invoke("plan", study_file(tmp_path), "--top", "2")
    assert r.exit_code == 0, r.output
    assert "legal configurations" in r.output and "baseline" in r.output and "Pareto set" in r.output
    assert "compute_mlp" in r.output
    assert "top 2 (every figure estimated: tokens/s/GPU, peak memory per GPU, MFU):" in r.output
    assert "Pareto set (estimated throughput vs peak memory" in r.output


def test_plan_pareto_limit_spreads_over_the_set(tmp_path):
    study = study_file(tmp_path)
    pareto = json.loads(invoke("plan", study, "--json").output)["pareto"]
    assert len(pareto) > 3, "the small MoE study's Pareto set is too short for this test"

    def shown(*extra):
        r = invoke("plan", study, "--top", "1", *extra)
        assert r.exit_code == 0, r.output
        tail = r.output.split("Pareto set (", 1)[1].splitlines()[1:]
        return r.output, [line for line in tail if "tok/s/GPU" in line]

    out, lines = shown("--pareto", "3")
    assert len(lines) == 3 and f"{len(pareto)} configurations; 3 shown" in out
    # both ends of the trade-off: the fastest and the smallest
    assert f"{pareto[0]['tokens_per_s_per_gpu']:10,.0f} tok/s/GPU" in lines[0]
    assert f"{pareto[-1]['peak_gib']:7.1f} GiB" in lines[-1]
    out, lines = shown("--pareto", "0")
    assert len(lines) == len(pareto) and "shown" not in out


def test_plan_bad_study_is_a_user_error(tmp_path):
    r = invoke("plan", tmp_path / "missing.yaml")
    assert r.exit_code == 2 and "error:" in r.output


def test_plan_when_nothing_fits_names_the_fix_and_no_rank(tmp_path):
    """Llama 3.1 70B on 16 H100: no configuration fits; the baseline line gives its peak, not a rank "of 0"."""
    data = {
        "name": "l70",
        "model": {"catalog": "llama3.1-70b"},
        "cluster": {"gpu": "h100", "nodes": 2, "gpus_per_node": 8},
        "workload": {"seq_length": 8192, "global_batch_size": 128, "precision": "bf16"},
    }
    r = invoke("plan", study_file(tmp_path, data), "--top", "1")
    assert r.exit_code == 0, r.output
    assert "no configuration fits" in r.output.lower() and "cluster.nodes" in r.output
    base = next(line for line in r.output.splitlines() if line.startswith("baseline"))
    assert "does not fit in memory" in base and "of 0" not in base
