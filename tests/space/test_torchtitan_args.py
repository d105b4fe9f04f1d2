"""TorchTitan 0.3 arguments of a configuration (space/torchtitan_args.py) and the rules of a TorchTitan study.
TorchTitan's own acceptance of the exports is tests/titan/test_exported_torchtitan.py."""

from __future__ import annotations

from typing import Any

import pytest

from primus_optuna.errors import SpecError
from primus_optuna.record.export import export_config, parse_export
from primus_optuna.space import RULES, Space
from primus_optuna.space.torchtitan_args import AC_MODES, SCHEDULES, parse_titan_args, titan_args
from primus_optuna.spec import StudySpec
from tests.conftest import STUDIES

TITAN_RULES = (
    "titan_seq",
    "titan_schedule",
    "titan_recompute",
    "titan_dispatcher",
    "titan_pipeline",
    "titan_ddp",
    "titan_ep",
)
"""The rule ids these tests cover (tests/space/test_rules.py checks every rule is covered somewhere)."""


def study(name: str, runner: dict[str, Any] | None = None, **sections: dict[str, Any]) -> StudySpec:
    data = StudySpec.from_yaml(STUDIES / f"{name}.yaml").to_dict()
    data["runner"] = runner if runner is not None else {"kind": "torchtitan"}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return StudySpec.from_dict(data)


LLAMA = "llama3.1-70b-h100-bf16"  # 80 layers, 64 H100, GBS 128
QWEN = "qwen3-30b-a3b-h200-bf16"  # MoE, 128 experts, 8 H200, GBS 256


def _value(argv: list[str], key: str) -> str:
    return argv[argv.index(f"--{key}") + 1]


def test_degrees_batch_and_pipeline_split() -> None:
    spec = study(LLAMA)
    space = Space(spec)
    c = space.make(tp=8, pp=2, vpp=4, mbs=2, pp_schedule="interleaved", dp_shard=2, recompute="full")
    argv = titan_args(spec, c)
    assert argv[:4] == ["--module", "llama3", "--config", "llama3_70b"]
    assert argv[-1] == "activation-checkpoint:full"  # the subcommand last: tyro reads no option after it
    p = "parallelism."
    assert (
        _value(argv, p + "tensor_parallel_degree") == "8"
        and _value(argv, p + "pipeline_parallel_degree") == "2"
    )
    # dp = 64 / 16 = 4: 2 shards × 2 replicas (HSDP)
    assert _value(argv, p + "data_parallel_shard_degree") == "2"
    assert _value(argv, p + "data_parallel_replicate_degree") == "2"
    # one flush per step: the DP rank's 128 / 4 = 32 sequences in micro-batches of 2; 80 / (2·4) layers per stage
    assert (
        _value(argv, "training.local_batch_size") == "32"
        and _value(argv, "training.global_batch_size") == "128"
    )
    assert _value(argv, p + "pipeline_parallel_microbatch_size") == "2"
    assert _value(argv, p + "pipeline_parallel_schedule") == "Interleaved1F1B"
    assert _value(argv, p + "pipeline_parallel_layers_per_stage") == "10"
    assert _value(argv, p + "pipeline_parallel_first_stage_less_layers") == "0"
    assert "--training.disable_cuda_graphs" in argv  # TorchTitan refuses CUDA graphs with pipelining
    flat = titan_args(
        spec, space.make(tp=8, pp=1, vpp=1, mbs=1, pp_schedule="1f1b", dp_shard=8, recompute="none")
    )
    # no pipeline: the micro-batch is the local batch and TorchTitan accumulates the rest
    assert _value(flat, "training.local_batch_size") == "1"
    assert not any("pipeline_parallel_schedule" in a or "cuda_graphs" in a for a in flat)
    assert flat[-1] == "activation-checkpoint:none"


