import json

from click.testing import CliRunner
from tests.conftest import FLAGSHIP

from primus_optuna.cli import cli
from primus_optuna.physics import BREAKDOWN_KEYS, estimate_memory
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["estimate", str(FLAGSHIP), *args])
    return result.exit_code, result.output


def test_json_document_matches_the_library() -> None:
    code, out = run("--config", "tp=2,pp=8,vpp=1,pp_schedule=1f1b,recompute=full,mbs=1", "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"config", "legal", "reasons", "memory"}
    assert doc["legal"] is True and doc["reasons"] == []
    assert doc["config"]["tp"] == 2 and doc["config"]["dp"] == 4
    m = doc["memory"]
    assert set(m) == {"peak_gib", "usable_gib", "capacity_gib", "fits", "peak_stage", "stages"}
    assert len(m["stages"]) == 8
    assert set(m["stages"][0]) == {"stage", "total_gib", "breakdown"}
    assert tuple(m["stages"][0]["breakdown"]) == BREAKDOWN_KEYS
    spec = StudySpec.from_yaml(FLAGSHIP)
    space = Space(spec)
    est = estimate_memory(spec, space.make(tp=2, pp=8, vpp=1, pp_schedule="1f1b", recompute="full", mbs=1))
    assert m["peak_gib"] == round(est.peak_gib, 3) and m["fits"] is est.fits is True


def test_table_shows_every_stage_and_the_verdict() -> None:
    code, out = run()
    assert code == 0
    assert "memory per GPU (GiB):" in out
    assert out.count("<- peak") == 1
    for key in ("weights", "grads", "optim", "activ", "ccl", "deepep", "overhead", "total"):
        assert key in out
    assert "DOES NOT FIT" in out  # the baseline, as estimated, exceeds 90% of 287.9 GiB
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


def test_illegal_but_computable_config_still_has_memory() -> None:
    # pp_schedule zb1p with recompute=full is illegal, yet every size divides
    code, out = run("--config", "vpp=1,pp_schedule=zb1p,recompute=full", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["legal"] is False and "memory" in doc


def test_user_error_exit_2() -> None:
    code, _ = run("--config", "tq=2")
    assert code == 2
