"""Presets: the Primus overlay round-trips through the importer, Megatron/Slurm argv, options, injection."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from primus_optuna.errors import SpecError
from primus_optuna.run.base import LaunchFailure, RunContext
from primus_optuna.run.factory import make_runner
from primus_optuna.run.presets import OVERLAY_NAME, build_command_runner, primus_overlay
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from primus_optuna.spec.primus_import import import_primus_yaml
from tests.helpers.runners import fake_argv, mixtral_spec

CONFIGS = [
    {"tp": 1, "pp": 4, "vpp": 2, "ep": 8, "mbs": 2, "pp_schedule": "interleaved"},
    {"tp": 2, "pp": 2, "ep": 4, "mbs": 1, "recompute": "full", "moe_dispatcher": "deepep"},
    {"tp": 1, "pp": 4, "vpp": 2, "ep": 8, "mbs": 1, "pp_schedule": "zbv"},
    {"tp": 1, "pp": 2, "vpp": 1, "ep": 8, "cp": 2, "mbs": 1, "pp_schedule": "zb1p"},
    {"tp": 1, "pp": 2, "vpp": 1, "ep": 8, "cp": 2, "mbs": 1, "recompute": "selective"},
    {"tp": 8, "pp": 1, "ep": 1, "mbs": 4},
    {"tp": 1, "pp": 4, "vpp": 2, "ep": 8, "mbs": 1, "pp_schedule": "interleaved", "recompute": "full:2"},
    {"tp": 1, "pp": 2, "ep": 8, "mbs": 1, "recompute": "selective:core_attn+moe"},
]


@pytest.fixture
def spec() -> StudySpec:
    return mixtral_spec()


def _ctx(spec: StudySpec, tmp_path: Path, n: int = 0) -> RunContext:
    return RunContext(spec=spec, workdir=tmp_path / f"trial-{n}", trial_number=n)


@pytest.mark.parametrize("axes", CONFIGS)
def test_primus_overlay_round_trips_through_the_importer(spec: StudySpec, axes: dict, tmp_path: Path) -> None:
    space = Space(spec)
    config = space.canonical(space.make(**axes))
    assert not space.check(config), space.check(config)
    (tmp_path / "mixtral.yaml").write_text("num_layers: 56\nhidden_size: 6144\n")
    experiment = {"modules": {"pre_trainer": {"model": "mixtral.yaml", "overrides": {"train_iters": 50}}}}
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(primus_overlay(spec, config, experiment=experiment)))
    info = import_primus_yaml(path)
    assert info.baseline == config.to_params()
    assert info.overrides["train_iters"] == 50 and info.model["num_layers"] == 56
    assert info.workload["global_batch_size"] == 128 and info.workload["precision"] == "fp8"
    # and as a study: the overlay's baseline is the configuration
    data = spec.to_dict() | {"model": {"primus_yaml": str(path), **spec.model.model_dump()}}
    data["search"] = {k: v for k, v in data["search"].items() if k != "baseline"}
    assert Space(StudySpec.from_dict(data)).canonical(Space(StudySpec.from_dict(data)).baseline) == config


def test_primus_runner_writes_overlay_and_passes_it(spec: StudySpec, tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "modules:\n  pre_trainer:\n    model: mixtral_8x22B_v0.1.yaml\n    overrides: {lr: 1.0e-5}\n"
    )
    runner = make_runner(
        spec.model_copy(
            update={
                "runner": spec.runner.model_copy(
                    update={
                        "kind": "primus",
                        "options": {"launch": fake_argv("echo", "{overlay}"), "experiment": str(exp)},
                    }
                )
            }
        )
    )
    config = Space(spec).make(**CONFIGS[1])
    launch, _ = runner.build(config, _ctx(spec, tmp_path))
    overlay = tmp_path / "trial-0" / OVERLAY_NAME
    assert launch.argv[-1] == str(overlay.resolve()) and launch.env["EXP"] == str(overlay.resolve())
    o = yaml.safe_load(overlay.read_text())["modules"]["pre_trainer"]["overrides"]
    assert o["lr"] == 1.0e-5 and o["train_iters"] == 10 and o["log_interval"] == 1
    assert (o["tensor_model_parallel_size"], o["moe_token_dispatcher_type"], o["recompute_granularity"]) == (
        2,
        "flex",
        "full",
    )
    # end to end: the launch command runs with the overlay and its Primus log is parsed
    runner.argv = fake_argv("replay", "primus.log")
    m = runner.run(config, _ctx(spec, tmp_path, 1))
    assert m.tokens_per_s_per_gpu == pytest.approx(3620.8) and (tmp_path / "trial-1" / OVERLAY_NAME).is_file()


def test_megatron_argv(spec: StudySpec, tmp_path: Path) -> None:
    runner = build_command_runner(
        spec, "megatron", {"megatron_path": "/opt/Megatron-LM", "rdzv_endpoint": "n0:29500"}
    )
    config = Space(spec).make(**CONFIGS[0])
    argv, _ = runner.build(config, _ctx(spec, tmp_path))
    a = argv.argv
    assert a[:5] == ["torchrun", "--nnodes", "8", "--nproc-per-node", "8"]
    assert "/opt/Megatron-LM/pretrain_gpt.py" in a
    pairs = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}
    assert pairs["--rdzv-endpoint"] == "n0:29500"
    assert (
        pairs["--pipeline-model-parallel-size"] == "4"
        and pairs["--num-virtual-stages-per-pipeline-rank"] == "2"
    )
    assert pairs["--expert-model-parallel-size"] == "8" and pairs["--micro-batch-size"] == "2"
    assert pairs["--fp8-format"] == "hybrid" and pairs["--num-experts"] == "8"
    assert not any("zero-bubble" in x or "turbo" in x for x in a)
    sel = runner.build(Space(spec).make(**CONFIGS[-1]), _ctx(spec, tmp_path, 2))[0].argv
    i = sel.index("--recompute-granularity")
    assert sel[i + 1] == "selective" and sel[sel.index("--recompute-modules") + 1 :][:2] == [
        "core_attn",
        "moe",
    ]
    blk = runner.build(Space(spec).make(**CONFIGS[-2]), _ctx(spec, tmp_path, 3))[0].argv
    blk_pairs = {blk[i]: blk[i + 1] for i in range(len(blk) - 1) if blk[i].startswith("--")}
    assert (blk_pairs["--recompute-method"], blk_pairs["--recompute-num-layers"]) == ("block", "2")
    with pytest.raises(LaunchFailure, match="zero bubble"):
        runner.build(Space(spec).make(**CONFIGS[2]), _ctx(spec, tmp_path, 1))


@pytest.mark.parametrize("mode", ["srun", "sbatch"])
def test_slurm_wraps_a_preset(spec: StudySpec, tmp_path: Path, mode: str) -> None:
    opts = {"preset": "megatron", "mode": mode, "slurm_args": ["--partition=gpu"], "megatron_path": "/m"}
    runner = build_command_runner(spec, "slurm", opts)
    launch, _ = runner.build(Space(spec).make(**CONFIGS[0]), _ctx(spec, tmp_path))
    node = (tmp_path / "trial-0" / "node.sh").read_text()
    assert '--rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}"' in node and "scontrol show hostnames" in node
    assert "exec torchrun --nnodes 8" in node
    assert launch.argv[0] == mode and "--partition=gpu" in launch.argv and "--nodes=8" in launch.argv
    if mode == "sbatch":
        assert "--wait" in launch.argv and launch.extra_logs == [tmp_path / "trial-0" / "slurm.out"]


def test_options_are_validated(spec: StudySpec) -> None:
    with pytest.raises(SpecError, match="runner.options.argv: required"):
        build_command_runner(spec, "command", {})
    with pytest.raises(SpecError, match="unknown option"):
        build_command_runner(spec, "local", {"iters": 3})
    with pytest.raises(SpecError, match="timeout_s"):
        build_command_runner(spec, "command", {"argv": ["x"], "timeout_s": -1})
    with pytest.raises(SpecError, match="rdzv_endpoint"):
        build_command_runner(spec, "megatron", {"megatron_path": "/m", "rdzv_endpoint": "a b;c"})
    with pytest.raises(SpecError, match="preset"):
        build_command_runner(spec, "slurm", {"preset": "slurm"})
    with pytest.raises(SpecError, match=r"unknown field \{cmd\}"):
        build_command_runner(spec, "command", {"argv": ["bash", "-c", "{cmd}"]})
    with pytest.raises(SpecError, match="unknown field"):
        build_command_runner(spec, "primus", {"launch": ["x", "{overlay}", "{HOME}"]})


def test_injection_cannot_reach_any_preset(spec: StudySpec, tmp_path: Path) -> None:
    good = Space(spec).make(**CONFIGS[0])
    bad = [
        ("recompute", "full\n--load /etc"),
        ("pp_schedule", "1f1b'; touch /tmp/pwn; '"),
        ("mbs", "2 --save /x"),
    ]
    evil = []
    for axis, value in bad:
        if axis != "mbs":  # categorical values are refused when the config is built...
            with pytest.raises(ValueError, match=axis):
                dataclasses.replace(good, **{axis: value})
        c = dataclasses.replace(good)
        object.__setattr__(c, axis, value)  # ...and by every runner when one is forced in
        evil.append(c)
    runners = [
        build_command_runner(spec, "megatron", {"megatron_path": "/m"}),
        build_command_runner(spec, "primus", {"launch": fake_argv("echo", "{overlay}")}),
        build_command_runner(spec, "slurm", {"preset": "command", "argv": ["train", "{pp_schedule}"]}),
    ]
    for r in runners:
        for i, config in enumerate(evil):
            with pytest.raises(LaunchFailure, match="refused"):
                r.build(config, _ctx(spec, tmp_path, i))
    assert not list(tmp_path.rglob("*.yaml")) and not list(tmp_path.rglob("*.sh"))


def test_factory_builds_every_kind(spec: StudySpec) -> None:
    options = {
        "command": {"argv": ["train"]},
        "local": {},
        "primus": {},
        "megatron": {"megatron_path": "/m"},
        "slurm": {"preset": "primus", "mode": "sbatch"},
        "profile": {"scale": 0.1, "device": "cpu"},
    }
    for kind, opts in options.items():
        s = spec.model_copy(update={"runner": spec.runner.model_copy(update={"kind": kind, "options": opts})})
        assert make_runner(s).kind == kind
    assert make_runner(spec, "analytical").kind == "analytical"
    # --runner with another kind than the study's: the study's options are not passed to it
    s = spec.model_copy(update={"runner": spec.runner.model_copy(update={"kind": "megatron", "options": {}})})
    with pytest.raises(SpecError, match="megatron_path: required"):
        make_runner(s)
    assert make_runner(s, "local").kind == "local"
    with pytest.raises(SpecError, match="unknown runner kind"):
        make_runner(spec, "ssh")


def test_megatron_argv_carries_mla_moe_fields_and_the_layout(tmp_path: Path) -> None:
    """DeepSeek-V3 launches with its MLA, shared-expert, dense-first, MTP flags and the study's layout;
    GPT-OSS with its window, sinks and biases."""
    from tests.conftest import STUDIES

    v3 = StudySpec.from_yaml(STUDIES / "deepseek-v3-mi355x-fp8.yaml")
    runner = build_command_runner(v3, "megatron", {"megatron_path": "/opt/Megatron-LM"})
    argv, _ = runner.build(Space(v3).baseline, _ctx(v3, tmp_path))
    a = argv.argv
    pairs = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}
    assert "--multi-latent-attention" in a and pairs["--q-lora-rank"] == "1536"
    assert pairs["--kv-lora-rank"] == "512" and pairs["--qk-pos-emb-head-dim"] == "64"
    assert pairs["--moe-shared-expert-intermediate-size"] == "2048"
    assert pairs["--moe-layer-freq"] == "([0]*3+[1]*58)" and pairs["--mtp-num-layers"] == "1"
    assert pairs["--pipeline-model-parallel-layout"] == "Et*4|(t*4|)*14tmL"
    assert "--disable-bias-linear" in a
    # the recipe's precision-aware optimizer (Megatron-Core argument names)
    assert "--use-precision-aware-optimizer" in a and "--grad-reduce-in-bf16" in a
    assert pairs["--main-params-dtype"] == "fp32" and pairs["--main-grads-dtype"] == "bf16"
    assert pairs["--exp-avg-dtype"] == "bf16" and pairs["--exp-avg-sq-dtype"] == "bf16"
    oss = StudySpec.from_yaml(STUDIES / "gpt-oss-120b-h100-bf16.yaml")
    runner = build_command_runner(oss, "megatron", {"megatron_path": "/opt/Megatron-LM"})
    argv, _ = runner.build(Space(oss).baseline, _ctx(oss, tmp_path, 1))
    a = argv.argv
    pairs = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}
    assert pairs["--window-size"] == "128,0" and pairs["--window-attn-skip-freq"] == "2"
    assert pairs["--softmax-type"] == "learnable" and "--disable-bias-linear" not in a


PAO_WORKLOADS = [
    {},
    {"grad_reduce_in_fp32": False, "fp8_param_gather": True},
    {
        "grad_reduce_in_fp32": False,
        "precision_aware_optimizer": True,
        "main_grads_dtype": "bf16",
        "exp_avg_dtype": "bf16",
        "exp_avg_sq_dtype": "bf16",
    },
    {
        "precision_aware_optimizer": True,
        "main_params_dtype": "fp16",
        "exp_avg_dtype": "fp8",
        "exp_avg_sq_dtype": "fp16",
    },
]


@pytest.mark.parametrize("over", PAO_WORKLOADS)
def test_optimizer_and_gradient_dtypes_round_trip_through_the_importer(
    spec: StudySpec, over: dict, tmp_path: Path
) -> None:
    """The workload's memory levers (2-byte gradients, FP8 parameters, the precision-aware optimizer's dtypes)
    written into a Primus overlay read back as the same workload; Megatron argv carries them too."""
    data = spec.to_dict()
    data["workload"] = {**data["workload"], **over}
    lever_spec = StudySpec.from_dict(data)
    config = Space(lever_spec).baseline
    (tmp_path / "mixtral.yaml").write_text("num_layers: 56\nhidden_size: 6144\n")
    experiment = {"modules": {"pre_trainer": {"model": "mixtral.yaml", "overrides": {}}}}
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(primus_overlay(lever_spec, config, experiment=experiment)))
    imported = import_primus_yaml(path).workload
    w = lever_spec.workload.model_dump()
    keys = ("grad_reduce_in_fp32", "fp8_param_gather", "precision_aware_optimizer", "main_params_dtype")
    keys += ("main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
    defaults = type(lever_spec.workload)(seq_length=1, global_batch_size=1).model_dump()
    assert {k: imported.get(k, defaults[k]) for k in keys} == {k: w[k] for k in keys}
    # and as a study whose workload comes from the overlay
    study = {**data, "model": {"primus_yaml": str(path), **lever_spec.model.model_dump()}}
    study["workload"] = {"seq_length": 8192, "global_batch_size": 128}
    assert StudySpec.from_dict(study).workload == lever_spec.workload
    argv = (
        build_command_runner(lever_spec, "megatron", {"megatron_path": "/m"})
        .build(config, _ctx(lever_spec, tmp_path))[0]
        .argv
    )
    assert ("--use-precision-aware-optimizer" in argv) == bool(over.get("precision_aware_optimizer"))
    if over.get("precision_aware_optimizer"):
        assert argv[argv.index("--exp-avg-dtype") + 1] == over["exp_avg_dtype"]