def test_every_torchtitan_configuration_round_trips() -> None:
    for name in (LLAMA, QWEN):
        spec = study(name)
        configs = Space(spec).configs()
        for c in configs[:: max(1, len(configs) // 150)]:
            text = export_config(spec, c, "torchtitan", header="trial 3 of study x")
            assert text.startswith("# trial 3 of study x\n")
            back = parse_export(text, "torchtitan", spec)
            assert back == c and (back.dp, back.num_microbatches) == (c.dp, c.num_microbatches), text


def test_a_torchtitan_study_searches_what_torchtitan_runs() -> None:
    titan, plain = Space(study(QWEN)), Space(study(QWEN, runner={"kind": "analytical"}))
    assert titan.candidates["recompute"] == list(AC_MODES)
    assert titan.candidates["pp_schedule"] == list(SCHEDULES)
    assert titan.candidates["moe_dispatcher"] == ["alltoall"] and titan.candidates["ep_overlap"] == [False]
    assert titan.candidates["dp_shard"] == [1, 2, 4, 8]
    assert plain.candidates["dp_shard"] == [1] and "deepep" in plain.candidates["moe_dispatcher"]
    configs = titan.configs()
    assert configs and all(c.dp == 1 or c.dp_shard > 1 for c in configs)


def test_an_unwritten_dp_shard_is_torchtitans_default_the_ranks_left_over() -> None:
    """TorchTitan's data_parallel_shard_degree defaults to -1 (the ranks left over): a TorchTitan study's
    baseline and a configuration made without dp_shard shard over dp, so the default baseline is legal; a
    dp_shard given stays as given (1: DDP, refused)."""
    titan, plain = Space(study(QWEN)), Space(study(QWEN, runner={"kind": "analytical"}))
    assert titan.baseline.dp_shard == titan.baseline.dp == 8 and titan.check(titan.baseline) == []
    assert plain.baseline.dp_shard == 1
    c = titan.make(tp=2)
    assert (c.dp, c.dp_shard) == (4, 4)
    assert titan.make(tp=2, dp_shard=1).dp_shard == 1 and titan.check(titan.make(tp=2, dp_shard=1))


@pytest.mark.parametrize(
    ("rule_id", "good", "bad", "needle"),
    [
        ("titan_schedule", {"pp_schedule": "zbv", "vpp": 2}, {"pp_schedule": "zb1p"}, "zero-bubble"),
        ("titan_recompute", {"recompute": "full"}, {"recompute": "full:2"}, "every transformer block"),
        ("titan_recompute", {"recompute": "selective"}, {"recompute": "selective:moe_act"}, "module list"),
        ("titan_dispatcher", {}, {"moe_dispatcher": "deepep"}, "registry function"),
        ("titan_dispatcher", {}, {"ep_overlap": True}, "ep_overlap"),
        ("titan_ddp", {"dp_shard": 2}, {"dp_shard": 1}, "DDP"),
        ("titan_ep", {"ep": 4, "dp_shard": 4}, {"ep": 8, "dp_shard": 4, "tp": 1}, "expert mesh"),
    ],
)
def test_torchtitan_rules_apply_to_a_torchtitan_study_only(rule_id, good, bad, needle) -> None:
    """Qwen3-30B-A3B on 8 GPUs at tp=1, pp=2, cp=1: dp = 4."""
    base = {"tp": 1, "pp": 2, "vpp": 1, "cp": 1, "ep": 4, "mbs": 1, "pp_schedule": "1f1b", "dp_shard": 4}
    rule = next(r for r in RULES if r.id == rule_id)
    titan, plain = Space(study(QWEN)), Space(study(QWEN, runner={"kind": "analytical"}))
    assert rule.fn(titan.facts, titan.make(**{**base, **good})) is None
    reason = rule.fn(titan.facts, titan.make(**{**base, **bad}))
    assert reason and needle in reason
    assert rule.fn(plain.facts, plain.make(**{**base, **bad})) is None
    if rule_id in (
        "titan_ddp",
        "titan_ep",
    ):  # exported as they are (DDP; TorchTitan's mesh refuses titan_ep's)
        return
    with pytest.raises(SpecError, match="--format torchtitan"):  # the export refuses what the rule does
        titan_args(titan.spec, titan.make(**{**base, **bad}))


def test_sequence_length_divides_over_tp_and_context_parallelism() -> None:
    """TorchTitan's trainer: seq_len % (tp · 2·cp) (sequence parallel on); without sequence parallelism the export
    turns it off and tp no longer divides."""
    rule = next(r for r in RULES if r.id == "titan_seq")
    spec = study(LLAMA, workload={"seq_length": 8192 + 64})  # 8256 = 2^6 · 129
    space = Space(spec)
    assert "not divisible by 128" in rule.fn(space.facts, space.make(tp=8, cp=8))
    assert rule.fn(space.facts, space.make(tp=8, cp=4)) is None  # 64
    plain = Space(study(LLAMA, runner={"kind": "analytical"}, workload={"seq_length": 8256}))
    assert rule.fn(plain.facts, plain.make(tp=8, cp=8)) is None
    nosp = study(LLAMA, workload={"sequence_parallel": False})
    c = Space(nosp).make(tp=8, pp=1, vpp=1, mbs=1, pp_schedule="1f1b", dp_shard=8, recompute="full")
    assert "--parallelism.no-enable_sequence_parallel" in titan_args(nosp, c)
    assert parse_titan_args(titan_args(nosp, c), nosp) == c


def test_an_uneven_pipeline_split_is_refused() -> None:
    rule = next(r for r in RULES if r.id == "titan_pipeline")
    spec = study(
        LLAMA, pipeline={"decoder_first_pipeline_num_layers": 18, "decoder_last_pipeline_num_layers": 22}
    )
    space = Space(spec)
    c = space.make(tp=8, pp=4, vpp=1, mbs=1, pp_schedule="1f1b", dp_shard=2)
    assert "even split" in rule.fn(space.facts, c)
    assert rule.fn(space.facts, c.replace(pp=1)) is None
    with pytest.raises(SpecError, match="even split"):
        titan_args(spec, c)


@pytest.mark.parametrize(
    ("name", "workload", "needle"),
    [
        (LLAMA, {"precision": "fp16"}, "fp16 has no TorchTitan form"),
        ("mixtral-8x22b-mi355x-fp8", {}, "fp8_recipe: delayed"),
        ("mixtral-8x22b-mi355x-fp8", {"fp8_recipe": "mxfp8"}, "runner.options.module"),
        ("qwen3-235b-a22b-gb200-fp8", {}, "no registry function"),
    ],
)
def test_a_workload_without_a_torchtitan_form_is_refused(name: str, workload: dict, needle: str) -> None:
    spec = study(name, runner={"kind": "analytical"}, workload=workload)
    with pytest.raises(SpecError, match=needle):
        export_config(spec, Space(spec).baseline, "torchtitan")


def test_runner_options_name_the_registry_function_and_compile() -> None:
    opts = {"module": "my_pkg.registry", "config": "llama3_70b_fp8_rowwise", "compile": True}
    spec = study("mixtral-8x22b-mi355x-fp8", runner={"kind": "torchtitan", "options": opts})
    c = Space(spec).make(tp=1, pp=1, vpp=1, ep=8, mbs=1, recompute="full", pp_schedule="1f1b", dp_shard=64)
    argv = titan_args(spec, c)
    assert argv[:4] == ["--module", "my_pkg.registry", "--config", "llama3_70b_fp8_rowwise"]
    assert "--compile.enable" in argv
    spec = study(LLAMA, runner={"kind": "slurm", "options": {"preset": "torchtitan", "compile": False}})
    c = Space(spec).make(tp=8, pp=1, vpp=1, mbs=1, pp_schedule="1f1b", dp_shard=8, recompute="full")
    argv = titan_args(spec, c)
    assert "--compile.no-enable" in argv and argv[1] == "llama3"
    assert parse_titan_args(argv, spec) == c


def test_caveats_name_what_torchtitan_runs_differently() -> None:
    spec = study(LLAMA, runner={"kind": "analytical"})
    c = Space(spec).make(tp=8, pp=1, vpp=1, mbs=1, recompute="selective", pp_schedule="1f1b")
    text = export_config(spec, c, "torchtitan")
    assert "per-op selective AC" in text and "runs DDP over dp=8" in text
    assert "activation-checkpoint:selective" in text.splitlines()[-1]


def test_primus_torchtitan_experiment() -> None:
    """Primus's TorchTitan backend: its model YAML and the pinned JobConfig's sections as overrides (checked
    against job_config.py@73a0e697 by scripts/check_primus_torchtitan.py)."""
    import yaml

    spec = study(LLAMA, runner={"kind": "analytical"})
    c = Space(spec).make(
        tp=8, pp=2, vpp=2, mbs=1, pp_schedule="interleaved", recompute="selective", dp_shard=2
    )
    text = export_config(spec, c, "primus-torchtitan", header="trial 1")
    trainer = yaml.safe_load(text)["modules"]["pre_trainer"]
    assert (trainer["framework"], trainer["model"]) == ("torchtitan", "llama3.1_70B.yaml")
    o = trainer["overrides"]
    assert o["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert (
        o["parallelism"]["data_parallel_shard_degree"] == 2
        and o["parallelism"]["tensor_parallel_degree"] == 8
    )
    assert o["training"]["local_batch_size"] == 32 and "disable_cuda_graphs" not in o["training"]
    assert "per-op selective AC" in text and parse_export(text, "primus-torchtitan", spec) == c
    fp8 = study(
        LLAMA, runner={"kind": "analytical"}, workload={"precision": "fp8", "fp8_recipe": "tensorwise"}
    )
    doc = yaml.safe_load(export_config(fp8, c, "primus-torchtitan"))["modules"]["pre_trainer"]
    assert doc["model"] == "llama3.1_70B-fp8.yaml"
    assert doc["overrides"]["quantize"] == {"linear": {"float8": {"recipe_name": "tensorwise"}}}
    for name, match in (
        ("qwen3-30b-a3b-h200-bf16", "no Primus TorchTitan YAML"),
        ("deepseek-v3-mi355x-fp8", "mxfp8"),
    ):
        s = study(name, runner={"kind": "analytical"})
        with pytest.raises(SpecError, match=match):
            export_config(s, Space(s).baseline, "primus-torchtitan")
