"""``capacity``: the table and answers as text and JSON, the plot, and one clear error (exit 2) per bad option."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from primus_optuna.cli import cli
from primus_optuna.cli.capacity_cmd import parse_prices, parse_sizes, parse_tokens
from primus_optuna.errors import SpecError
from primus_optuna.physics.plan import plan_space
from primus_optuna.spec import StudySpec
from tests.conftest import small_dense_study


@pytest.fixture
def study(tmp_path):
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump(small_dense_study()))
    return p


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_json_rows_answers_and_the_study_size_as_plan(study):
    r = invoke(
        "capacity", study, "--gpus", "8,16", "--gpu", "h100,mi300x", "--tokens", "100B", "--days", "20",
        "--price", "h100=2.5,mi300x=1.5", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["batch"] == "fixed" and doc["tokens"] == 1e11 and doc["days"] == 20
    assert doc["prices_per_gpu_hour"] == {"h100": 2.5, "mi300x": 1.5}
    assert [(x["gpu"], x["gpus"]) for x in doc["rows"]] == [
        ("h100", 8),
        ("h100", 16),
        ("mi300x", 8),
        ("mi300x", 16),
    ]
    top = plan_space(StudySpec.from_yaml(study), top=1).top[0]
    assert doc["rows"][0]["config"] == top.config.to_params()
    assert doc["rows"][0]["tokens_per_s_per_gpu"] == top.tokens_per_s_per_gpu
    assert all(
        x["band"]["text"] and x["band"]["regime"]["family"] for x in doc["rows"]
    )  # each row's error band
    assert set(doc["answers"]) == {"fewest", "cheapest", "cheapest_by", "fastest"}
    assert doc["answers"]["cheapest_by"] == "cost"


def test_text_says_the_batch_mode_target_and_answers(study):
    r = invoke("capacity", study, "--gpus", "8,16", "--tokens", "1T", "--days", "30", "--batch", "per-gpu")
    assert r.exit_code == 0, r.output
    assert "global batch scaled with the GPU count (64 at 8 GPUs; --batch per-gpu)" in r.output
    assert "target: 1T tokens in 30 days" in r.output
    assert "h100 (nodes of 8, the study's" in r.output
    assert "GBS" in r.output and "     128  " in r.output  # 16 GPUs train twice the batch
    assert "fewest GPUs" in r.output and "fastest" in r.output and "[by GPU-hours" in r.output
    fixed = invoke("capacity", study, "--gpus", "8")
    assert "global batch 64 kept fixed at every size (--batch fixed)" in fixed.output
    assert "band" in fixed.output  # every row carries its error band


def test_an_excluded_type_says_why_in_the_text(tmp_path):
    d = small_dense_study()
    d["workload"]["precision"] = "fp8"
    p = tmp_path / "fp8.yaml"
    p.write_text(yaml.safe_dump(d))
    r = invoke("capacity", p, "--gpus", "8", "--gpu", "h100,a100-80gb")
    assert r.exit_code == 0, r.output
    assert "excluded: the study trains in FP8 (workload.precision) and a100-80gb has no FP8" in r.output


def test_plot_is_written(study, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "capacity.png"
    r = invoke("capacity", study, "--gpus", "8,16", "--gpu", "h100,mi300x", "--tokens", "1T", "--plot", out)
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--gpus", "7"],
            "--gpus: 7 GPUs are not whole nodes (8 GPUs per h100 node); give multiples of the node size (e.g. 8)",
        ),
        (["--gpus", "8,x"], "--gpus: 'x' is not a GPU count"),
        (["--gpus", "8,16,...,64"], "--gpus: '8,16,...,64' is ambiguous"),
        (["--gpus", "8,16,32,...,100"], "reach 100 exactly"),
        (["--gpus", "8", "--gpu", "h1000"], "--gpu: unknown GPU 'h1000'"),
        (
            ["--gpus", "8", "--tokens", "1X"],
            "--tokens: '1X' is not a token count; write a number with an optional",
        ),
        (["--gpus", "8", "--days", "30"], "--days: a deadline needs a token target; add --tokens"),
        (["--gpus", "8", "--tokens", "1T", "--days", "0"], "--days: 0 is not a number of days"),
        (["--gpus", "8", "--price", "h100:2.5"], "--price: 'h100:2.5' is not a price list"),
        (
            ["--gpus", "8", "--price", "b200=3"],
            "--price: a price for 'b200', which is not among the GPU types",
        ),
        (["--gpus", "8", "--plot", "/no/such/dir/x.png"], "--plot '/no/such/dir/x.png': the folder"),
        (["--gpus", "8", "--plot", "x.jpg"], "--plot: 'x.jpg': name a .png, .svg or .pdf file"),
    ],
)
def test_bad_input_is_one_error_naming_the_option(study, args, message):
    r = CliRunner().invoke(cli, ["capacity", str(study), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output and r.output.count("error:") == 1


def test_parsers():
    assert parse_tokens("1T") == 1e12 and parse_tokens("300b") == 3e11 and parse_tokens("1.5e12") == 1.5e12
    assert parse_tokens("2_000M") == 2e9
    assert parse_sizes("8,16,32,...,256") == [8, 16, 32, 64, 128, 256]
    assert parse_sizes("8,16,24,...,48") == [8, 16, 24, 32, 40, 48]
    assert parse_sizes("64, 8") == [64, 8]
    assert parse_prices("h100=2.5, mi355x=3.1", []) == {"h100": 2.5, "mi355x": 3.1}
    assert parse_prices("2", ["h100", "b200"]) == {"h100": 2.0, "b200": 2.0}
    for bad in ("0", "-1T", "T", "1e999"):
        with pytest.raises(SpecError, match="--tokens"):
            parse_tokens(bad)


def test_the_study_capacity_section_is_the_default_and_options_override_it(tmp_path):
    d = small_dense_study()
    d["capacity"] = {
        "gpus": [8, 16],
        "gpu": ["h100", "mi300x"],
        "tokens": "1T",
        "days": 40,
        "prices": {"mi300x": 2},
    }
    p = tmp_path / "cap.yaml"
    p.write_text(yaml.safe_dump(d))
    doc = json.loads(invoke("capacity", p, "--json").output)
    assert [(x["gpu"], x["gpus"]) for x in doc["rows"]] == [
        ("h100", 8),
        ("h100", 16),
        ("mi300x", 8),
        ("mi300x", 16),
    ]
    assert doc["tokens"] == 1e12 and doc["days"] == 40 and doc["prices_per_gpu_hour"] == {"mi300x": 2.0}
    # options win; the study's prices of types no longer planned are dropped
    doc = json.loads(
        invoke("capacity", p, "--json", "--gpu", "h100", "--gpus", "32", "--tokens", "2T").output
    )
    assert [(x["gpu"], x["gpus"]) for x in doc["rows"]] == [("h100", 32)]
    assert doc["tokens"] == 2e12 and doc["days"] == 40 and doc["prices_per_gpu_hour"] == {}
    study_without_capacity = tmp_path / "s.yaml"
    study_without_capacity.write_text(yaml.safe_dump(small_dense_study()))
    r = invoke("capacity", study_without_capacity)
    assert (
        r.exit_code == 2 and "--gpus: give the GPU counts" in r.output and "or a capacity section" in r.output
    )


def test_each_row_carries_the_error_band_of_its_cluster():
    """The band is the estimate's at that size (uncertainty.estimate_band of the cluster at that many nodes):
    wider on many nodes of an unmeasured network; ``band=None`` leaves the column out."""
    from primus_optuna.cli.capacity_cmd import render
    from primus_optuna.physics.capacity import capacity_table
    from primus_optuna.physics.uncertainty import estimate_band

    spec = StudySpec.from_dict(small_dense_study())
    table = capacity_table(spec, [8, 32])
    one, four = (r for r in table.all_rows if r.fits)
    assert one.band.text() == estimate_band(spec, nodes=1).text()
    assert four.band.low < one.band.low  # more nodes of an unmeasured network: more optimistic room
    text = render(table)
    assert "band" in text and one.band.text() in text
    assert "band" not in render(capacity_table(spec, [8], band=None))


def test_an_efficiency_above_100_percent_is_explained():
    """A larger cluster faster per GPU than the smallest that fits reads as a legend under the table, not as a
    figure without a reason; a table where no size beats the smallest has no legend."""
    from primus_optuna.cli.capacity_cmd import render
    from primus_optuna.physics.capacity import capacity_table

    spec = StudySpec.from_dict(small_dense_study())
    table = capacity_table(spec, [8, 32], band=None)
    first, second = (r for r in table.all_rows if r.fits)
    second.efficiency = 1.07
    assert "above 100%: a larger cluster fits layouts the smaller one cannot" in render(table)
    second.efficiency = 0.9
    assert "above 100%" not in render(table)
