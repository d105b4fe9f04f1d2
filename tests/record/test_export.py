"""Every export format round-trips to the same TrainingConfig."""

from __future__ import annotations

import json

import pytest
import yaml

from primus_optuna.record.export import (
    FORMATS,
    export_config,
    megatron_args,
    parse_export,
    parse_megatron_args,
)
from primus_optuna.space import Space, TrainingConfig
from primus_optuna.spec import StudySpec


@pytest.fixture(scope="module")
def flagship() -> StudySpec:
    return StudySpec.from_yaml("studies/mixtral-8x22b-mi355x-fp8.yaml")


def _sample(space: Space) -> list[TrainingConfig]:
    configs = space.configs()
    picked = {
        (c.pp_schedule, c.recompute, c.moe_dispatcher, c.ep_overlap): c for c in configs
    }  # every combination
    return list(picked.values()) + configs[:: max(1, len(configs) // 40)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_flagship(flagship: StudySpec, fmt: str) -> None:
    space = Space(flagship)
    configs = _sample(space)
    assert {c.pp_schedule for c in configs} == {"1f1b", "interleaved", "zb1p", "zbv"}
    assert {c.ep_overlap for c in configs} == {False, True}
    for c in configs:
        text = export_config(flagship, c, fmt, header="trial 3 of study x")
        back = parse_export(text, fmt, flagship)
        assert back == c, (fmt, text)
        assert (back.dp, back.num_microbatches) == (c.dp, c.num_microbatches)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_dense(fmt: str) -> None:
    spec = StudySpec.from_yaml("studies/llama3.1-70b-h100-bf16.yaml")
    for c in Space(spec).configs()[::97]:
        assert parse_export(export_config(spec, c, fmt), fmt, spec) == c


def test_primus_overlay_uses_megatron_names(flagship: StudySpec) -> None:
    c = Space(flagship).make(
        tp=2, pp=4, vpp=2, ep=8, mbs=1, recompute="full", moe_dispatcher="deepep", pp_schedule="zbv"
    )
    doc = yaml.safe_load(export_config(flagship, c, "primus"))
    o = doc["modules"]["pre_trainer"]["overrides"]
    assert o["tensor_model_parallel_size"] == 2
    assert o["pipeline_model_parallel_size"] == 4
    assert o["expert_model_parallel_size"] == 8
    assert o["context_parallel_size"] == 1
    assert o["num_virtual_stages_per_pipeline_rank"] == 2
    assert o["micro_batch_size"] == 1 and o["global_batch_size"] == 512
    assert (o["recompute_granularity"], o["recompute_method"], o["recompute_num_layers"]) == (
        "full",
        "uniform",
        1,
    )
    assert o["moe_token_dispatcher_type"] == "flex" and o["use_turbo_deepep"] is True
    assert o["patch_zero_bubble"] and o["zero_bubble_v_schedule"]
    assert o["fp8"] == "hybrid" and o["sequence_parallel"] is True


def test_megatron_args_are_flags(flagship: StudySpec) -> None:
    c = Space(flagship).baseline
    argv = megatron_args(flagship, c)
    assert argv[:2] == ["--tensor-model-parallel-size", "1"]
    assert "--num-virtual-stages-per-pipeline-rank" in argv
    # the baseline recomputes the first layer of every virtual chunk: full granularity, block method
    i = argv.index("--recompute-granularity")
    assert argv[i : i + 6] == [
        "--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1",
    ]  # fmt: skip
    assert argv[argv.index("--fp8-format") + 1] == "hybrid"
    assert parse_megatron_args(argv, flagship) == c
    assert "--recompute-granularity" not in megatron_args(flagship, c.replace(recompute="none"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_recompute_values_round_trip(fmt: str) -> None:
    """Every recompute spelling survives export and import (selective modules as Megatron's nargs list)."""
    data = StudySpec.from_yaml("studies/mixtral-8x22b-mi355x-fp8.yaml").to_dict()
    data["workload"]["fp8_recipe"] = "tensorwise"  # moe_act/layernorm are legal
    spec = StudySpec.from_dict(data)
    space = Space(spec)
    for r in ("none", "selective", "selective:moe_act", "selective:moe_act+layernorm", "selective:moe",
              "selective:core_attn+moe_act", "full:1", "full:6", "full"):  # fmt: skip
        c = space.make(tp=1, pp=4, vpp=2, ep=8, mbs=1, recompute=r, pp_schedule="interleaved")
        assert space.check(c) == [], (r, space.check(c))
        assert parse_export(export_config(spec, c, fmt), fmt, spec) == c, (fmt, r)
    c = space.make(recompute="selective:moe_act+layernorm")
    argv = megatron_args(spec, c)
    i = argv.index("--recompute-modules")
    assert argv[i : i + 3] == ["--recompute-modules", "moe_act", "layernorm"]
    o = yaml.safe_load(export_config(spec, c, "primus"))["modules"]["pre_trainer"]["overrides"]
    assert o["recompute_granularity"] == "selective" and o["recompute_modules"] == ["moe_act", "layernorm"]


def test_recompute_read_from_megatron_spellings(flagship: StudySpec) -> None:
    """Recipes write the recompute in several ways; each maps to one value (Mixtral: 7 layers per chunk at
    PP4 VPP2)."""
    from primus_optuna.space.megatron_args import config_from_megatron

    base = {"pipeline_model_parallel_size": 4, "num_virtual_stages_per_pipeline_rank": 2, "num_layers": 56}
    cases = [
        ({"recompute_granularity": "full", "recompute_num_layers": 0}, "none"),  # Primus "off"
        ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}, "full"),
        ({"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 2}, "full:2"),
        ({"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 7}, "full"),
        ({"recompute_granularity": "selective"}, "selective"),
        (
            {"recompute_granularity": "selective", "recompute_modules": ["layernorm", "moe_act"]},
            "selective:moe_act+layernorm",
        ),  # fmt: skip
        ({"recompute_granularity": "selective", "recompute_modules": "moe"}, "selective:moe"),
        ({"recompute_granularity": "selective", "recompute_modules": []}, "none"),  # Bridge "[] (none)"
        ({"recompute_layer_ids": [0, 7, 14, 21, 28, 35, 42, 49]}, "full:1"),  # Primus: first of each chunk
        ({"recompute_layer_ids": "0,1,7,8,14,15,21,22,28,29,35,36,42,43,49,50"}, "full:2"),
    ]
    for values, expect in cases:
        assert config_from_megatron({**base, **values}).recompute == expect, values
    with pytest.raises(ValueError, match="recompute_modules|recompute module"):
        config_from_megatron({**base, "recompute_granularity": "selective", "recompute_modules": ["attn"]})


def test_json_carries_derived_and_extra(flagship: StudySpec) -> None:
    c = Space(flagship).baseline
    doc = json.loads(export_config(flagship, c, "json", extra={"trial": 0}))
    assert doc["trial"] == 0
    assert doc["config"]["dp"] == c.dp == 16 and doc["config"]["num_microbatches"] == c.num_microbatches


def test_megatron_marks_primus_only_flags_or_leaves_them_out_with_upstream(flagship: StudySpec) -> None:
    from primus_optuna.errors import SpecError

    space = Space(flagship)
    c = space.make(moe_dispatcher="deepep")  # Primus-Turbo DeepEP: --use-turbo-deepep --enable-primus-turbo
    text = export_config(flagship, c, "megatron", header="best")
    note = next(line for line in text.splitlines() if line.startswith("# Primus-only flags"))
    assert "--use-turbo-deepep" in note and "--enable-primus-turbo" in note
    assert "--use-turbo-deepep" in text.split(note, 1)[1]  # still in the arguments, for Primus
    assert parse_export(text, "megatron", flagship) == c
    up = export_config(flagship, c, "megatron", upstream=True)
    assert "--use-turbo-deepep" not in up and "--enable-primus-turbo" not in up and "Primus-only" not in up
    # DeepEP as both Megatron-LM versions spell it (transformer_config.py@d98e8a64:898, @d3528a21:747; the
    # older --moe-enable-deepep is deprecated there, @d98e8a64:1743-1752): Primus's dispatcher still asserts it
    assert "--moe-token-dispatcher-type flex" in up and "--moe-flex-dispatcher-backend deepep" in up
    assert "--moe-enable-deepep" not in up and "--moe-enable-deepep" in text
    plain = export_config(
        flagship, space.make(moe_dispatcher="alltoall", pp_schedule="interleaved"), "megatron"
    )
    assert "Primus-only" not in plain
    zb = space.canonical(space.make(pp_schedule="zb1p", vpp=1, recompute="none"))
    assert not space.check(zb)
    assert "--enable-zero-bubble" in export_config(flagship, zb, "megatron").split("Primus-only flags", 1)[1]
    with pytest.raises(SpecError, match="--upstream: pp_schedule=zb1p"):
        export_config(flagship, zb, "megatron", upstream=True)
    with pytest.raises(SpecError, match="--format megatron only"):
        export_config(flagship, c, "primus", upstream=True)


def test_ep_overlap_maps_to_megatron_flags(flagship: StudySpec) -> None:
    c = Space(flagship).make(tp=1, pp=4, vpp=2, ep=8, mbs=1, pp_schedule="interleaved", ep_overlap=True)
    args = megatron_args(flagship, c)
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" in args
    assert parse_megatron_args(args, flagship).ep_overlap is True


def test_workload_overlap_options_reach_megatron(flagship: StudySpec) -> None:
    # Megatron's --overlap-grad-reduce/--overlap-param-gather default off: the export states the workload's
    # choice; zero-bubble forces them off (Primus's zero-bubble required args)
    c = Space(flagship).make(tp=1, pp=4, vpp=2, ep=8, mbs=1, pp_schedule="interleaved")
    args = megatron_args(flagship, c)
    assert "--overlap-grad-reduce" in args and "--overlap-param-gather" in args
    zb = Space(flagship).make(tp=1, pp=4, vpp=1, ep=8, mbs=1, pp_schedule="zb1p")
    assert "--overlap-grad-reduce" not in megatron_args(flagship, zb)
    off = StudySpec.from_dict(
        {**flagship.to_dict(), "workload": {**flagship.to_dict()["workload"], "overlap_grad_reduce": False}}
    )
    assert "--overlap-grad-reduce" not in megatron_args(off, c)


def test_env_format_prints_shell_booleans(flagship: StudySpec, tmp_path) -> None:
    """``export --format env`` is for shell scripts: ``if $PRIMUS_EP_OVERLAP; then`` needs true/false, not
    Python's True/False (issue 22 item 9)."""
    import subprocess

    space = Space(flagship)
    for overlap in (True, False):
        c = space.make(tp=1, pp=4, vpp=2, ep=8, mbs=1, pp_schedule="interleaved", ep_overlap=overlap)
        text = export_config(flagship, c, "env")
        assert f"export PRIMUS_EP_OVERLAP={'true' if overlap else 'false'}\n" in text
        assert "True" not in text and "False" not in text
        script = tmp_path / "use.sh"
        script.write_text(text + "if $PRIMUS_EP_OVERLAP; then echo on; else echo off; fi\n")
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout
        assert out.strip() == ("on" if overlap else "off")
        assert parse_export(text, "env", flagship) == c
